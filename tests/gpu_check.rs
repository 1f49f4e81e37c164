//! Scripts/gpu_check.sh where there is no GPU (as in
//! CI): its refusals and argument errors, each one line and exit 2; and its
//! carried mode end to end: `--build-only DIR` builds every binary (release,
//! `--features nccl`) and lists them, and `--prebuilt DIR` runs them all and
//! writes the report, here under a stand-in `nvidia-smi` that shows one GPU
//! CUDA cannot find, so every GPU step fails and the report must say so.
//! Run: cargo test --test gpu_check   (the build takes minutes the first time)

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/gpu_check.sh");
const BINARIES: [&str; 4] = ["nccl_tests", "gpu_threads", "bench_nccl", "train"];

/// Runs the script with `args` and `env`; (exit status, stdout, stderr).
fn gpu_check(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut command = Command::new("bash");
    command.arg(SCRIPT).args(args).envs(env.iter().copied());
    // The suite's runner sets it for test binaries only; cargo would rebuild every crate with it.
    command.env_remove("RUSTC_BOOTSTRAP");
    let Output { status, stdout, stderr } = command.output().expect("bash runs the script");
    (
        status.code(),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// Asserts a refusal: exit 2, nothing on stdout, one line on stderr that
/// starts with `gpu_check:` and contains `says`.
fn assert_refused(args: &[&str], env: &[(&str, &str)], says: &str) {
    let (status, stdout, stderr) = gpu_check(args, env);
    assert_eq!(status, Some(2), "{args:?}: exit {status:?}, stderr:\n{stderr}");
    assert!(stdout.is_empty(), "{args:?} printed on stdout:\n{stdout}");
    assert_eq!(stderr.lines().count(), 1, "{args:?}: not one line:\n{stderr}");
    assert!(stderr.starts_with("gpu_check: ") && stderr.contains(says), "{args:?}: {stderr}");
}

/// No GPU: with `CUDA_VISIBLE_DEVICES` empty the script sees none even on a
/// GPU machine, so this checks the refusal everywhere.
const NO_GPU: [(&str, &str); 1] = [("CUDA_VISIBLE_DEVICES", "")];

#[test]
fn without_a_gpu_it_refuses_in_one_line_and_writes_no_report() {
    let report = Path::new(env!("CARGO_TARGET_TMPDIR")).join("gpu-check-refused.md");
    _ = std::fs::remove_file(&report);
    let out = report.to_str().unwrap();
    assert_refused(&["--out", out], &NO_GPU, "needs an NVIDIA GPU");
    assert_refused(&["--out", out], &NO_GPU, "--build-only DIR"); // and says what to do instead
    assert!(!report.exists(), "a refused run wrote {out}");
}

#[test]
fn bad_arguments_are_refused_in_one_line_naming_the_problem() {
    let cases: [(&[&str], &str); 8] = [
        (&["--bogus"], "unknown argument '--bogus'"),
        (&["--prebuilt"], "--prebuilt needs a folder"),
        (&["--build-only", "--steps"], "--build-only needs a folder"),
        (&["--build-only", "a", "--prebuilt", "b"], "exclude each other"),
        (&["--steps", "0"], "--steps must be a positive whole number, not '0'"),
        (&["--timeout", "soon"], "--timeout must be a positive number of seconds"),
        (&["--out"], "--out needs a value"),
        (&["--prebuilt", "/nonexistent/gpu-check"], "no such folder"),
    ];
    for (args, says) in cases {
        assert_refused(args, &NO_GPU, says);
    }
    // The help is no refusal: it prints the usage and exits 0.
    let (status, stdout, _) = gpu_check(&["--help"], &[]);
    assert_eq!(status, Some(0));
    assert!(stdout.contains("--prebuilt DIR") && stdout.contains("--build-only DIR"), "{stdout}");
}

/// A folder of stand-ins for the driver's `nvidia-smi`: one GPU, "Fake GPU".
fn fake_nvidia_smi(folder: &Path) -> String {
    std::fs::create_dir_all(folder).unwrap();
    let script = r#"#!/bin/sh
case "$*" in
  -L) echo "GPU 0: Fake GPU (UUID: GPU-0)" ;;
  *index,name,memory.total*) echo "0, Fake GPU, 1 MiB" ;;
  *--query-gpu=name*) echo "Fake GPU" ;;
  *driver_version*) echo "0.0" ;;
  *) echo "| NVIDIA-SMI 0.0    Driver Version: 0.0    CUDA Version: 0.0 |" ;;
esac
"#;
    let path = folder.join("nvidia-smi");
    std::fs::write(&path, script).unwrap();
    Command::new("chmod").arg("+x").arg(&path).status().unwrap();
    format!("{}:{}", folder.display(), std::env::var("PATH").unwrap_or_default())
}

#[test]
fn build_only_makes_every_binary_and_prebuilt_runs_them_all_into_one_report() {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gpu-check");
    let dir = tmp.join("carry");
    let (status, stdout, stderr) = gpu_check(&["--build-only", dir.to_str().unwrap()], &[]);
    assert_eq!(status, Some(0), "--build-only failed:\n{stdout}\n{stderr}");
    for name in BINARIES.iter().chain(&["MANIFEST"]) {
        let path = dir.join(name);
        assert!(stdout.lines().any(|line| Path::new(line) == path), "{name} not listed to carry:\n{stdout}");
        assert!(path.is_file(), "{} is missing", path.display());
    }
    let manifest = std::fs::read_to_string(dir.join("MANIFEST")).unwrap();
    assert!(manifest.contains("libtorch 2.11.0") && manifest.starts_with("commit "), "{manifest}");

    // Without a GPU, the prebuilt folder passes its own check and the GPU's refuses.
    assert_refused(&["--prebuilt", dir.to_str().unwrap()], &NO_GPU, "needs an NVIDIA GPU");
    // A folder that lacks one binary is named as such.
    let partial = tmp.join("partial");
    std::fs::create_dir_all(&partial).unwrap();
    std::fs::copy(dir.join("MANIFEST"), partial.join("MANIFEST")).unwrap();
    assert_refused(&["--prebuilt", partial.to_str().unwrap()], &[], "has no nccl_tests");

    // Every step runs under a GPU that CUDA cannot find; the report says what failed.
    let path = fake_nvidia_smi(&tmp.join("fake-driver"));
    let report = tmp.join("report.md");
    let args = ["--prebuilt", dir.to_str().unwrap(), "--steps", "1", "--out", report.to_str().unwrap()];
    let (status, stdout, stderr) = gpu_check(&args, &[("PATH", &path)]);
    assert_eq!(status, Some(1), "a run whose GPU steps failed must exit 1:\n{stdout}\n{stderr}");
    let text = std::fs::read_to_string(&report).expect("the report is written even when steps fail");
    for says in [
        "# GPU check: 1 x Fake GPU",
        "| driver | 0.0, CUDA 0.0 |",
        "| GPU tests: the NCCL backend | **FAILED** (exit 101)",
        // The ignored GPU tests really ran, and failed saying why.
        "test training::ddp_on_cuda_matches_one_process_on_the_global_batch ... FAILED",
        "test ddp_on_two_rank_threads_sharing_one_gpu_matches_one_process ... FAILED",
        "this test needs a GPU",
        "| NCCL all_reduce, every GPU | **FAILED** (exit 2)",
        "| training run, NCCL, 1 GPU | **FAILED** (exit 2)",
        "With one GPU the run on every GPU is the 1-GPU run",
        "| training run, ZeRO-1, 2 rank threads sharing cuda:0 | **FAILED**",
        // Runs that never finished have no state to compare: failures too.
        "| ZeRO-1 (AdamW sharded) and plain DDP | none | none | **DIFFER** |",
        "| stopped and resumed, and run through | none | none | **DIFFER** |",
    ] {
        assert!(text.contains(says), "the report lacks {says:?}:\n{text}");
    }
    let torch_rows =
        text.lines().filter(|l| l.starts_with("| PyTorch DDP") && l.contains("NCCL, 1 GPU | **FAILED**"));
    assert!(torch_rows.count() >= 1, "no failed PyTorch step on the fake GPU:\n{text}");
    // The CPU run worked: one step, its rate, its replicas compared.
    // Its row in the last table (the steps table, above it, has one too).
    let cpu_row = text.lines().rfind(|l| l.starts_with("| training run, CPU")).expect("the CPU run's row");
    let cells: Vec<&str> = cpu_row.split('|').map(str::trim).collect();
    assert_eq!(cells[2], "1", "{cpu_row}");
    assert!(cells[3].parse::<f64>().is_ok_and(|rate| rate > 0.0), "no tokens/s: {cpu_row}");
    assert!(cells[5].starts_with("bitwise equal, fingerprint 0x"), "{cpu_row}");
}

/// The report reads PyTorch's side from what scripts/bench_torch_ddp.py
/// prints: it must take the flags the check passes, and print its rate in
/// the line the report reads. Run here on the CPU, on one rank, two steps.
#[test]
fn the_pytorch_twin_takes_the_checks_flags_and_prints_the_rate_it_reads() {
    let python = concat!(env!("CARGO_MANIFEST_DIR"), "/.venv/bin/python");
    let twin = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/bench_torch_ddp.py");
    let output = Command::new(python)
        .args([twin, "--device", "cpu", "--world-size", "1", "--steps", "2"])
        .output()
        .expect("scripts/setup.sh makes .venv/bin/python");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    let rate = stdout.lines().find_map(|l| l.strip_prefix("tokens_per_second ")).expect("its rate line");
    assert!(rate.parse::<f64>().is_ok_and(|r| r > 0.0), "not a rate: {rate}");
}
