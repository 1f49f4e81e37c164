//! One rank of the training run with `--shard grad-op`: the GPT wrapped in
//! the library's `ddp::ShardGradOp` (ZeRO-2, FSDP's `SHARD_GRAD_OP`): every
//! rank holds the whole model, each bucket's gradients are reduce-scattered
//! during backward, and AdamW steps this rank's shard of each bucket, then
//! all-gathers the parameters. The data, schedule, logging and checkpoints
//! are the plain run's (`run.rs`): the replicas stay whole, so rank 0 writes
//! the whole checkpoint, with the moments gathered as under ZeRO-1.

use std::time::Duration;

use super::agreement::check_settings_agree;
use super::checkpoint::{self, CheckpointError, LoopPosition};
use super::config::TrainConfig;
use super::outcome::{Event, RankOutcome};
use super::phases::{Phase, PhaseClock};
use super::run::{
    agreed_state, build_model, checkpoint_due, evaluate, lr_at, micro_batch, model_tensors, ShardCursor,
};
use super::step_log::StepLog;
use crate::check::snapshot;
use crate::data::{masked_cross_entropy, TokenTask};
use crate::ddp::{DistributedSampler, SamplerOptions, ShardGradOp};
use crate::dist::Group;
use crate::models::{named_buffers, named_parameters, Gpt};

/// One rank's whole run under `ShardingStrategy::ShardGradOp`.
pub(super) fn train_rank_grad_op(
    pg: Group,
    config: &TrainConfig,
    on_event: &(dyn Fn(Event) + Sync),
) -> anyhow::Result<RankOutcome> {
    let rank = pg.rank();
    check_settings_agree(pg.as_ref(), &config.settings())?;
    let task = TokenTask::standard(config.seed as i64, config.train_sequences as i64);
    let (vs, gpt) = build_model(config, &task);
    let saved = match (&config.checkpoint, config.resume) {
        (Some(path), true) => Some((path, super::resume::load_on_rank0(pg.as_ref(), path, config)?)),
        _ => None,
    };
    if let Some((path, saved)) = &saved {
        saved.restore_model(path, &named_parameters(&vs))?;
        saved.restore_model(path, &named_buffers(&vs))?;
    }
    // The buckets of the plain run's wrapper: the same caps.
    let mut model: ShardGradOp<Gpt> =
        ShardGradOp::new(gpt, &vs, pg.clone(), config.bucket_caps(), config.lr, config.weight_decay)?;
    let mut progress = LoopPosition { step: 0, epoch: 0, position: 0 };
    if let Some((path, saved)) = &saved {
        let invalid = |detail: String| CheckpointError::Invalid { path: path.to_path_buf(), detail };
        model.load_state(&saved.optimizer).map_err(|e| invalid(e.to_string()))?;
        progress = saved.progress;
    }
    let options = SamplerOptions { seed: config.seed, ..SamplerOptions::default() };
    let sampler = DistributedSampler::sharded(pg.as_ref(), task.len(), options)?;
    let mut cursor = ShardCursor::new(sampler, progress.epoch as u64, progress.position as usize);

    let (first_step, last_step) = (progress.step as usize + 1, config.stop_after.unwrap_or(config.steps));
    if rank == 0 {
        let parameters = model.parameters().iter().map(|(_, p)| p.numel() as i64).sum();
        let buckets = model.layout().len();
        on_event(Event::Started { first_step, last_step, parameters, buckets, config });
    }
    let tokens_per_step = (config.global_batch() as i64 * task.seq_len()) as f64;
    let k = config.accum_steps;
    let mut log = StepLog::new(config, rank, last_step, tokens_per_step, on_event);
    let clock = PhaseClock::new();
    let mut fingerprint = None;
    for step in first_step..=last_step {
        let started = clock.start();
        model.set_lr(lr_at(config, step - 1));
        let mut rank_loss = 0.0;
        let mut last_micro_batch = None;
        for i in 0..k {
            let indices = cursor.next_micro_batch(config.batch_size).to_vec();
            let (inputs, targets, mask) = micro_batch(&task, &indices, config.device);
            clock.lap(Phase::Data);
            let logits = model.forward(&inputs);
            let loss = masked_cross_entropy(&logits, &targets, &mask) / k as f64;
            clock.lap(Phase::Forward);
            if i + 1 < k {
                let _no_sync = model.no_sync(); // add to the full gradients, send nothing
                model.backward(&loss)?;
            } else {
                model.backward(&loss)?; // reduce-scatter each bucket as it is ready
            }
            clock.lap(Phase::Backward);
            rank_loss += loss.double_value(&[]);
            last_micro_batch = Some((logits, targets, mask));
        }
        model.step()?;
        model.zero_grad()?;
        clock.lap(Phase::Optimizer);
        log.stepped(started.elapsed(), rank_loss);
        progress = cursor.after(step);
        log.report(step, model.lr(), last_micro_batch, |v| Ok(model.mean_over_ranks(v)?))?;
        let due = checkpoint_due(config, step);
        if due.is_some() || step == last_step {
            // Compare, then save, as the plain run does.
            let (state, agreed) = agreed_state(&pg, &vs, model.gathered_state()?, config, progress)?;
            fingerprint = Some(agreed);
            if let (Some(path), 0) = (due, rank) {
                checkpoint::save(path, &state)?;
                on_event(Event::Checkpointed { step, path });
            }
        }
    }
    let fingerprint = match fingerprint {
        Some(agreed) => agreed,
        None => agreed_state(&pg, &vs, model.gathered_state()?, config, progress)?.1,
    };
    let evaluation = (rank == 0).then(|| evaluate(model.module(), config));
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
        sync_time: Duration::ZERO, // the reduce-scatters overlap backward; not timed apart
        tokens_per_second,
        phases: clock.phases(),
        fingerprint,
    })
}
