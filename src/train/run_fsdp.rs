//! One rank of the training run with `--shard full`: the GPT sharded with
//! the library's FSDP (`ddp::FullyShard`, each transformer block a unit,
//! PyTorch's `fully_shard` with `FULL_SHARD`) and AdamW on the shards
//! (`ddp::FsdpAdamW`). The data, the learning rate, the logging and the
//! outcome are the plain run's (`run.rs`); what differs is that no rank
//! holds the whole model: a checkpoint is sharded (`checkpoint/sharded.rs`),
//! and the final state is gathered once, to report and fingerprint it.

use std::time::Duration;

use tch::Tensor;

use super::agreement::{check_replicas_agree, check_settings_agree};
use super::checkpoint::sharded::{self, ShardOf};
use super::checkpoint::{self, Checkpoint, CheckpointError, LoopPosition};
use super::config::TrainConfig;
use super::outcome::{Event, RankOutcome};
use super::phases::{Phase, PhaseClock};
use super::run::{build_model, checkpoint_due, evaluate, lr_at, micro_batch, ShardCursor};
use super::step_log::StepLog;
use crate::check::snapshot;
use crate::data::{masked_cross_entropy, TokenTask};
use crate::ddp::{shard_rows, DistributedSampler, FsdpAdamW, FsdpOptions, FullyShard, Named, SamplerOptions};
use crate::dist::{Group, ReduceOp};
use crate::models::{named_buffers, named_parameters};

/// One rank's whole run under `ShardingStrategy::FullShard`.
pub(super) fn train_rank_fsdp(
    pg: Group,
    config: &TrainConfig,
    on_event: &(dyn Fn(Event) + Sync),
) -> anyhow::Result<RankOutcome> {
    let (rank, world_size) = (pg.rank(), pg.world_size());
    check_settings_agree(pg.as_ref(), &config.settings())?;
    let task = TokenTask::standard(config.seed as i64, config.train_sequences as i64);
    let (vs, gpt) = build_model(config, &task);
    let mut progress = LoopPosition { step: 0, epoch: 0, position: 0 };
    let mut saved = None;
    if let (Some(path), true) = (&config.checkpoint, config.resume) {
        // Rank 0 reads and checks the layout file; the others receive it.
        // Every rank then reads the shard files (a file system the ranks
        // share, as torch.distributed.checkpoint needs) and puts the whole
        // state back together, which it shards below for this world size.
        let layout = super::resume::load_on_rank0(pg.as_ref(), path, config)?;
        if !sharded::is_sharded(&layout) {
            let detail = "it is a whole checkpoint, not the sharded one --shard full writes".to_string();
            return Err(CheckpointError::Invalid { path: path.clone(), detail }.into());
        }
        let whole = sharded::consolidate(path, &layout)?;
        whole.restore_model(path, &named_parameters(&vs))?;
        whole.restore_model(path, &named_buffers(&vs))?;
        progress = config.resumed_position(&whole, path)?;
        saved = Some((path.clone(), whole));
    }
    let full_shapes: Vec<(String, Vec<i64>)> =
        named_parameters(&vs).iter().map(|(name, p)| (name.clone(), p.size())).collect();
    let fsdp = FullyShard::gpt(&gpt, &vs, pg.clone(), FsdpOptions::default())?;
    let mut adamw = FsdpAdamW::new(&fsdp, config.lr, config.weight_decay);
    if let Some((path, whole)) = &saved {
        restore_shards(&fsdp, &mut adamw, whole)
            .map_err(|detail| CheckpointError::Invalid { path: path.clone(), detail })?;
    }
    let options = SamplerOptions { seed: config.seed, ..SamplerOptions::default() };
    let sampler = DistributedSampler::sharded(pg.as_ref(), task.len(), options)?;
    let mut cursor = ShardCursor::new(sampler, progress.epoch as u64, progress.position as usize);

    let (first_step, last_step) = (progress.step as usize + 1, config.stop_after.unwrap_or(config.steps));
    if rank == 0 {
        let parameters = full_shapes.iter().map(|(_, s)| s.iter().product::<i64>()).sum();
        let buckets = fsdp.units().len(); // the units play the buckets' part
        on_event(Event::Started { first_step, last_step, parameters, buckets, config });
    }
    let mean_over_ranks = |value: f64| -> anyhow::Result<f64> {
        let mut value = Tensor::from(value);
        pg.all_reduce(&mut value, ReduceOp::Sum)?;
        Ok(value.double_value(&[]) / world_size as f64)
    };
    let tokens_per_step = (config.global_batch() as i64 * task.seq_len()) as f64;
    let k = config.accum_steps;
    let mut log = StepLog::new(config, rank, last_step, tokens_per_step, on_event);
    let clock = PhaseClock::new();
    for step in first_step..=last_step {
        // ANCHOR: fsdp_step
        let started = clock.start();
        adamw.lr = lr_at(config, step - 1);
        let mut rank_loss = 0.0;
        let mut last_micro_batch = None;
        for i in 0..k {
            let indices = cursor.next_micro_batch(config.batch_size).to_vec();
            let (inputs, targets, mask) = micro_batch(&task, &indices, config.device);
            clock.lap(Phase::Data);
            // The full gradients add up over the micro-batches; the last
            // backward reduce-scatters their sum (FSDP2's no_sync).
            fsdp.set_requires_gradient_sync(i + 1 == k);
            let logits = fsdp.forward_with(|hooks| gpt.forward_with_hooks(&inputs, hooks))?;
            let loss = masked_cross_entropy(&logits, &targets, &mask) / k as f64;
            clock.lap(Phase::Forward);
            fsdp.backward(&loss)?;
            clock.lap(Phase::Backward);
            rank_loss += loss.double_value(&[]);
            last_micro_batch = Some((logits, targets, mask));
        }
        adamw.step(&fsdp)?;
        fsdp.zero_grad();
        // ANCHOR_END: fsdp_step
        clock.lap(Phase::Optimizer);
        log.stepped(started.elapsed(), rank_loss);
        progress = cursor.after(step);
        log.report(step, adamw.lr, last_micro_batch, mean_over_ranks)?;
        if let Some(path) = checkpoint_due(config, step) {
            save_sharded(&pg, path, &fsdp, &adamw, &vs, config, progress)?;
            if rank == 0 {
                on_event(Event::Checkpointed { step, path });
            }
        }
    }
    // The whole final state, gathered once: what a plain run's checkpoint
    // would hold, so that its fingerprint compares with any other run's.
    let state = gathered_state(&pg, &fsdp, &adamw, &vs, &full_shapes, config, progress)?;
    let fingerprint =
        check_replicas_agree(pg.as_ref(), checkpoint::fingerprint(&state), progress.step as usize)?;
    let evaluation = if rank == 0 {
        let (vs_eval, gpt_eval) = build_model(config, &task);
        state.restore_model(std::path::Path::new("(the gathered state)"), &named_parameters(&vs_eval))?;
        Some(evaluate(&gpt_eval, config))
    } else {
        None
    };
    let weights = snapshot(&state.model);
    let tokens_per_second = log.tokens_per_second();
    let StepLog { losses, train_time, .. } = log;
    Ok(RankOutcome {
        rank,
        last_step,
        losses,
        weights,
        evaluation,
        train_time,
        sync_time: Duration::ZERO, // FSDP's collectives overlap on its own thread; not timed apart
        tokens_per_second,
        phases: clock.phases(),
        fingerprint,
    })
}

/// This rank's shards of every parameter and of AdamW's moments, shaped
/// `[rows, ...]` like the parameter, in `FullyShard::sharded_parameters` order.
fn own_shards(fsdp: &FullyShard, adamw: &FsdpAdamW, full_shapes: &[(String, Vec<i64>)]) -> Vec<ShardOf> {
    let state = adamw.shard_state();
    let each = fsdp.sharded_parameters().into_iter().zip(state);
    each.map(|(p, (step, m, v))| {
        let shape = &full_shapes.iter().find(|(n, _)| *n == p.name).expect("a parameter of the model").1;
        let mut local = shape.clone();
        local[0] = p.rows.1;
        let rows = |t: &Tensor| t.view(local.as_slice()).copy();
        ShardOf {
            name: p.name.clone(),
            global_shape: shape.clone(),
            rows: p.rows,
            values: rows(&p.shard),
            exp_avg: rows(&m),
            exp_avg_sq: rows(&v),
            step,
        }
    })
    .collect()
}

/// Copies a whole AdamW state (a consolidated checkpoint's) into this
/// rank's moments: its rows of each. The parameters came in through the
/// model, before it was sharded.
fn restore_shards(fsdp: &FullyShard, adamw: &mut FsdpAdamW, whole: &Checkpoint) -> Result<(), String> {
    let find = |key: &str| {
        whole
            .optimizer
            .iter()
            .find(|(n, _)| n == key)
            .map(|(_, t)| t)
            .ok_or(format!("no optimizer entry `{key}`"))
    };
    let mut steps = vec![];
    for (p, (_, m, v)) in fsdp.sharded_parameters().into_iter().zip(adamw.shard_state()) {
        let (start, len) = p.rows;
        for (moment, key) in [(m, "exp_avg"), (v, "exp_avg_sq")] {
            let saved = find(&format!("{key}.{}", p.name))?;
            let rows = saved.narrow(0, start, len).reshape([-1]);
            if rows.size() != moment.size() || rows.kind() != moment.kind() {
                return Err(format!("`{key}.{}` does not fit the model's parameter", p.name));
            }
            tch::no_grad(|| moment.shallow_clone().copy_(&rows));
        }
        let step = find(&format!("step.{}", p.name))?;
        steps.push(step.int64_value(&[0]));
    }
    adamw.set_steps(&steps);
    Ok(())
}

/// Writes the sharded checkpoint after `progress`: every rank its shard
/// file, then, once all are on disk, rank 0 the layout that names them.
fn save_sharded(
    pg: &Group,
    path: &std::path::Path,
    fsdp: &FullyShard,
    adamw: &FsdpAdamW,
    vs: &tch::nn::VarStore,
    config: &TrainConfig,
    progress: LoopPosition,
) -> anyhow::Result<()> {
    let (rank, world_size) = (pg.rank(), pg.world_size());
    let full_shapes: Vec<(String, Vec<i64>)> =
        named_parameters(vs).iter().map(|(name, p)| (name.clone(), p.size())).collect();
    let shards = own_shards(fsdp, adamw, &full_shapes);
    let template = Checkpoint { model: vec![], optimizer: vec![], progress, settings: config.settings() };
    let mine = sharded::shard_file(&shards, &template);
    checkpoint::save(&sharded::shard_path(path, rank, world_size), &mine)?;
    // Every rank's fingerprint; the all-gather also waits for every save.
    let files: Vec<i64> = pg
        .all_gather(&Tensor::from_slice(&[checkpoint::fingerprint(&mine)]))?
        .iter()
        .map(|t| t.int64_value(&[0]))
        .collect();
    if rank == 0 {
        let all_rows: Vec<Vec<(i64, i64)>> = (0..world_size)
            .map(|r| shards.iter().map(|s| shard_rows(s.global_shape[0], world_size, r)).collect())
            .collect();
        let buffers: Vec<Named> = named_buffers(vs).into_iter().collect();
        checkpoint::save(path, &sharded::layout_file(&shards, &all_rows, &files, buffers, &template))?;
    }
    pg.barrier()?; // no rank goes on (or ends the run) before the layout is written
    Ok(())
}

/// The whole state after `progress`, on every rank, as a plain run's
/// checkpoint holds it: the full parameters and buffers, and AdamW's
/// moments and step counts by `AdamW::state`'s names. A collective.
fn gathered_state(
    pg: &Group,
    fsdp: &FullyShard,
    adamw: &FsdpAdamW,
    vs: &tch::nn::VarStore,
    full_shapes: &[(String, Vec<i64>)],
    config: &TrainConfig,
    progress: LoopPosition,
) -> anyhow::Result<Checkpoint> {
    let world_size = pg.world_size();
    let full = fsdp.full_parameters()?;
    let mut model: Vec<Named> = vec![];
    for (name, _) in full_shapes {
        let (_, t) = full.iter().find(|(n, _)| n == name).expect("every parameter is gathered");
        model.push((name.clone(), t.shallow_clone()));
    }
    model.extend(named_buffers(vs));
    let mut optimizer = vec![("step".to_string(), Tensor::from_slice(&[progress.step]))];
    for shard in own_shards(fsdp, adamw, full_shapes) {
        let rows = shard.global_shape[0];
        let chunk = shard_rows(rows, world_size, 0).1.max(1);
        let row_numel: i64 = shard.global_shape[1..].iter().product();
        for (key, moment) in [("exp_avg", &shard.exp_avg), ("exp_avg_sq", &shard.exp_avg_sq)] {
            // All-gather wants the same size everywhere: pad to a full chunk.
            let padded = Tensor::zeros([chunk * row_numel], (moment.kind(), moment.device()));
            padded.narrow(0, 0, shard.rows.1 * row_numel).copy_(&moment.reshape([-1]));
            let gathered = pg.all_gather(&padded)?;
            let pieces: Vec<Tensor> = (0..world_size)
                .map(|r| gathered[r].narrow(0, 0, shard_rows(rows, world_size, r).1 * row_numel))
                .collect();
            let whole = Tensor::cat(&pieces, 0).view(shard.global_shape.as_slice());
            optimizer.push((format!("{key}.{}", shard.name), whole));
        }
        optimizer.push((format!("step.{}", shard.name), Tensor::from_slice(&[shard.step])));
    }
    Ok(Checkpoint { model, optimizer, progress, settings: config.settings() })
}
