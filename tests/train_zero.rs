//! The training run with AdamW sharded over the ranks (`TrainConfig`'s
//! `zero_stage: 1`, `--zero 1` of `examples/train.rs`: chapter 11's ZeRO-1
//! in the finished run), against the plain run, and its checkpoints, which
//! gather the shards. Run: `cargo test --test train_zero`
//! (add `-- --nocapture` to see the measured numbers).

mod train_runs;

use std::time::Duration;

use ddp_workbook::check::max_reference_diff;
use ddp_workbook::train::{self, ConfigError, TrainConfig};
use train_runs::{run, scratch};

/// The shared small run (12 steps, several buckets, shards that cross
/// epoch boundaries) on `world_size` ranks, at this ZeRO stage.
fn small_run(world_size: usize, zero_stage: usize) -> TrainConfig {
    TrainConfig { world_size, zero_stage, ..train_runs::small_run() }
}

#[test]
fn a_zero_1_run_ends_where_the_plain_run_ends() {
    for world_size in [2, 3] {
        let (plain, zero) = (run(&small_run(world_size, 0)), run(&small_run(world_size, 1)));
        // Every rank ended with the same weights (the run's own end-of-run
        // check compared the fingerprints of the whole state; and again here).
        for outcome in &zero[1..] {
            assert_eq!(max_reference_diff(&zero[0].weights, &outcome.weights), 0.0, "the replicas differ");
        }
        let moved = max_reference_diff(&zero[0].weights, &plain[0].weights);
        println!(
            "{world_size} ranks: largest weight difference from the plain run after 12 steps: {moved:e}"
        );
        // Sum then divide, and AdamW elementwise: the same operations per
        // element as the plain run, so the same bits (the sums of 2 and 3
        // terms happen in rank order in both collectives here).
        assert_eq!(moved, 0.0, "{world_size} ranks: ZeRO-1 left the plain run's weights");
        assert_eq!(zero[0].losses, plain[0].losses, "{world_size} ranks: the losses differ");
        // The whole final state, gathered moments included, hashes the same.
        assert_eq!(zero[0].fingerprint, plain[0].fingerprint, "{world_size} ranks: the final state differs");
        // The wrapper sent nothing: every backward ran inside no_sync.
        assert_eq!(zero[0].sync_time, Duration::ZERO, "the wrapper all-reduced under ZeRO-1");
        assert!(plain[0].sync_time > Duration::ZERO, "control: the plain run's wrapper syncs");
    }
}

#[test]
fn a_zero_1_checkpoint_resumes_with_zero_1_where_the_whole_run_ends_and_refuses_plain_adamw() {
    let dir = scratch("train-zero-resume");
    let whole = run(&small_run(2, 1));
    let path = dir.join("zero.ckpt");
    let first = TrainConfig { checkpoint: Some(path.clone()), stop_after: Some(5), ..small_run(2, 1) };
    assert_eq!(run(&first)[0].last_step, 5);
    let rest = TrainConfig { checkpoint: Some(path.clone()), resume: true, ..small_run(2, 1) };
    let resumed = run(&rest);
    let gap = max_reference_diff(&resumed[0].weights, &whole[0].weights);
    println!("saved under ZeRO-1 at step 5, resumed under ZeRO-1: {gap:e} from the whole run");
    assert_eq!(gap, 0.0, "resumed under ZeRO-1, the run ended elsewhere");
    assert_eq!(resumed[0].fingerprint, whole[0].fingerprint);
    // Plain AdamW sums each gradient with an all-reduce, not a reduce-scatter:
    // the same bits here, but not on every backend, so the stage is a
    // setting a resume must match.
    run(&first);
    let plain = TrainConfig { zero_stage: 0, ..rest };
    let refused = train::train(&plain, &|_| {}).map(|_| ()).expect_err("resumed with another ZeRO stage");
    assert!(format!("{refused:#}").contains("zero_stage: checkpoint 1, this run 0"), "{refused:#}");

    // Control: a run that resumes from zeroed moments ends elsewhere (so the
    // gathered moments above are what made it exact).
    let path = dir.join("zeroed.ckpt");
    let first = TrainConfig { checkpoint: Some(path.clone()), stop_after: Some(5), ..small_run(2, 1) };
    run(&first);
    let mut saved = train::checkpoint::load(&path).expect("the checkpoint loads");
    for (name, moment) in &mut saved.optimizer {
        if name.starts_with("exp_avg") {
            let _ = moment.zero_();
        }
    }
    train::checkpoint::save(&path, &saved).expect("the checkpoint saves");
    let resumed = run(&TrainConfig { checkpoint: Some(path), resume: true, ..small_run(2, 1) });
    let gap = max_reference_diff(&resumed[0].weights, &whole[0].weights);
    println!("control: resumed from zeroed moments: {gap:e} from the whole run");
    assert!(gap > 1e-4, "zeroed moments changed nothing: the test cannot tell");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_zero_stage_that_is_not_built_or_zero_with_bf16_is_refused_in_words() {
    let stage_2 = train::train(&small_run(2, 2), &|_| {}).expect_err("ZeRO stage 2 is not built");
    assert!(matches!(stage_2.downcast_ref(), Some(ConfigError::ZeroStage(2))), "{stage_2:#}");
    assert!(stage_2.to_string().contains("--zero 1"), "{stage_2:#}");
    let with_bf16 = TrainConfig { bf16_gradients: true, ..small_run(2, 1) };
    let error = train::train(&with_bf16, &|_| {}).expect_err("--zero 1 with bf16 gradients");
    assert!(matches!(error.downcast_ref(), Some(ConfigError::ZeroWithBf16)), "{error:#}");
}
