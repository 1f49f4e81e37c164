//! The training run with `--shard full` (`TrainConfig`'s
//! `shard: ShardingStrategy::FullShard`: the library's FSDP in the finished
//! run): it ends where the plain run ends, and its sharded checkpoint
//! resumes on another world size bit for bit, checked against one process
//! that computes the same steps; bad sharded checkpoints are refused in words.
//! Run: `cargo test --test train_fsdp` (add `-- --nocapture` for the numbers).

mod train_runs;

use std::path::Path;
use std::sync::Mutex;

use ddp_workbook::check::max_reference_diff;
use ddp_workbook::data::{masked_cross_entropy, TokenTask};
use ddp_workbook::ddp::{divide_factors, rows, DistributedSampler, SamplerOptions};
use ddp_workbook::models::{named_buffers, named_parameters};
use ddp_workbook::tch::nn::Module;
use ddp_workbook::tch::{self, Tensor};
use ddp_workbook::train::checkpoint::{self, sharded};
use ddp_workbook::train::{
    self, build_model, lr_at, AdamW, ConfigError, Event, ShardingStrategy, TrainConfig,
};
use train_runs::{run, scratch};

/// The shared small run under FSDP on `world_size` ranks.
fn small_run(world_size: usize) -> TrainConfig {
    TrainConfig { world_size, shard: ShardingStrategy::FullShard, ..train_runs::small_run() }
}

#[test]
fn every_strategy_logs_the_mean_of_the_ranks_losses_at_the_same_steps() {
    // 12 steps, a log line every 4: steps 4, 8 and 12, once each (rank 0
    // alone reports), each the mean of the ranks' own losses of that step,
    // which every rank's outcome holds.
    for shard in [ShardingStrategy::NoShard, ShardingStrategy::ShardGradOp, ShardingStrategy::FullShard] {
        let config = TrainConfig { shard, ..small_run(2) };
        let (logged, stepped) = (Mutex::new(vec![]), Mutex::new(vec![]));
        let outcomes = train::train(&config, &|event| match event {
            Event::Logged { step, loss, .. } => logged.lock().unwrap().push((step, loss)),
            Event::Stepped { step } => stepped.lock().unwrap().push(step),
            _ => {}
        })
        .unwrap_or_else(|e| panic!("the {shard:?} run failed: {e:#}"));
        let stepped = stepped.into_inner().unwrap();
        assert_eq!(stepped, (1..=12).collect::<Vec<_>>(), "{shard:?}: every step reported once");
        let logged = logged.into_inner().unwrap();
        let steps: Vec<usize> = logged.iter().map(|&(step, _)| step).collect();
        assert_eq!(steps, [4, 8, 12], "{shard:?}: a log line every 4 steps and at the last");
        for (step, loss) in logged {
            let mean = outcomes.iter().map(|o| o.losses[step - 1]).sum::<f64>() / outcomes.len() as f64;
            assert!((loss - mean).abs() < 1e-12, "{shard:?} step {step}: logged {loss}, ranks' mean {mean}");
        }
    }
}

#[test]
fn a_full_shard_run_on_2_ranks_ends_bitwise_where_the_plain_run_ends() {
    let plain = run(&TrainConfig { shard: ShardingStrategy::NoShard, ..small_run(2) });
    let fsdp = run(&small_run(2));
    let gap = max_reference_diff(&fsdp[0].weights, &plain[0].weights);
    println!("2 ranks: FSDP's largest weight difference from the plain run after 12 steps: {gap:e}");
    // On 2 ranks FSDP divides each gradient by 2 before the sum, DDP after
    // it: the same bits (halving is exact); AdamW is elementwise in both.
    assert_eq!(gap, 0.0, "FSDP left the plain run's weights");
    assert_eq!(fsdp[0].losses, plain[0].losses, "the losses differ");
    // The whole final state, the gathered moments and step counts too.
    assert_eq!(fsdp[0].fingerprint, plain[0].fingerprint, "the final state differs");
}

/// A run whose global batch (12 sequences per step) splits on 2 ranks
/// (batch 3) and on 3 (batch 2), over 72 sequences, which neither pads: 6
/// steps an epoch, 8 steps.
fn reshard_run(world_size: usize) -> TrainConfig {
    TrainConfig { batch_size: 6 / world_size, train_sequences: 72, steps: 8, ..small_run(world_size) }
}

/// One process computing what FSDP computes, with the world size of each
/// step from `worlds` (steps 1, 2, ...): the global batch cut into each
/// rank's micro-batches as its sampler cuts it, each rank's gradient on the
/// whole model, averaged as FSDP averages (each divided by `pre` in rank
/// order, summed, divided by `post`), then AdamW. Returns the parameters.
fn one_process(worlds: &[usize]) -> Vec<(String, Tensor)> {
    tch::set_num_threads(1);
    let base = reshard_run(2);
    let task = TokenTask::standard(base.seed as i64, base.train_sequences as i64);
    let (vs, gpt) = build_model(&base, &task);
    let params = named_parameters(&vs);
    let mut adamw = AdamW::new(&params, base.lr, base.weight_decay);
    let (mut epoch, mut taken) = (0u64, 0usize); // where the epoch's order stands
    for (step, &world) in worlds.iter().enumerate() {
        let config = reshard_run(world);
        let (b, k) = (config.batch_size, config.accum_steps);
        let shards_at = |epoch: u64| -> Vec<Vec<i64>> {
            let options = SamplerOptions { seed: config.seed, ..SamplerOptions::default() };
            let each = (0..world).map(|r| {
                let mut sampler = DistributedSampler::with_options(task.len(), world, r, options).unwrap();
                sampler.set_epoch(epoch);
                sampler.indices()
            });
            each.collect()
        };
        let mut micro_batches = vec![vec![]; world]; // per rank, k lists of indices
        for _ in 0..k {
            if taken / world + b > shards_at(epoch)[0].len() {
                (epoch, taken) = (epoch + 1, 0); // every rank's cursor skips the short tail
            }
            for (r, shard) in shards_at(epoch).iter().enumerate() {
                micro_batches[r].push(shard[taken / world..taken / world + b].to_vec());
            }
            taken += b * world; // rank r's position p is the epoch order's p x world
        }
        let (pre, post) = divide_factors(world);
        let mut averaged: Vec<Option<Tensor>> = params.iter().map(|_| None).collect();
        for batches in &micro_batches {
            adamw.zero_grad();
            for indices in batches {
                let picked = TokenTask { sequences: rows(&task.sequences, indices), ..task };
                let (inputs, targets, mask) = picked.batch(0, indices.len() as i64);
                let loss = masked_cross_entropy(&gpt.forward(&inputs), &targets, &mask) / k as f64;
                loss.backward();
            }
            for ((_, p), sum) in params.iter().zip(&mut averaged) {
                let part = p.grad().divide_scalar(pre);
                *sum = Some(match sum.take() {
                    None => part,
                    Some(sum) => sum + part,
                });
            }
        }
        for ((_, p), sum) in params.iter().zip(averaged) {
            let sum = sum.expect("every rank adds");
            let sum = if post != 1.0 { sum.divide_scalar(post) } else { sum };
            tch::no_grad(|| p.grad().copy_(&sum));
        }
        adamw.lr = lr_at(&config, step);
        adamw.step().expect("AdamW steps");
    }
    named_parameters(&vs).into_iter().chain(named_buffers(&vs)).collect()
}

/// Trains `reshard_run(from)` to step 4 with a sharded checkpoint, then
/// resumes it on `to` ranks to step 8; returns rank 0's outcome.
fn stop_and_resume(dir: &Path, from: usize, to: usize) -> train::RankOutcome {
    let path = dir.join(format!("fsdp-{from}-{to}.ckpt"));
    let first = TrainConfig { checkpoint: Some(path.clone()), stop_after: Some(4), ..reshard_run(from) };
    assert_eq!(run(&first)[0].last_step, 4);
    assert!(sharded::shard_path(&path, from - 1, from).is_file(), "no shard file of the last rank");
    let rest = TrainConfig { checkpoint: Some(path), resume: true, ..reshard_run(to) };
    run(&rest).remove(0)
}

#[test]
fn the_sharded_checkpoint_resumes_on_another_world_size_bit_for_bit() {
    let dir = scratch("train-fsdp-reshard");
    // Same world size: the uninterrupted run is the comparison.
    let whole = run(&reshard_run(2));
    let resumed = stop_and_resume(&dir, 2, 2);
    assert_eq!(max_reference_diff(&resumed.weights, &whole[0].weights), 0.0, "2 -> 2 left the whole run");
    assert_eq!(resumed.fingerprint, whole[0].fingerprint, "2 -> 2: the final state differs");
    // Another world size: no run on one world size takes these steps (2
    // ranks average a gradient in other roundings than 3), so the
    // comparison is one process taking each step as its world size does:
    // steps 1-4 as 2 ranks, 5-8 as 3 (and back), on the same global batches.
    for (from, to) in [(2, 3), (3, 2)] {
        let reference = one_process(&[[from; 4], [to; 4]].concat());
        let resumed = stop_and_resume(&dir, from, to);
        let gap = max_reference_diff(&resumed.weights, &reference);
        println!("{from} -> {to} ranks at step 4: {gap:e} from one process taking the same steps");
        assert_eq!(gap, 0.0, "{from} -> {to}: the resumed run left one process");
        // Control: the uninterrupted run on `to` ranks is elsewhere, so the
        // world size of steps 1-4 matters and the comparison can tell.
        let other = one_process(&[to; 8]);
        assert!(max_reference_diff(&other, &reference) > 0.0, "the world size changed nothing");
    }
    // And one process with the uninterrupted 2-rank run's world sizes is
    // that run: the emulation is exact.
    assert_eq!(max_reference_diff(&whole[0].weights, &one_process(&[2; 8])), 0.0, "one process left FSDP");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_sharded_checkpoint_or_another_strategy_is_refused_in_words() {
    let dir = scratch("train-fsdp-bad");
    let path = dir.join("fsdp.ckpt");
    let first = TrainConfig { checkpoint: Some(path.clone()), stop_after: Some(4), ..reshard_run(2) };
    let resume = |config: TrainConfig| {
        let config = TrainConfig { checkpoint: Some(path.clone()), resume: true, ..config };
        format!("{:#}", train::train(&config, &|_| {}).map(|_| ()).expect_err("the resume must be refused"))
    };
    run(&first);
    // On a GPU: refused before any rank starts (FSDP frees storage on the CPU only).
    let on_gpu = TrainConfig { device: tch::Device::Cuda(0), ..reshard_run(2) };
    assert!(matches!(on_gpu.validate(), Err(ConfigError::FullShardOnGpu)), "--shard full on a GPU");
    // Another strategy: refused by the settings check, naming it.
    let plain = resume(TrainConfig { shard: ShardingStrategy::NoShard, ..reshard_run(2) });
    assert!(plain.contains("shard: checkpoint full, this run none"), "{plain}");
    // Another global batch on 3 ranks: refused, saying what keeps it.
    let bigger = resume(TrainConfig { batch_size: 3, ..reshard_run(3) });
    assert!(bigger.contains("global batch: checkpoint 12") && bigger.contains("--batch-size 2"), "{bigger}");
    // A missing shard file.
    let shard_1 = sharded::shard_path(&path, 1, 2);
    std::fs::rename(&shard_1, dir.join("moved")).unwrap();
    let missing = resume(reshard_run(3));
    assert!(missing.contains("the shard file of rank 1") && missing.contains("is missing"), "{missing}");
    std::fs::rename(dir.join("moved"), &shard_1).unwrap();
    // A layout of another model: a parameter's global shape changed.
    let mut layout = checkpoint::load(&path).unwrap();
    let key = layout.optimizer.iter().position(|(n, _)| n.starts_with("shards.shape.")).unwrap();
    let name = layout.optimizer[key].0["shards.shape.".len()..].to_string();
    let mut shape: Vec<i64> = Vec::try_from(&layout.optimizer[key].1).unwrap();
    *shape.last_mut().unwrap() += 1; // another model: a wider parameter
    layout.optimizer[key].1 = Tensor::from_slice(&shape);
    checkpoint::save(&path, &layout).unwrap();
    let other_model = resume(reshard_run(2));
    assert!(
        other_model.contains(&name) && other_model.contains("is not a usable checkpoint"),
        "{other_model}"
    );
    // A shard file of another save.
    run(&first); // a fresh, whole set
                 // Whose weights load into a bare model, put back together: those one
                 // process reaches in the same 4 steps.
    let (vs, _) = build_model(&reshard_run(2), &TokenTask::standard(1337, 72));
    checkpoint::load_model_weights(&vs, &path).expect("the sharded checkpoint's weights load");
    let loaded =
        max_reference_diff(&named_parameters(&vs), &one_process(&[2; 4])[..named_parameters(&vs).len()]);
    assert_eq!(loaded, 0.0, "the weights put back together are not those of step 4");
    let older = dir.join("older.ckpt");
    run(&TrainConfig { checkpoint: Some(older.clone()), stop_after: Some(2), ..reshard_run(2) });
    std::fs::copy(sharded::shard_path(&older, 0, 2), sharded::shard_path(&path, 0, 2)).unwrap();
    let mixed = resume(reshard_run(2));
    assert!(mixed.contains("belongs to another save (step 2"), "{mixed}");
    let _ = std::fs::remove_dir_all(&dir);
}
