//! Each chapter's PyTorch twin runs and passes its own checks: the scripts
//! of scripts/torch/twins/ (chapters 3 to 8: averaging by hand, no_sync
//! accumulation, bucket caps, overlap through a comm hook, the
//! DistributedSampler, the training loop with rank-0 checkpoints), each
//! under `torchrun --standalone --nproc-per-node 2` with gloo on CPU. A twin
//! checks PyTorch's DDP against one process on the global batch and prints
//! PASS, or raises; the chapters include their lines. Chapters 11 and 12
//! have no twin here: ZeRO-1's ShardedAdamW and the bf16 hooks face
//! PyTorch's ZeroRedundancyOptimizer and bf16_compress_hook in
//! tests/torch_oracle.rs, where the workbook's numbers are compared.
//!
//! The GPT sizes the benchmarks compare (`GptConfig::of_size`) are defined
//! on both sides too: `gpt_sizes_...` checks that the twin's `SIZES` build
//! the same models, by their parameter counts.
//!
//! Run: `cargo test --features solutions,mpi,nccl --test torch_twins`
//! (needs `.venv`, made by scripts/setup.sh).

#[path = "torch/venv.rs"]
mod venv;

use std::process::Command;

use ddp_workbook::models::{named_parameters, Gpt, GptConfig, GptSize};
use ddp_workbook::tch::Kind;
use std::sync::Mutex;
use std::time::Duration;

/// One twin at a time: each starts three Pythons that import torch, and
/// six at once on a busy two-core machine only wait for each other.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs `scripts/torch/twins/<script>` on 2 ranks and checks its verdict.
fn run_twin(script: &str) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut command = Command::new(venv::venv_program("torchrun"));
    command
        .current_dir(venv::repo())
        .args(["--standalone", "--nproc-per-node", "2"])
        // No folder of per-rank logs: torchrun makes a /tmp/torchelastic_*
        // one per run and never removes it; the twins' output comes here.
        .args(["--log-dir", "/dev/null"])
        .arg(format!("scripts/torch/twins/{script}"))
        .env("GLOO_SOCKET_IFNAME", "lo") // the loopback: gloo on one machine, no network needed
        .env("OMP_NUM_THREADS", "1"); // two ranks on two cores
    let what = format!("torchrun --nproc-per-node 2 scripts/torch/twins/{script}");
    let stdout = venv::stdout_within(command, &what, Duration::from_secs(300));
    let verdict = stdout.lines().find(|line| line.ends_with(": PASS"));
    println!("{}", verdict.unwrap_or("(no verdict)"));
    assert!(verdict.is_some(), "{what} exited 0 without its PASS line:\n{stdout}");
}

#[test]
fn ch03_averaging_by_hand_with_all_reduce() {
    run_twin("ch03_averaging.py");
}

#[test]
fn ch04_no_sync_accumulation() {
    run_twin("ch04_accumulation.py");
}

#[test]
fn ch05_bucket_caps() {
    run_twin("ch05_bucketing.py");
}

#[test]
fn ch06_overlap_through_a_comm_hook() {
    run_twin("ch06_overlap.py");
}

#[test]
fn ch07_distributed_sampler_and_set_epoch() {
    run_twin("ch07_sharding.py");
}

#[test]
fn ch08_training_loop_with_rank_0_checkpoints() {
    run_twin("ch08_training_run.py");
}

/// The parameters of a GPT, counted by hand from its config, layer by layer
/// as src/models/gpt.rs builds them (not with `GptConfig::parameter_count`).
fn counted_by_hand(cfg: &GptConfig) -> i64 {
    let (e, v, b) = (cfg.n_embd, cfg.vocab_size, cfg.block_size);
    let layer_norm = 2 * e; // weight and bias
    let linear = |inputs: i64, outputs: i64| inputs * outputs + outputs;
    let block =
        layer_norm + linear(e, 3 * e) + linear(e, e) + layer_norm + linear(e, 4 * e) + linear(4 * e, e);
    v * e + b * e + cfg.n_layer * block + layer_norm + e * v // lm_head has no bias
}

#[test]
fn gpt_sizes_build_the_same_models_as_the_pytorch_twin() {
    // `python scripts/torch/models.py` prints each size's config and the
    // twin's own count of its parameters.
    let stdout = venv::python("scripts/torch/models.py", &[]);
    let twin: Vec<Vec<&str>> =
        stdout.lines().filter_map(|l| l.strip_prefix("size ")).map(|l| l.split(' ').collect()).collect();
    let names: Vec<&str> = twin.iter().map(|fields| fields[0]).collect();
    let ours: Vec<&str> = GptSize::ALL.iter().map(|s| s.name()).collect();
    assert_eq!(names, ours, "the twin's SIZES and GptSize::ALL name different sizes:\n{stdout}");
    for (size, fields) in GptSize::ALL.into_iter().zip(&twin) {
        let cfg = GptConfig::of_size(size);
        let numbers: Vec<i64> = fields[1..].iter().map(|f| f.parse().expect("a number")).collect();
        let sizes = [cfg.vocab_size, cfg.block_size, cfg.n_layer, cfg.n_head, cfg.n_embd];
        assert_eq!(
            numbers[..5],
            sizes,
            "size {size}: the twin's config (vocab, block, layers, heads, width) differs from GptConfig::of_size"
        );
        let (vs, _gpt) = Gpt::seeded(0, &cfg, Kind::Float);
        let built: i64 = named_parameters(&vs).iter().map(|(_, t)| t.numel() as i64).sum();
        let by_hand = counted_by_hand(&cfg);
        assert_eq!(built, by_hand, "size {size}: the Rust model has {built} parameters, by hand {by_hand}");
        assert_eq!(cfg.parameter_count(), by_hand, "size {size}: GptConfig::parameter_count is wrong");
        assert_eq!(
            numbers[5], by_hand,
            "size {size}: the PyTorch twin has {} parameters, by hand {by_hand}",
            numbers[5]
        );
        println!("{size}: {built} parameters on both sides");
    }
    // The sizes the benchmark promises, so that a change shows in its names.
    let millions: Vec<f64> =
        GptSize::ALL.iter().map(|&s| GptConfig::of_size(s).parameter_count() as f64 / 1e6).collect();
    for (size, (m, want)) in GptSize::ALL.iter().zip(millions.iter().zip([0.1, 2.0, 10.0, 25.0])) {
        assert!((m / want - 1.0).abs() < 0.1, "size {size} has {m:.2}M parameters, not about {want}M");
    }
}
