//! Runs PyTorch's side once per world
//! size for every stage (one torchrun launch: starting Python and importing
//! torch costs seconds, the stages themselves little), and reads back what
//! it wrote. The tests of one binary share the run; the first test that
//! needs a world size starts it.
//! Compiled into `cargo test --features solutions,mpi,nccl --test torch_oracle`.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ddp_workbook::tch::Tensor;

use super::inputs::write_inputs;

/// A torchrun job that runs longer than this has hung.
const LIMIT: Duration = Duration::from_secs(300);

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The folder of this test process's runs, under cargo's scratch folder for
/// integration tests; earlier processes' folders are removed first.
fn scratch() -> PathBuf {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("torch_oracle");
    if let Ok(entries) = std::fs::read_dir(&root) {
        for entry in entries.flatten() {
            let alive = entry.file_name().to_str().is_some_and(|pid| Path::new("/proc").join(pid).exists());
            if !alive {
                _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    root.join(std::process::id().to_string())
}

/// The folder of the oracle's run on `world_size` ranks (2 or 3), after
/// that run: its inputs and everything it wrote. Panics, with torchrun's
/// output, if it failed.
pub fn oracle(world_size: usize) -> &'static Path {
    static RUNS: [OnceLock<Result<PathBuf, String>>; 2] = [OnceLock::new(), OnceLock::new()];
    assert!((2..=3).contains(&world_size), "the oracle runs on 2 or 3 ranks, not {world_size}");
    let run = RUNS[world_size - 2].get_or_init(|| run_oracle(world_size));
    match run {
        Ok(dir) => dir,
        Err(message) => panic!("{message}"),
    }
}

fn run_oracle(world_size: usize) -> Result<PathBuf, String> {
    let torchrun = repo().join(".venv/bin/torchrun");
    if !torchrun.is_file() {
        return Err(format!(
            "{} does not exist: the PyTorch oracle needs the project's .venv with torch. \
             Run scripts/setup.sh, which installs it.",
            torchrun.display()
        ));
    }
    let dir = scratch().join(format!("world{world_size}"));
    write_inputs(&dir, world_size)
        .map_err(|e| format!("writing the oracle's inputs to {}: {e}", dir.display()))?;
    let log = dir.join("torchrun.log");
    let log_file = std::fs::File::create(&log).map_err(|e| format!("creating {}: {e}", log.display()))?;
    let started = Instant::now();
    let mut child = Command::new(&torchrun)
        .args(["--standalone", "--nproc-per-node", &world_size.to_string()])
        // No folder of per-rank logs: torchrun makes a /tmp/torchelastic_*
        // one per run and never removes it; the oracle's output goes to the log.
        .args(["--log-dir", "/dev/null"])
        .arg(repo().join("scripts/torch/oracle.py"))
        .arg(&dir)
        // Loopback only; one thread per process, as the workbook's ranks.
        .env("GLOO_SOCKET_IFNAME", "lo")
        .env("OMP_NUM_THREADS", "1")
        .env("PYTHONWARNINGS", "ignore")
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().map_err(|e| e.to_string())?)
        .stderr(log_file)
        .spawn()
        .map_err(|e| format!("starting {}: {e}", torchrun.display()))?;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if started.elapsed() > LIMIT {
            // torchrun and its workers are one process group: end them all,
            // politely first (torchrun passes SIGTERM on), then for sure.
            let group = format!("-{}", child.id());
            _ = Command::new("kill").args(["-TERM", "--", &group]).status();
            std::thread::sleep(Duration::from_secs(5));
            _ = Command::new("kill").args(["-KILL", "--", &group]).status();
            _ = child.wait();
            return Err(format!("torchrun ran past {LIMIT:?} (a hang); its output:\n{}", read_log(&log)));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if !status.success() {
        return Err(format!(
            "torchrun on {world_size} ranks failed ({status}); its output:\n{}",
            read_log(&log)
        ));
    }
    println!("the PyTorch oracle on {world_size} ranks ran in {:.1} s", started.elapsed().as_secs_f64());
    Ok(dir)
}

fn read_log(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| format!("(cannot read {}: {e})", path.display()))
}

/// What PyTorch's rank `rank` wrote for `stage`, by name.
pub fn torch_tensors(world_size: usize, stage: &str, rank: usize) -> Vec<(String, Tensor)> {
    let path = oracle(world_size).join(stage).join(format!("torch_rank{rank}.safetensors"));
    let mut tensors =
        Tensor::read_safetensors(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    tensors
}

/// PyTorch's buckets, in all-reduce order, as its rank 0 reported them.
pub struct TorchLayouts {
    /// The parameters in the order DDP walks them (registration order).
    pub parameters: Vec<String>,
    /// `_get_ddp_logging_data()["bucket_sizes"]`, read at construction.
    pub logged_at_construction: Vec<usize>,
    /// The reducer's buckets at construction and after training: each
    /// bucket's bytes and its members' names.
    pub at_construction: Vec<(usize, Vec<String>)>,
    pub after_training: Vec<(usize, Vec<String>)>,
}

pub fn torch_layouts(world_size: usize, stage: &str) -> TorchLayouts {
    let path = oracle(world_size).join(stage).join("torch_layout_rank0.txt");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let mut layouts = TorchLayouts {
        parameters: vec![],
        logged_at_construction: vec![],
        at_construction: vec![],
        after_training: vec![],
    };
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let bucket = || (fields[1].parse().unwrap(), fields[2].split(',').map(String::from).collect());
        match fields[0] {
            "parameters" => layouts.parameters = fields[1].split(',').map(String::from).collect(),
            "logged_at_construction" => {
                layouts.logged_at_construction = fields[1].split(',').map(|s| s.parse().unwrap()).collect()
            }
            "at_construction" => layouts.at_construction.push(bucket()),
            "after_training" => layouts.after_training.push(bucket()),
            other => panic!("{}: unexpected line kind `{other}`", path.display()),
        }
    }
    layouts
}
