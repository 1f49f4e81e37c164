//! Tests of the real training run (`src/train/`): the hand-written AdamW
//! against libtorch's and its per-parameter step counts, exact resume from a checkpoint (with controls that
//! show what breaks it), the checkpoint file itself, bad settings, that a
//! short run learns, that a run whose gradients are never averaged fails
//! its replica check, that a failed check leaves no checkpoint a restart
//! could resume from, and that a resume, and the ranks before their first
//! step, refuse every setting that changes the numbers when it differs.
//! Run: `cargo test --test train` (add `-- --nocapture` to see the
//! measured numbers).

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::forwarding::{AllReduceAsync, Forwarding, ReplaceAllReduce};
use ddp_workbook::check::{compare_replicas, max_reference_diff, snapshot};
use ddp_workbook::data::{masked_cross_entropy, TokenTask};
use ddp_workbook::ddp::Named;
use ddp_workbook::dist::{self, DistError, Group, ReduceOp, Work};
use ddp_workbook::models::{named_parameters, Gpt, GptConfig, GptSize};
use ddp_workbook::tch::nn::{self, Module, OptimizerConfig};
use ddp_workbook::tch::{Device, Kind, Tensor};
use ddp_workbook::train::{
    self, checkpoint, AdamW, CheckpointError, ConfigError, RankOutcome, ReplicasDiffer, ShardingStrategy,
    TrainConfig,
};

/// A run small enough for a debug build: 2 ranks, micro-batches of 4, 2 of
/// them per step, and 40 sequences, so every rank's shard (20) lasts 2.5
/// steps and both halves of a 12-step run cross epoch boundaries.
fn small_run(checkpoint: Option<PathBuf>) -> TrainConfig {
    TrainConfig {
        world_size: 2,
        batch_size: 4,
        accum_steps: 2,
        bucket_cap_mb: 0.1, // 0.1 MiB: the 0.4 MB model needs several buckets
        steps: 12,
        warmup_steps: 3,
        train_sequences: 40,
        eval_sequences: 16,
        log_every: 4,
        checkpoint,
        threads_per_rank: Some(1),
        ..TrainConfig::default()
    }
}

fn run(config: &TrainConfig) -> Vec<RankOutcome> {
    train::train(config, &|_| {}).unwrap_or_else(|e| panic!("the training run failed: {e:#}"))
}

/// A fresh folder for this test's files (removed first if a previous run left it).
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ddp-workbook-train-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("cannot create a scratch folder");
    dir
}

/// Panics, naming the first tensor that differs, unless `a` and `b` are bitwise equal.
fn assert_bitwise_equal(a: &[Named], b: &[Named], what: &str) {
    let largest = max_reference_diff(a, b);
    assert!(
        largest == 0.0,
        "{what}: the weights differ, largest difference {largest:e} (must be bitwise equal)"
    );
}

#[test]
fn adamw_computes_the_same_update_as_libtorch() {
    // The same f64 model twice; one trained by libtorch's optimizer, one by ours.
    let cfg = GptConfig { vocab_size: 16, block_size: 32, n_layer: 1, n_head: 2, n_embd: 16 };
    let task = TokenTask::standard(5, 8);
    let (inputs, targets, mask) = task.batch(0, 8);
    for weight_decay in [0.0, 0.1] {
        let (vs_ref, gpt_ref) = Gpt::seeded(3, &cfg, Kind::Double);
        let (vs_ours, gpt_ours) = Gpt::seeded(3, &cfg, Kind::Double);
        let lr = 1e-2;
        let mut reference = if weight_decay == 0.0 {
            nn::Adam::default().build(&vs_ref, lr).unwrap() // plain Adam
        } else {
            nn::AdamW { wd: weight_decay, ..Default::default() }.build(&vs_ref, lr).unwrap()
        };
        let mut ours = AdamW::new(&named_parameters(&vs_ours), lr, weight_decay);
        for _ in 0..5 {
            reference.zero_grad();
            masked_cross_entropy(&gpt_ref.forward(&inputs), &targets, &mask).backward();
            reference.step();
            ours.zero_grad();
            masked_cross_entropy(&gpt_ours.forward(&inputs), &targets, &mask).backward();
            ours.step().unwrap();
        }
        let diff = max_reference_diff(&named_parameters(&vs_ours), &named_parameters(&vs_ref));
        println!("weight decay {weight_decay}: after 5 steps our AdamW is {diff:e} from libtorch's");
        // Ours follows PyTorch's Python AdamW operation for operation (the
        // torch_oracle tests check its bits); libtorch's C++ Adam orders
        // them otherwise (`m*b1 + (1-b1)*g` where Python lerps), ~1e-14 here.
        assert!(
            diff <= 1e-12,
            "weight decay {weight_decay}: AdamW differs from libtorch's by {diff:e} after 5 steps"
        );
    }
}

/// A parameter left out of some steps (one no rank used) keeps a step
/// count of its own, which the state saves as `step.<name>` and a fresh
/// AdamW restores: stepping on from the restored state gives the bits of
/// stepping on. A state saved before per-parameter counts (no
/// `step.<name>`) loads with the optimizer's count for every parameter.
#[test]
fn adamw_saves_each_parameters_step_count_and_resumes_on_it() {
    let cfg = GptConfig { vocab_size: 16, block_size: 32, n_layer: 1, n_head: 2, n_embd: 16 };
    let (inputs, targets, mask) = TokenTask::standard(5, 8).batch(0, 8);
    let (vs, gpt) = Gpt::seeded(3, &cfg, Kind::Double);
    let skipped = named_parameters(&vs)[0].0.clone();
    let mut adamw = AdamW::new(&named_parameters(&vs), 1e-2, 0.1);
    let step = |adamw: &mut AdamW, gpt: &Gpt, skip: bool| {
        adamw.zero_grad();
        masked_cross_entropy(&gpt.forward(&inputs), &targets, &mask).backward();
        if skip {
            adamw.skip_in_next_step(std::slice::from_ref(&skipped));
        }
        adamw.step().unwrap();
    };
    let skipped_param = named_parameters(&vs)[0].1.shallow_clone();
    let before = skipped_param.copy();
    step(&mut adamw, &gpt, true); // the skipped parameter does not move
    assert!(skipped_param.equal(&before), "a skipped parameter moved");
    step(&mut adamw, &gpt, false);
    step(&mut adamw, &gpt, false);
    let state = adamw.state();
    let count = |state: &[Named], key: &str| -> i64 {
        let (_, t) =
            state.iter().find(|(n, _)| n == key).unwrap_or_else(|| panic!("no `{key}` in the state"));
        t.int64_value(&[0])
    };
    assert_eq!((count(&state, "step"), count(&state, &format!("step.{skipped}"))), (3, 2));

    let (mut vs_resumed, gpt_resumed) = Gpt::seeded(4, &cfg, Kind::Double);
    vs_resumed.copy(&vs).unwrap();
    let mut resumed = AdamW::new(&named_parameters(&vs_resumed), 1e-2, 0.1);
    resumed.load_state(&state).unwrap();
    step(&mut adamw, &gpt, false);
    step(&mut resumed, &gpt_resumed, false);
    assert_bitwise_equal(
        &named_parameters(&vs_resumed),
        &named_parameters(&vs),
        "resumed with per-parameter steps",
    );

    let old_format: Vec<Named> = state.into_iter().filter(|(n, _)| !n.starts_with("step.")).collect();
    resumed.load_state(&old_format).unwrap();
    assert_eq!(
        count(&resumed.state(), &format!("step.{skipped}")),
        3,
        "an old state's parameters take its `step`"
    );
}

// ANCHOR: resume_test
#[test]
fn resume_from_a_checkpoint_ends_bitwise_equal_to_an_uninterrupted_run() {
    let dir = scratch("resume");
    let path = dir.join("run.safetensors");
    let uninterrupted = run(&small_run(None));

    // The same run, "killed" after step 6, with a checkpoint every 3 steps...
    let first_half =
        run(&TrainConfig { stop_after: Some(6), checkpoint_every: 3, ..small_run(Some(path.clone())) });
    assert_eq!(first_half[0].last_step, 6);
    assert!(path.is_file(), "rank 0 wrote no checkpoint at {}", path.display());
    // ...then continued from it.
    let second_half = run(&TrainConfig { resume: true, ..small_run(Some(path.clone())) });
    assert_eq!(second_half[0].losses.len(), 6, "the resumed run must run steps 7 to 12 only");

    for rank in 0..2 {
        let losses = [first_half[rank].losses.clone(), second_half[rank].losses.clone()].concat();
        assert_eq!(
            losses, uninterrupted[rank].losses,
            "rank {rank}: the losses of 6 + 6 steps differ from 12 steps"
        );
        let what = format!("rank {rank}, 12 steps vs 6 + resume + 6");
        assert_bitwise_equal(&second_half[rank].weights, &uninterrupted[rank].weights, &what);
    }
    let replicas: Vec<_> = second_half.iter().map(|o| snapshot(&o.weights)).collect();
    compare_replicas(&replicas, 0.0).unwrap_or_else(|report| panic!("after the resume: {report}"));
    std::fs::remove_dir_all(&dir).ok();
}
// ANCHOR_END: resume_test

#[test]
fn an_interrupted_run_checkpoints_at_its_stop_step_whatever_checkpoint_every_says() {
    let dir = scratch("stop-step");
    let path = dir.join("run.safetensors");
    // Every 4 steps would save at step 4 only; the run stops at 5 and must
    // still leave step 5 behind, or --resume would restart from step 4.
    let stopped =
        run(&TrainConfig { stop_after: Some(5), checkpoint_every: 4, ..small_run(Some(path.clone())) });
    assert_eq!(stopped[0].last_step, 5);
    let saved = checkpoint::load(&path).expect("the interrupted run wrote a checkpoint");
    assert_eq!(saved.progress.step, 5, "the checkpoint must hold the step the run stopped at");
    std::fs::remove_dir_all(&dir).ok();
}

/// Rewrites the checkpoint at `path` with `edit` applied (a valid file,
/// with a correct checksum), as a buggy checkpointer would have written it.
fn rewrite(path: &Path, edit: impl FnOnce(&mut checkpoint::Checkpoint)) {
    let mut saved = checkpoint::load(path).unwrap();
    edit(&mut saved);
    checkpoint::save(path, &saved).unwrap();
}

#[test]
fn resume_without_optimizer_state_or_data_position_is_not_exact() {
    // Controls: if the checkpoint forgot Adam's moments, or where the data
    // stream stood, the resumed run would end elsewhere. So the test above
    // really checks that both are saved and restored.
    let dir = scratch("controls");
    let path = dir.join("run.safetensors");
    let uninterrupted = run(&small_run(None));
    let interrupted =
        TrainConfig { stop_after: Some(6), checkpoint_every: 6, ..small_run(Some(path.clone())) };
    let resumed = TrainConfig { resume: true, ..small_run(Some(path.clone())) };

    type Edit = fn(&mut checkpoint::Checkpoint);
    let forget_moments: Edit = |c| {
        for (name, t) in &mut c.optimizer {
            if name.starts_with("exp_avg") {
                *t = t.zeros_like();
            }
        }
    };
    let forget_position: Edit = |c| {
        c.progress.epoch = 0;
        c.progress.position = 0;
    };
    for (what, edit) in [("Adam's moments", forget_moments), ("the data position", forget_position)] {
        run(&interrupted);
        rewrite(&path, edit);
        let outcome = run(&resumed);
        let diff = max_reference_diff(&outcome[0].weights, &uninterrupted[0].weights);
        println!("resumed without {what}: {diff:e} from the uninterrupted run");
        assert!(diff > 1e-6, "resuming without {what} should end elsewhere, but is only {diff:e} away");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_checkpoint_holds_rank_0s_weights_and_loads_into_a_fresh_model() {
    let dir = scratch("fresh");
    let path = dir.join("model.safetensors");
    let outcome = run(&TrainConfig { steps: 4, ..small_run(Some(path.clone())) });
    assert_eq!(
        checkpoint::leftover_temporaries(&path),
        Vec::<std::path::PathBuf>::new(),
        "temporary files were left behind"
    );

    // A model with other weights (seed 99), then the checkpoint's.
    let task = TokenTask::standard(0, 1);
    let cfg = GptConfig { vocab_size: task.vocab_size(), ..GptConfig::tiny() };
    let (vs, _gpt) = Gpt::seeded(99, &cfg, Kind::Float);
    checkpoint::load_model_weights(&vs, &path).unwrap_or_else(|e| panic!("{e}"));
    let mut loaded: Vec<Named> = vs.variables().into_iter().collect();
    loaded.sort_by(|a, b| a.0.cmp(&b.0));
    let mut rank0 = snapshot(&outcome[0].weights);
    rank0.sort_by(|a, b| a.0.cmp(&b.0));
    assert_bitwise_equal(&loaded, &rank0, "fresh model loaded from the checkpoint vs rank 0");
    assert_eq!(loaded.len(), rank0.len(), "the checkpoint must hold every parameter and buffer");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_missing_or_damaged_checkpoint_is_a_clear_error() {
    let dir = scratch("errors");
    let path = dir.join("run.safetensors");
    let resume = TrainConfig { resume: true, ..small_run(Some(path.clone())) };
    let message = |config: &TrainConfig| match train::train(config, &|_| {}) {
        Ok(_) => panic!("resuming from {} should fail", path.display()),
        Err(error) => format!("{error:#}"),
    };

    let missing = message(&resume);
    assert!(missing.contains("no checkpoint file"), "missing file, got: {missing}");

    std::fs::write(&path, b"these bytes are not a checkpoint").unwrap();
    let garbage = message(&resume);
    assert!(garbage.contains("cannot read the checkpoint"), "garbage file, got: {garbage}");

    run(&TrainConfig { steps: 2, ..small_run(Some(path.clone())) }); // a real one (at step 2 of 2)
    let good = std::fs::read(&path).unwrap();
    std::fs::write(&path, &good[..good.len() / 2]).unwrap();
    let truncated = message(&resume);
    assert!(truncated.contains("cannot read the checkpoint"), "truncated file, got: {truncated}");

    let mut flipped = good.clone();
    let last = flipped.len() - 5; // inside the tensor data, past the header
    flipped[last] ^= 0x10;
    std::fs::write(&path, &flipped).unwrap();
    let damaged = message(&resume);
    assert!(damaged.contains("checksum"), "one flipped bit, got: {damaged}");

    std::fs::write(&path, &good).unwrap();
    let other_lr = message(&TrainConfig { lr: 1e-3, steps: 2, ..resume.clone() });
    assert!(other_lr.contains("lr: checkpoint 0.003, this run 0.001"), "other settings, got: {other_lr}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_settings_are_refused_before_any_rank_starts() {
    let refused =
        |config: TrainConfig| config.validate().expect_err("these settings must be refused").to_string();
    let no_ranks = refused(TrainConfig { world_size: 0, ..small_run(None) });
    assert!(no_ranks.contains("world_size must be at least 1"), "{no_ranks}");
    let big_batch = refused(TrainConfig { batch_size: 64, ..small_run(None) });
    assert!(big_batch.contains("fewer than one micro-batch"), "{big_batch}");
    let no_path = refused(TrainConfig { resume: true, ..small_run(None) });
    assert!(no_path.contains("--resume needs a checkpoint file"), "{no_path}");
    let late_stop = refused(TrainConfig { stop_after: Some(12), ..small_run(None) });
    assert!(late_stop.contains("stop_after"), "{late_stop}");
    let lr = refused(TrainConfig { lr: f64::NAN, ..small_run(None) });
    assert!(lr.contains("lr must be a positive"), "{lr}");
    assert!(matches!(
        TrainConfig { resume: true, ..small_run(Some("/no/such/file".into())) }.validate(),
        Err(ConfigError::Checkpoint(CheckpointError::Missing { .. }))
    ));
}

#[test]
fn a_short_run_learns() {
    let outcome =
        run(&TrainConfig { steps: 40, train_sequences: 400, lr: 3e-3, warmup_steps: 5, ..small_run(None) });
    let losses = &outcome[0].losses;
    let (first, last) = (losses[0], losses[losses.len() - 5..].iter().sum::<f64>() / 5.0);
    println!("rank 0's loss: {first:.3} at step 1, {last:.3} over the last 5 steps");
    // ln(16) = 2.77 at the start; the chance level of the task is ln(15) = 2.71.
    assert!(last < first - 0.5, "the loss should fall by more than 0.5 in 40 steps: {first:.3} -> {last:.3}");
}

#[test]
fn a_run_whose_gradients_are_never_averaged_fails_its_replica_check() {
    // Each rank trains on its own shard and keeps its own gradients: rank 0
    // alone would still learn, so only comparing the replicas can tell.
    let config = TrainConfig { steps: 4, ..small_run(None) };
    let run = dist::spawn(2, |pg| {
        // Every all-reduce leaves its tensor as it is: no gradient is ever averaged.
        let do_nothing: AllReduceAsync = |_, _, _| Ok(Work::new(|| Ok(())));
        let unsynced: Group = Arc::new(Forwarding {
            inner: pg,
            name: "all-reduces-do-nothing",
            intercept: ReplaceAllReduce(do_nothing),
        });
        train::train_rank(unsynced, &config, &|_| {})
    });
    let error = match run {
        Ok(outcomes) => panic!(
            "a run without gradient averaging finished without an error (fingerprints {:#x} and {:#x})",
            outcomes[0].fingerprint, outcomes[1].fingerprint
        ),
        Err(error) => error,
    };
    for rank in 0..2 {
        let failure = error.failure_of(rank).unwrap_or_else(|| panic!("rank {rank} did not fail: {error}"));
        let dist::RankFailure::Error(cause) = failure else { panic!("rank {rank} panicked: {failure}") };
        let differ =
            cause.downcast_ref::<ReplicasDiffer>().unwrap_or_else(|| panic!("rank {rank}: {cause:#}"));
        assert_eq!((differ.step, differ.fingerprints.len()), (4, 2), "{differ}");
        println!("rank {rank}: {differ}");
    }
}

#[test]
fn every_rank_reports_the_fingerprint_of_the_final_checkpoint() {
    // The run's check passes, and what it compared is what rank 0 saved.
    let dir = scratch("fingerprint");
    let path = dir.join("run.safetensors");
    let outcome = run(&TrainConfig { steps: 3, ..small_run(Some(path.clone())) });
    let saved = checkpoint::load(&path).expect("the run saved a checkpoint");
    let in_the_file = checkpoint::fingerprint(&saved);
    for (rank, outcome) in outcome.iter().enumerate() {
        assert_eq!(outcome.fingerprint, in_the_file, "rank {rank}'s fingerprint is not the checkpoint's");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `pg` as rank 1 sees it when, from step `from` on, it skips its gradient
/// sync: it still joins every all-reduce (rank 0 gets the average, nothing
/// hangs) but keeps its own gradient. Every rank's calls go through the
/// same line, so that the backend, which compares where each rank called a
/// collective from, sees the same calls. The steps are told apart by the
/// run's two logging all-reduces of one number after each step, so the run
/// must log every step (`log_every: 1`).
fn rank_1_skips_its_sync_from(pg: Group, from: usize) -> Group {
    let skips = pg.rank() == 1;
    let logged = AtomicUsize::new(0);
    let all_reduce = move |inner: &Group, tensor: &Tensor, op: ReduceOp| -> Result<Work, DistError> {
        let gradients = tensor.numel() > 1;
        if !gradients {
            logged.fetch_add(1, Ordering::SeqCst);
        }
        let skipped = skips && gradients && logged.load(Ordering::SeqCst) / 2 + 1 >= from;
        // Skipped, the average lands in a copy, dropped once it has arrived.
        let target = if skipped { tensor.copy() } else { tensor.shallow_clone() };
        let work = inner.all_reduce_async(&target, op)?;
        Ok(Work::new(move || work.wait().map(|()| drop(target))))
    };
    Arc::new(Forwarding { inner: pg, name: "rank-1-skips-its-sync", intercept: ReplaceAllReduce(all_reduce) })
}

/// The run that the next tests break: 10 steps, a checkpoint every 5, a log line every step.
fn checkpointed_run(path: &Path) -> TrainConfig {
    TrainConfig { steps: 10, checkpoint_every: 5, log_every: 1, ..small_run(Some(path.to_path_buf())) }
}

/// Runs `config` with rank 1 skipping its sync from step `from`; returns
/// the step after which every rank reported `ReplicasDiffer`.
fn fails_its_replica_check(config: &TrainConfig, from: usize) -> usize {
    let run = dist::spawn(2, |pg| train::train_rank(rank_1_skips_its_sync_from(pg, from), config, &|_| {}));
    let Err(error) = run else { panic!("rank 1 skipped its sync from step {from}, yet the run succeeded") };
    let steps: Vec<usize> = (0..2)
        .map(|rank| match error.failure_of(rank) {
            Some(dist::RankFailure::Error(cause)) => match cause.downcast_ref::<ReplicasDiffer>() {
                Some(differ) => differ.step,
                None => panic!("rank {rank} failed, but not its replica check: {cause:#}"),
            },
            other => panic!("rank {rank}: {other:?}"),
        })
        .collect();
    assert_eq!(steps[0], steps[1], "the ranks disagree on where the check failed");
    steps[0]
}

#[test]
fn a_run_that_fails_its_replica_check_leaves_no_checkpoint_a_restart_could_resume() {
    // Rank 1 skips every sync: the replicas differ from step 1 on. Checked
    // before each save, the run fails at its first checkpoint and writes
    // none; a restart (a launcher's --max-restarts adds --resume) then has
    // nothing to resume and fails too, where it used to load rank 0's
    // state everywhere, find the replicas equal and succeed.
    let dir = scratch("diverged");
    let path = dir.join("run.safetensors");
    let config = checkpointed_run(&path);
    let failed_at = fails_its_replica_check(&config, 1);
    assert_eq!(
        failed_at, 5,
        "the replicas differ from step 1: the check before the first save must catch it"
    );
    assert!(!path.exists(), "a run that failed its replica check left a checkpoint of the state that failed");
    assert!(!checkpoint::previous_path(&path).exists(), "and a previous one");
    let restart = train::train(&TrainConfig { resume: true, ..config }, &|_| {});
    let error = restart.expect_err("a restart turned the failed replica check into success");
    assert!(format!("{error:#}").contains("no checkpoint file"), "{error:#}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_restart_after_a_failed_replica_check_resumes_from_the_last_agreed_checkpoint() {
    // Rank 1 skips its syncs from step 7: the checkpoint of step 5 holds
    // replicas that agree, the one of step 10 would not. A restart resumes
    // from step 5 and, without the fault, ends where a run without it ends.
    let dir = scratch("diverged-late");
    let path = dir.join("run.safetensors");
    let config = checkpointed_run(&path);
    assert_eq!(fails_its_replica_check(&config, 7), 10);
    let saved = checkpoint::load(&path).expect("the checkpoint of step 5 stays");
    assert_eq!(saved.progress.step, 5, "the only checkpoint must be the last one the replicas agreed on");

    let restarted = run(&TrainConfig { resume: true, ..config.clone() });
    assert_eq!(restarted[0].losses.len(), 5, "the restart must run steps 6 to 10");
    let healthy = run(&TrainConfig { checkpoint: None, checkpoint_every: 0, ..config });
    assert_bitwise_equal(&restarted[0].weights, &healthy[0].weights, "restarted vs a run without the fault");
    assert_eq!(restarted[0].fingerprint, healthy[0].fingerprint, "the final states differ");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_checkpoint_of_a_finished_run_is_refused_not_resumed() {
    // Its step is the run's last: resuming it would run no step and
    // "succeed" on whatever state it holds.
    let dir = scratch("finished");
    let path = dir.join("run.safetensors");
    let config = TrainConfig { steps: 3, ..small_run(Some(path.clone())) };
    run(&config);
    let error = train::train(&TrainConfig { resume: true, ..config }, &|_| {})
        .expect_err("a checkpoint at the run's last step was resumed");
    let message = format!("{error:#}");
    assert!(message.contains("step 3, the last step of this run"), "{message}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_resume_refuses_every_setting_that_changes_the_numbers() {
    let dir = scratch("settings");
    let path = dir.join("run.safetensors");
    let saved = TrainConfig { stop_after: Some(2), ..small_run(Some(path.clone())) };
    run(&saved);
    let base = TrainConfig { resume: true, stop_after: Some(3), ..saved };
    // Each setting flipped alone, and the words the refusal must contain.
    let flipped: Vec<(TrainConfig, &str)> = vec![
        (TrainConfig { bf16_gradients: true, ..base.clone() }, "grad_dtype: checkpoint f32, this run bf16"),
        (
            TrainConfig { shard: ShardingStrategy::Optimizer, ..base.clone() },
            "shard: checkpoint none, this run optimizer",
        ),
        (TrainConfig { model: GptSize::M2, ..base.clone() }, "model: checkpoint tiny, this run 2m"),
        (TrainConfig { device: Device::Cuda(0), ..base.clone() }, "device: checkpoint cpu, this run cuda"),
        (TrainConfig { bucket_cap_mb: 0.2, ..base.clone() }, "bucket_cap_mb: checkpoint 0.1, this run 0.2"),
        (TrainConfig { accum_steps: 1, ..base.clone() }, "accum_steps: checkpoint 2, this run 1"),
        (
            TrainConfig { threads_per_rank: Some(2), ..base.clone() },
            "threads_per_rank: checkpoint 1, this run 2",
        ),
        (TrainConfig { world_size: 3, ..base.clone() }, "world_size: checkpoint 2, this run 3"),
        (TrainConfig { batch_size: 2, ..base.clone() }, "batch_size: checkpoint 4, this run 2"),
        (TrainConfig { steps: 13, ..base.clone() }, "steps: checkpoint 12, this run 13"),
        (TrainConfig { seed: 7, ..base.clone() }, "seed: checkpoint 1337, this run 7"),
        (TrainConfig { lr: 1e-3, ..base.clone() }, "lr: checkpoint 0.003, this run 0.001"),
        (TrainConfig { warmup_steps: 2, ..base.clone() }, "warmup_steps: checkpoint 3, this run 2"),
        (TrainConfig { weight_decay: 0.1, ..base.clone() }, "weight_decay: checkpoint 0, this run 0.1"),
        (TrainConfig { train_sequences: 48, ..base.clone() }, "train_sequences: checkpoint 40, this run 48"),
    ];
    for (config, want) in flipped {
        let refused = train::train(&config, &|_| {}).map(|_| ()).expect_err(want);
        let message = format!("{refused:#}");
        assert!(message.contains(want) && message.contains("other settings"), "{want}: {message}");
        assert_eq!(message.matches("this run").count(), 1, "only the flipped setting may differ: {message}");
    }
    // Control: with nothing flipped, the same checkpoint resumes.
    assert_eq!(run(&base)[0].last_step, 3);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn ranks_started_with_different_settings_fail_before_the_first_step() {
    // A launched job's ranks each parse their own flags: one started with
    // another --threads (which a machine's core count changes by default)
    // or another --grad-dtype must stop the job at the start, naming it.
    type Flip = fn(TrainConfig) -> TrainConfig;
    let cases: [(Flip, &str); 2] = [
        (
            |c| TrainConfig { threads_per_rank: Some(2), ..c },
            "threads_per_rank is 1 on rank(s) 0, 2 on rank(s) 1",
        ),
        (|c| TrainConfig { bf16_gradients: true, ..c }, "grad_dtype is f32 on rank(s) 0, bf16 on rank(s) 1"),
    ];
    for (flip, want) in cases {
        let steps = AtomicUsize::new(0);
        let count = |event: train::Event| {
            if let train::Event::Stepped { .. } = event {
                steps.fetch_add(1, Ordering::SeqCst);
            }
        };
        let run = dist::spawn(2, |pg| {
            let config = if pg.rank() == 1 { flip(small_run(None)) } else { small_run(None) };
            train::train_rank(pg, &config, &count)
        });
        let Err(error) = run else { panic!("{want}: the run succeeded") };
        for rank in 0..2 {
            let failure =
                error.failure_of(rank).unwrap_or_else(|| panic!("rank {rank} did not fail: {error}"));
            let message = failure.to_string();
            println!("rank {rank}: {message}");
            assert!(message.contains(want), "rank {rank}: {message}");
        }
        assert_eq!(steps.load(Ordering::SeqCst), 0, "{want}: the run took steps before it failed");
    }
}
