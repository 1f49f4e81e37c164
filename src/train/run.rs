//! What every rank of the training run does, from building its replica to
//! its last step. `train` in `mod.rs` runs [`train_rank`] on every rank.
//!
//! Run it:     `cargo run --release --example train`
//! Its tests:  `cargo test --test train`

use tch::{nn, Kind, Tensor};

use super::agreement::{check_replicas_agree, check_settings_agree};
use super::checkpoint::{self, Checkpoint, CheckpointError, LoopPosition};
use super::config::TrainConfig;
use super::outcome::{Evaluation, Event, RankOutcome};
use super::phases::{Phase, PhaseClock};
use super::run_optimizer::RunOptimizer;
use super::step_log::StepLog;
use crate::check::snapshot;
use crate::data::{masked_accuracy, masked_cross_entropy, TokenTask};
use crate::ddp::Named;
use crate::ddp::{
    rows, train_step_with, BucketCaps, BucketingError, DistributedSampler, InitSync, SamplerOptions,
    SimpleDistributedDataParallelism,
};
use crate::dist::Group;
use crate::models::{named_buffers, named_parameters, Gpt, GptConfig};

// ANCHOR: lr_at
/// The learning rate of optimizer step `step` (counted from 0): a linear
/// warm-up to `config.lr` over `warmup_steps`, then a cosine decay to a
/// tenth of it at the last step. It depends on the step alone, so a resumed
/// run follows the same schedule.
pub fn lr_at(config: &TrainConfig, step: usize) -> f64 {
    if step < config.warmup_steps {
        return config.lr * (step + 1) as f64 / config.warmup_steps as f64;
    }
    let decay_steps = config.steps.saturating_sub(config.warmup_steps).max(1);
    let progress = ((step - config.warmup_steps) as f64 / decay_steps as f64).min(1.0); // 0 -> 1
    let min_lr = config.lr / 10.0;
    min_lr + 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()) * (config.lr - min_lr)
}
// ANCHOR_END: lr_at

/// Where this rank is in its stream of examples: its shard of the current
/// epoch and the position of the next micro-batch in it.
pub(super) struct ShardCursor {
    pub(super) sampler: DistributedSampler,
    shard: Vec<i64>,
    pub(super) position: usize,
}

impl ShardCursor {
    pub(super) fn new(mut sampler: DistributedSampler, epoch: u64, position: usize) -> ShardCursor {
        sampler.set_epoch(epoch);
        let shard = sampler.indices();
        ShardCursor { sampler, shard, position }
    }

    /// The next `len` example indices. An epoch's tail shorter than `len` is
    /// skipped; every rank's shard has the same length, so all skip alike.
    pub(super) fn next_micro_batch(&mut self, len: usize) -> &[i64] {
        if self.position + len > self.shard.len() {
            self.sampler.set_epoch(self.sampler.epoch() + 1); // a new shuffle, the same on every rank
            self.shard = self.sampler.indices();
            self.position = 0;
        }
        self.position += len;
        &self.shard[self.position - len..self.position]
    }

    /// Where the loop stands once `step` is done: what a checkpoint saves
    /// to resume at the next micro-batch.
    pub(super) fn after(&self, step: usize) -> LoopPosition {
        LoopPosition { step: step as i64, epoch: self.sampler.epoch() as i64, position: self.position as i64 }
    }
}

/// Inputs, targets and mask of the sequences at `indices` of `task`, on `device`.
pub(super) fn micro_batch(
    task: &TokenTask,
    indices: &[i64],
    device: tch::Device,
) -> (Tensor, Tensor, Tensor) {
    let picked = TokenTask { sequences: rows(&task.sequences, indices), ..*task };
    on_device(picked.batch(0, indices.len() as i64), device) // [len, seq_len] each
}

/// A batch's three tensors, moved to `device` (the same tensors on the CPU).
fn on_device(
    (inputs, targets, mask): (Tensor, Tensor, Tensor),
    device: tch::Device,
) -> (Tensor, Tensor, Tensor) {
    (inputs.to_device(device), targets.to_device(device), mask.to_device(device))
}

// ANCHOR: train_rank
/// One rank's whole run with every replica whole (`--shard none` or
/// `optimizer`): build the replica (or restore it from the checkpoint),
/// wrap it, then step through its shard of the data.
pub(super) fn train_replicated_rank(
    pg: Group,
    config: &TrainConfig,
    on_event: &(dyn Fn(Event) + Sync),
) -> anyhow::Result<RankOutcome> {
    let rank = pg.rank();
    // Ranks that parsed their own flags must agree on every setting that
    // changes the numbers, before a step can make their replicas drift.
    check_settings_agree(pg.as_ref(), &config.settings())?;
    // ANCHOR: setup
    let task = TokenTask::standard(config.seed as i64, config.train_sequences as i64);
    let (vs, gpt) = build_model(config, &task);

    let saved = match (&config.checkpoint, config.resume) {
        // Rank 0 reads the file; the others receive it (resume.rs).
        (Some(path), true) => Some((path, super::resume::load_on_rank0(pg.as_ref(), path, config)?)),
        _ => None,
    };
    if let Some((path, saved)) = &saved {
        saved.restore_model(path, &named_parameters(&vs))?; // every rank holds the same bytes
        saved.restore_model(path, &named_buffers(&vs))?;
    }
    let (ddp, caps) = wrap_model(gpt, &vs, pg.clone(), config)?;
    // Plain: AdamW whole on every rank. ZeRO-1: sharded (run_optimizer.rs).
    let mut optimizer = RunOptimizer::new(&ddp, config, caps)?;
    let mut progress = LoopPosition { step: 0, epoch: 0, position: 0 };
    if let Some((path, saved)) = &saved {
        let invalid = |detail| CheckpointError::Invalid { path: path.to_path_buf(), detail };
        optimizer.load_state(&saved.optimizer).map_err(invalid)?;
        progress = saved.progress;
    }
    let options = SamplerOptions { seed: config.seed, ..SamplerOptions::default() }; // shuffled, tail padded
    let sampler = DistributedSampler::sharded(pg.as_ref(), task.len(), options)?;
    let mut cursor = ShardCursor::new(sampler, progress.epoch as u64, progress.position as usize);
    // ANCHOR_END: setup

    let (first_step, last_step) = (progress.step as usize + 1, config.stop_after.unwrap_or(config.steps));
    if rank == 0 {
        let parameters = ddp.parameters().iter().map(|(_, p)| p.numel() as i64).sum();
        on_event(Event::Started { first_step, last_step, parameters, buckets: ddp.buckets().len(), config });
    }
    let tokens_per_step = (config.global_batch() as i64 * task.seq_len()) as f64;
    let k = config.accum_steps;
    let mut log = StepLog::new(config, rank, last_step, tokens_per_step, on_event);
    let clock = PhaseClock::new(); // where the steps' time goes, for the benchmarks
    let mut fingerprint = None; // of the last state the replicas agreed on
    for step in first_step..=last_step {
        // ANCHOR: step
        let started = clock.start();
        optimizer.set_lr(lr_at(config, step - 1));
        let micro_batches: Vec<Vec<i64>> =
            (0..k).map(|_| cursor.next_micro_batch(config.batch_size).to_vec()).collect();
        let micro_batches: Vec<&[i64]> = micro_batches.iter().map(Vec::as_slice).collect();
        let mut last_micro_batch = None;
        // Chapter 7's step: the losses of k micro-batches, divided by k, all
        // but the last backward under no_sync, then the optimizer. ZeRO-1:
        // all of them, since the optimizer's step reduce-scatters the gradients.
        let _zero = optimizer.syncs_gradients().then(|| ddp.no_sync());
        let rank_loss = train_step_with(
            &ddp,
            &mut optimizer,
            &micro_batches,
            |indices| {
                let (inputs, targets, mask) = micro_batch(&task, indices, config.device);
                clock.lap(Phase::Data);
                let logits = ddp.forward(&inputs); // [batch, seq, vocab]
                let loss = masked_cross_entropy(&logits, &targets, &mask); // [], this micro-batch's mean
                clock.lap(Phase::Forward);
                last_micro_batch = Some((logits, targets, mask));
                loss
            },
            |_| clock.lap(Phase::Backward), // the sync inside is taken out at the end
        )?;
        drop(_zero);
        clock.lap(Phase::Optimizer);
        log.stepped(started.elapsed(), rank_loss);
        progress = cursor.after(step);
        // ANCHOR_END: step

        // ANCHOR: rank0
        log.report(step, optimizer.lr(), last_micro_batch, |v| Ok(ddp.mean_over_ranks(v)?))?;
        let due = checkpoint_due(config, step);
        if due.is_some() || step == last_step {
            // The ranks compare the state first and save it after: a
            // checkpoint of replicas that differ would hold rank 0's state
            // alone, and a restart would resume every rank from it as if
            // they had agreed (agreement.rs). Sharded, gathering the state
            // is a collective.
            let (state, agreed) = agreed_state(&pg, &vs, optimizer.state()?, config, progress)?;
            fingerprint = Some(agreed);
            if let (Some(path), 0) = (due, rank) {
                checkpoint::save(path, &state)?;
                on_event(Event::Checkpointed { step, path });
            }
        }
        // ANCHOR_END: rank0
    }
    // The proof that DDP kept the replicas equal: the state of the last
    // step, fingerprinted on every rank, was the same everywhere.
    let fingerprint = match fingerprint {
        Some(agreed) => agreed,
        None => agreed_state(&pg, &vs, optimizer.state()?, config, progress)?.1, // no step was left to run
    };
    let sync_time = ddp.sync_time();
    let mut phases = clock.phases();
    phases.sync = sync_time;
    phases.backward = phases.backward.saturating_sub(sync_time);
    let evaluation = (rank == 0).then(|| evaluate(ddp.module(), config));
    let weights = snapshot(&model_tensors(&vs));
    let tokens_per_second = log.tokens_per_second();
    let StepLog { losses, train_time, .. } = log;
    Ok(RankOutcome {
        rank,
        last_step,
        losses,
        weights,
        evaluation,
        train_time,
        sync_time,
        tokens_per_second,
        phases,
        fingerprint,
    })
}
// ANCHOR_END: train_rank

// ANCHOR: model
/// The run's model for `task`, before any checkpoint is loaded: the GPT of
/// `config.model` (the tiny one unless a benchmark asks for more) sized for
/// the task, from `config.seed`. Same seed on every rank: the same
/// initial weights (chapter 2).
pub fn build_model(config: &TrainConfig, task: &TokenTask) -> (nn::VarStore, Gpt) {
    let gpt_config = GptConfig {
        vocab_size: task.vocab_size(),
        block_size: task.seq_len(),
        ..GptConfig::of_size(config.model)
    };
    let (mut vs, gpt) = Gpt::seeded(config.seed as i64, &gpt_config, Kind::Float);
    vs.set_device(config.device); // built on the CPU, bitwise alike everywhere, then moved
    (vs, gpt)
}

/// The run's wrapper around `gpt` (whose variables are `vs`), as every step
/// syncs it: it checks that every rank holds the same weights, plans the
/// buckets with the run's caps (returned too: ZeRO-1 shards by them) and,
/// with `bf16_gradients`, registers chapter 12's hook, which averages each
/// bucket. `tests/train_bf16.rs` checks the gradients it averages.
pub fn wrap_model(
    gpt: Gpt,
    vs: &nn::VarStore,
    pg: Group,
    config: &TrainConfig,
) -> Result<(SimpleDistributedDataParallelism<Gpt>, BucketCaps), BucketingError> {
    let caps = config.bucket_caps();
    // The strict check (chapter 2), not PyTorch's broadcast: every rank built
    // or restored the same weights, and a rank that did not is a bug to
    // report, not to paper over.
    let ddp = SimpleDistributedDataParallelism::with_init_sync(gpt, vs, pg, caps, InitSync::Verify)?;
    if config.bf16_gradients {
        ddp.register_comm_hook(crate::ddp::bf16_compress_hook); // each bucket travels as bf16
    }
    Ok((ddp, caps))
}
// ANCHOR_END: model

/// The model's parameters, then its buffers: what a checkpoint saves of
/// it, on the CPU (a copy when the model is on a GPU; the same tensors
/// when it is not).
pub(super) fn model_tensors(vs: &tch::nn::VarStore) -> Vec<Named> {
    let on_cpu = |(name, t): Named| (name, t.to_device(tch::Device::Cpu));
    named_parameters(vs).into_iter().chain(named_buffers(vs)).map(on_cpu).collect()
}

/// The state a checkpoint after `progress` holds (`optimizer`: the whole
/// optimizer state, gathered on every rank where it is sharded), and its
/// fingerprint, once every rank has found its own the same
/// ([`check_replicas_agree`]; otherwise every rank fails with
/// `ReplicasDiffer`). Every rank calls it.
pub(super) fn agreed_state(
    pg: &Group,
    vs: &tch::nn::VarStore,
    optimizer: Vec<Named>,
    config: &TrainConfig,
    progress: LoopPosition,
) -> anyhow::Result<(Checkpoint, i64)> {
    let state = Checkpoint { model: model_tensors(vs), optimizer, progress, settings: config.settings() };
    let agreed = check_replicas_agree(pg.as_ref(), checkpoint::fingerprint(&state), progress.step as usize)?;
    Ok((state, agreed))
}

/// The checkpoint file if one is due after `step`: every `checkpoint_every`
/// steps, after the last step of the run, and at the step an interrupted run
/// stops at (else `--resume` would quietly restart from an older one).
pub(super) fn checkpoint_due(config: &TrainConfig, step: usize) -> Option<&std::path::Path> {
    let every = config.checkpoint_every;
    let last = config.stop_after.unwrap_or(config.steps);
    let due = step == last || (every > 0 && step.is_multiple_of(every));
    config.checkpoint.as_deref().filter(|_| due)
}

/// The model's masked loss and accuracy on the held-out sequences (drawn
/// from `seed + 1`, never trained on).
pub fn evaluate(model: &Gpt, config: &TrainConfig) -> Evaluation {
    let held_out = TokenTask::standard(config.seed as i64 + 1, config.eval_sequences as i64);
    let (mut loss, mut accuracy) = (0.0, 0.0);
    tch::no_grad(|| {
        for start in (0..held_out.len()).step_by(500) {
            let len = (held_out.len() - start).min(500);
            let (inputs, targets, mask) = on_device(held_out.batch(start, len), config.device);
            let logits = tch::nn::Module::forward(model, &inputs); // [len, seq, vocab]
                                                                   // Every sequence has the same number of scored positions: weigh chunks by length.
            loss += masked_cross_entropy(&logits, &targets, &mask).double_value(&[]) * len as f64;
            accuracy += masked_accuracy(&logits, &targets, &mask) * len as f64;
        }
    });
    let n = held_out.len() as f64;
    Evaluation { loss: loss / n, accuracy: accuracy / n }
}
