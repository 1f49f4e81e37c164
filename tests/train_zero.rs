//! The training run with AdamW sharded over the ranks (`TrainConfig`'s
//! `shard: ShardingStrategy::Optimizer`, `--zero 1` of `examples/train.rs`: chapter 11's ZeRO-1
//! in the finished run), against the plain run, and its checkpoints, which
//! gather the shards, and ZeRO-1 with a parameter left out of a step.
//! Run: `cargo test --test train_zero`
//! (add `-- --nocapture` to see the measured numbers).

mod train_runs;

use std::time::Duration;

use ddp_workbook::check::max_reference_diff;
use ddp_workbook::data::{masked_cross_entropy, TokenTask};
use ddp_workbook::ddp::{BucketCaps, Named, ShardedAdamW, StepOptimizer, UnusedParameters};
use ddp_workbook::dist;
use ddp_workbook::models::{named_parameters, Gpt, GptConfig};
use ddp_workbook::tch::nn::Module;
use ddp_workbook::tch::Kind;
use ddp_workbook::train::{self, AdamW, ConfigError, ShardingStrategy, TrainConfig};
use train_runs::{run, scratch};

/// The shared small run (12 steps, several buckets, shards that cross
/// epoch boundaries) on `world_size` ranks, at this ZeRO stage.
fn small_run(world_size: usize, zero_stage: usize) -> TrainConfig {
    let shard = ShardingStrategy::from_zero_stage(zero_stage).expect("a ZeRO stage");
    TrainConfig { world_size, shard, ..train_runs::small_run() }
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
    let plain = TrainConfig { shard: ShardingStrategy::NoShard, ..rest };
    let refused = train::train(&plain, &|_| {}).map(|_| ()).expect_err("resumed with another ZeRO stage");
    assert!(format!("{refused:#}").contains("shard: checkpoint optimizer, this run none"), "{refused:#}");

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

/// A parameter named unused (as the DDP wrapper names one no rank used) in
/// step 1 of 4: `ShardedAdamW` on 2 ranks, whose 1 KiB buckets cut their
/// shards through parameters, takes the bits of plain AdamW in one
/// process told the same; its gathered state holds that parameter's own
/// step count (3 of 4), and plain AdamW resumed from it steps on to the
/// same bits. Both ranks train on the same batch, so the averaged gradient
/// is each rank's, exactly ((g + g) / 2 = g).
#[test]
fn zero_1_skips_a_parameter_as_plain_adamw_does_and_saves_its_step_count() {
    let cfg = GptConfig { vocab_size: 16, block_size: 32, n_layer: 1, n_head: 2, n_embd: 16 };
    let backward = |gpt: &Gpt| {
        let (inputs, targets, mask) = TokenTask::standard(5, 8).batch(0, 8); // the same on every rank
        masked_cross_entropy(&gpt.forward(&inputs), &targets, &mask).backward();
    };
    let skipped = |params: &[Named]| params[1].0.clone();
    let train = |optimizer: &mut dyn FnMut(bool), gpt: &Gpt, steps: usize| {
        for step in 0..steps {
            backward(gpt);
            optimizer(step == 0);
        }
    };
    let caps = BucketCaps { cap_bytes: 1024, first_cap_bytes: 1024 };
    let zero = dist::spawn(2, |pg| {
        ddp_workbook::tch::set_num_threads(1);
        let (vs, gpt) = Gpt::seeded(3, &cfg, Kind::Double);
        let params = named_parameters(&vs);
        let mut zero = ShardedAdamW::new(&params, pg, caps, 1e-2, 0.1)?;
        let unused = UnusedParameters::OnEveryRank(vec![skipped(&params)]);
        let mut step = |skip: bool| {
            if skip {
                zero.skip_unused(&unused);
            }
            zero.step().unwrap();
            zero.zero_grad();
        };
        train(&mut step, &gpt, 4);
        Ok((named_parameters(&vs), zero.gathered_state()?))
    })
    .unwrap();
    let (vs, gpt) = Gpt::seeded(3, &cfg, Kind::Double);
    let params = named_parameters(&vs);
    let mut plain = AdamW::new(&params, 1e-2, 0.1);
    let mut step = |skip: bool| {
        if skip {
            plain.skip_in_next_step(&[skipped(&params)]);
        }
        plain.step().unwrap();
        plain.zero_grad();
    };
    train(&mut step, &gpt, 4);
    assert_eq!(max_reference_diff(&zero[0].0, &named_parameters(&vs)), 0.0, "ZeRO-1 left plain AdamW");

    let state = &zero[0].1;
    let count = |key: &str| state.iter().find(|(n, _)| n == key).map(|(_, t)| t.int64_value(&[0]));
    assert_eq!(count("step"), Some(4));
    assert_eq!(count(&format!("step.{}", skipped(&params))), Some(3), "the skipped parameter's own count");
    let (mut vs_resumed, gpt_resumed) = Gpt::seeded(4, &cfg, Kind::Double);
    vs_resumed.copy(&vs).unwrap();
    let mut resumed = AdamW::new(&named_parameters(&vs_resumed), 1e-2, 0.1);
    resumed.load_state(state).unwrap();
    for (optimizer, gpt) in [(&mut plain, &gpt), (&mut resumed, &gpt_resumed)] {
        backward(gpt);
        optimizer.step().unwrap();
    }
    let diff = max_reference_diff(&named_parameters(&vs_resumed), &named_parameters(&vs));
    assert_eq!(diff, 0.0, "plain AdamW resumed from ZeRO-1's state left the uninterrupted one");
}

#[test]
fn a_zero_stage_that_does_not_exist_or_sharding_with_bf16_is_refused_in_words() {
    let stage_4 = ShardingStrategy::from_zero_stage(4).expect_err("there is no ZeRO stage 4");
    assert!(matches!(stage_4, ConfigError::ZeroStage(4)), "{stage_4}");
    for sharded in [1, 2, 3] {
        let with_bf16 = TrainConfig { bf16_gradients: true, ..small_run(2, sharded) };
        let error = train::train(&with_bf16, &|_| {}).expect_err("sharded with bf16 gradients");
        assert!(matches!(error.downcast_ref(), Some(ConfigError::ZeroWithBf16(_))), "{error:#}");
    }
}

/// `--shard grad-op`: ZeRO-2 (`ShardGradOp`) in the run. Each bucket's
/// reduce-scatter sums in rank order and divides by the world size, as the
/// plain run's all-reduce, and AdamW is elementwise: the same bits.
#[test]
fn a_zero_2_run_ends_where_the_plain_run_ends_and_resumes_exactly() {
    for world_size in [2, 3] {
        let (plain, zero) = (run(&small_run(world_size, 0)), run(&small_run(world_size, 2)));
        let moved = max_reference_diff(&zero[0].weights, &plain[0].weights);
        println!("{world_size} ranks: ZeRO-2's largest weight difference from the plain run: {moved:e}");
        assert_eq!(moved, 0.0, "{world_size} ranks: ZeRO-2 left the plain run's weights");
        assert_eq!(zero[0].losses, plain[0].losses, "{world_size} ranks: the losses differ");
        assert_eq!(zero[0].fingerprint, plain[0].fingerprint, "{world_size} ranks: the final state differs");
    }
    let dir = scratch("train-zero-2-resume");
    let path = dir.join("zero2.ckpt");
    let whole = run(&small_run(2, 2));
    let first = TrainConfig { checkpoint: Some(path.clone()), stop_after: Some(5), ..small_run(2, 2) };
    run(&first);
    let resumed = run(&TrainConfig { checkpoint: Some(path.clone()), resume: true, ..small_run(2, 2) });
    assert_eq!(resumed[0].fingerprint, whole[0].fingerprint, "resumed under ZeRO-2, the run ended elsewhere");
    let other = TrainConfig { checkpoint: Some(path), resume: true, ..small_run(2, 1) };
    let refused = train::train(&other, &|_| {}).map(|_| ()).expect_err("resumed with another strategy");
    assert!(format!("{refused:#}").contains("shard: checkpoint grad-op, this run optimizer"), "{refused:#}");
    let _ = std::fs::remove_dir_all(&dir);
}
