//! What examples/train.rs prints: rank
//! 0's reports while the run goes (a progress bar with log lines above it)
//! and, at the end, the speed, the gradient sync's share of the step time,
//! the replicas' agreement and the verdict that sets the exit status.
//! Included by train.rs (`cargo run --release --example train`).

use std::process::ExitCode;

use ddp_workbook::train::{Event, RankOutcome, ShardingStrategy, TrainConfig};
use indicatif::ProgressBar;

// ANCHOR: on_event
/// Rank 0's reports, drawn as a progress bar with log lines above it.
pub fn report(bar: &ProgressBar, event: Event) {
    match event {
        Event::Started { first_step, last_step, parameters, buckets, config } => {
            bar.set_length(last_step as u64);
            bar.set_position(first_step as u64 - 1);
            bar.suspend(|| {
                // Under FSDP the units take the buckets' place.
                let groups = if config.shard == ShardingStrategy::FullShard { "FSDP unit(s)" } else { "bucket(s)" };
                println!(
                    "tiny GPT, {parameters} parameters in {buckets} {groups}; {} rank(s) x {} sequences x {} \
                     micro-batch(es) = global batch {}; libtorch threads per rank: {}",
                    config.world_size, config.batch_size, config.accum_steps, config.global_batch(),
                    config.threads_per_rank.map_or("default".to_string(), |t| t.to_string())
                );
                match config.shard {
                    ShardingStrategy::Optimizer => {
                        println!("ZeRO-1: AdamW's moments sharded over the {} rank(s)", config.world_size)
                    }
                    ShardingStrategy::ShardGradOp => println!(
                        "ZeRO-2 (SHARD_GRAD_OP): gradients and AdamW's moments sharded over the {} rank(s)",
                        config.world_size
                    ),
                    ShardingStrategy::FullShard => println!(
                        "FSDP (FULL_SHARD): parameters, gradients and AdamW's moments sharded over the {} \
                         rank(s), each transformer block a unit",
                        config.world_size
                    ),
                    _ => {}
                }
                if first_step > 1 {
                    println!("resuming after step {} from the checkpoint", first_step - 1);
                }
            });
        }
        Event::Stepped { step } => bar.set_position(step as u64),
        Event::Logged { step, loss, accuracy, lr, tokens_per_second } => bar.suspend(|| {
            println!("step {step:>5} | loss {loss:.4} | accuracy {accuracy:.3} | lr {lr:.2e} | {tokens_per_second:>7.0} tokens/s")
        }),
        Event::Checkpointed { step, path } => bar.set_message(format!("checkpoint at step {step}: {}", path.display())),
    }
}
// ANCHOR_END: on_event

// ANCHOR: summary
/// The final lines: speed, communication share, the replicas' agreement, and the verdict.
pub fn summarise(config: &TrainConfig, outcomes: &[RankOutcome], wall_seconds: f64, target: f64) -> ExitCode {
    let rank0 = &outcomes[0];
    let sync_shares: Vec<String> = outcomes
        .iter()
        .map(|o| format!("{:.1}%", 100.0 * o.sync_time.as_secs_f64() / o.train_time.as_secs_f64().max(1e-9)))
        .collect();
    // Under MPI this process knows its own share only: rank 0's.
    let ranks = if outcomes.len() > 1 { format!("ranks 0..{}", outcomes.len()) } else { "rank 0".into() };
    let sync = match config.shard {
        ShardingStrategy::NoShard => {
            format!("gradient sync took {} of the step time ({ranks})", sync_shares.join(", "))
        }
        // The wrapper sent nothing: the optimizer's step reduce-scatters.
        ShardingStrategy::Optimizer => {
            "gradients reduce-scattered inside the optimizer's step (ZeRO-1, not timed apart)".into()
        }
        ShardingStrategy::ShardGradOp => {
            "gradients reduce-scattered bucket by bucket during backward (ZeRO-2, not timed apart)".into()
        }
        ShardingStrategy::FullShard => {
            "gradients reduce-scattered in backward on FSDP's communication thread (not timed apart)".into()
        }
    };
    println!(
        "{} steps in {wall_seconds:.1} s ({:.1} s in training steps) on {} rank(s): {:.0} tokens/s; {sync}",
        rank0.losses.len(),
        rank0.train_time.as_secs_f64(),
        config.world_size,
        rank0.tokens_per_second,
    );
    // The run compared every rank's final state before it returned (it fails otherwise).
    if config.shard == ShardingStrategy::FullShard {
        // No rank holds a replica: the state is gathered from the shards.
        println!(
            "shards gathered: fingerprint {:#018x} (of the final state: weights, optimizer state, \
             progress; the same on all {} rank(s))",
            rank0.fingerprint, config.world_size
        );
    } else {
        println!(
            "replicas: bitwise equal on all {} rank(s), fingerprint {:#018x} (of the final state: weights, \
             optimizer state, progress)",
            config.world_size, rank0.fingerprint
        );
    }
    let eval = rank0.evaluation.expect("rank 0 evaluates");
    if rank0.last_step < config.steps {
        println!(
            "stopped after step {} of {} as asked (held-out accuracy {:.3} so far); continue with --resume",
            rank0.last_step, config.steps, eval.accuracy
        );
        return ExitCode::SUCCESS;
    }
    let verdict = if eval.accuracy >= target { "PASS: reached" } else { "FAIL: missed" };
    println!(
        "{verdict} held-out accuracy {:.4} {} target {target} in {} steps (held-out loss {:.4})",
        eval.accuracy,
        if eval.accuracy >= target { ">=" } else { "<" },
        config.steps,
        eval.loss
    );
    if eval.accuracy >= target {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
// ANCHOR_END: summary
