//! The PyTorch lines chapter 14 shows, run: `fully_shard` on each block and
//! on the root, `reshard_after_forward`, and `set_requires_gradient_sync`
//! for accumulation (scripts/torch/fully_shard_lines.py, under
//! `.venv/bin/torchrun --standalone --nproc-per-node 2`, gloo, float64).
//! Each rank's local shard must have the rows the library's `shard_rows`
//! gives it (a 7-row weight: 4 and 3; a 1-row one: 1 and 0), and a block's
//! parameter between forward and backward must be its shard with
//! `reshard_after_forward=True` and the full tensor with `False`, as the
//! library's schedule frees and keeps it.
//!
//! Run: `cargo test --test torch_fully_shard` (needs the project's .venv: scripts/setup.sh).

#[path = "torch/venv.rs"]
mod venv;

use std::process::Command;
use std::time::Duration;

use ddp_workbook::ddp::shard_rows;

fn torchrun(reshard: bool) -> String {
    let mut command = Command::new(venv::venv_program("torchrun"));
    command
        .current_dir(venv::repo())
        .args(["--standalone", "--nproc-per-node", "2", "scripts/torch/fully_shard_lines.py"])
        .arg(if reshard { "true" } else { "false" });
    venv::stdout_within(command, "torchrun fully_shard_lines.py", Duration::from_secs(300))
}

#[test]
fn pytorchs_fully_shard_keeps_the_rows_of_shard_rows_and_frees_as_the_schedule_does() {
    for reshard in [true, false] {
        let out = torchrun(reshard);
        let mut rows_seen = 0;
        for line in out.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            if let ["rank", rank, name, "full_rows", full, "local_rows", local] = words[..] {
                let (rank, full, local): (usize, i64, i64) =
                    (rank.parse().unwrap(), full.parse().unwrap(), local.parse().unwrap());
                assert_eq!(
                    shard_rows(full, 2, rank).1,
                    local,
                    "{name} ({full} rows) on rank {rank} of 2: PyTorch keeps {local} rows, shard_rows says otherwise"
                );
                rows_seen += 1;
            }
            if let Some(kind) = line.split("between forward and backward: ").nth(1) {
                let expected = if reshard { "DTensor" } else { "Parameter" };
                assert_eq!(
                    kind, expected,
                    "reshard_after_forward={reshard}: a block between forward and backward"
                );
            }
        }
        assert_eq!(rows_seen, 16, "8 parameters on each of 2 ranks in:\n{out}");
    }
}
