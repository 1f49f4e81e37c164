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
//! Run: `cargo test --features solutions,mpi,nccl --test torch_twins`
//! (needs `.venv`, made by scripts/setup.sh).

#[path = "torch/venv.rs"]
mod venv;

use std::process::Command;
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
