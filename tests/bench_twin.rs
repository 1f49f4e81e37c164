//! scripts/bench_torch_ddp.py's FSDP2 runs (`--fsdp full|grad-op`), which
//! examples/bench_sizes.rs sets against the training run's `--shard full`
//! and `--shard grad-op`: they must train what its DDP run trains (the same
//! loss after the same steps: FSDP2 computes on the gathered, whole
//! parameters), and count on the wire what the arithmetic of FSDP2's
//! schedule says. Runs the script on 2 gloo ranks on the CPU, a few steps.

use std::process::Command;

use ddp_workbook::models::{GptConfig, GptSize};

/// The script's printed `name value` lines of a run with `flags`.
fn twin(flags: &[&str]) -> Vec<(String, f64)> {
    let python = concat!(env!("CARGO_MANIFEST_DIR"), "/.venv/bin/python");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/bench_torch_ddp.py");
    let output = Command::new(python)
        .arg(script)
        .args(["--steps", "2", "--warmup-steps", "1", "--train-sequences", "256"])
        .args(flags)
        .output()
        .expect("no .venv/bin/python: run scripts/setup.sh, which installs PyTorch there");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{flags:?} failed:\n{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
        .lines()
        .filter_map(|line| line.split_once(' '))
        .filter_map(|(name, value)| Some((name.to_string(), value.parse().ok()?)))
        .collect()
}

fn value(lines: &[(String, f64)], name: &str) -> f64 {
    lines.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no `{name}` line in {lines:?}")).1
}

/// FULL_SHARD gathers every unit before its forward and again before its
/// backward, per micro-batch, and reduce-scatters the gradients once per
/// step (the first micro-batch under set_requires_gradient_sync(false));
/// SHARD_GRAD_OP keeps the gathered parameters from forward to backward.
/// Each collective moves (N-1)/N of the whole float32 parameters per rank
/// (the tiny GPT's rows all split evenly in 2: no padding). Its loss is
/// DDP's, as a ring's average of 2 is the same sum halved.
#[test]
fn pytorch_fsdp_rows_train_as_its_ddp_and_count_fsdp2s_collectives() {
    let ddp = twin(&["--setting", "defaults"]);
    let half_of_parameters = GptConfig::of_size(GptSize::Tiny).parameter_count() as f64 * 4.0 / 2.0;
    let micro_batches = 2.0; // the script's default --accum-steps
    for (strategy, collectives) in [("full", 2.0 * micro_batches + 1.0), ("grad-op", micro_batches + 1.0)] {
        let fsdp = twin(&["--fsdp", strategy, "--count-bytes"]);
        let (ours, theirs) = (value(&fsdp, "loss"), value(&ddp, "loss"));
        assert!((ours - theirs).abs() <= 1e-5, "--fsdp {strategy}: loss {ours}, DDP's {theirs}");
        let wire = value(&fsdp, "wire_bytes_per_step");
        let expected = collectives * half_of_parameters;
        assert_eq!(
            wire, expected,
            "--fsdp {strategy}: {wire} bytes per step, {collectives} collectives expected"
        );
    }
}
