//! The training run with its gradients sent as bfloat16 (`TrainConfig`'s
//! `bf16_gradients`, `--grad-dtype bf16` of `examples/train.rs`: chapter
//! 12's hook in the finished run): the averaged gradient itself, against
//! one process's arithmetic, and a whole run against the f32 run.
//! Run: `cargo test --test train_bf16` (add `-- --nocapture` to see the
//! measured numbers).

mod train_runs;

use ddp_workbook::check::{max_reference_diff, same_bits};
use ddp_workbook::data::{masked_cross_entropy, TokenTask};
use ddp_workbook::dist::spawn;
use ddp_workbook::models::named_parameters;
use ddp_workbook::tch::nn::{Module, VarStore};
use ddp_workbook::tch::{self, Kind, Tensor};
use ddp_workbook::train::{build_model, wrap_model, TrainConfig};
use train_runs::run;

/// The shared small run (2 ranks, 12 steps, several buckets), gradients in f32 or bf16.
fn small_run(bf16_gradients: bool) -> TrainConfig {
    TrainConfig { bf16_gradients, ..train_runs::small_run() }
}

#[test]
fn bf16_gradients_keep_the_replicas_equal_and_the_loss_close_to_the_f32_run() {
    let (f32_run, bf16_run) = (run(&small_run(false)), run(&small_run(true)));
    // The run's own end-of-run check compared the ranks' state (src/train/agreement.rs); and again here:
    assert_eq!(max_reference_diff(&bf16_run[0].weights, &bf16_run[1].weights), 0.0, "the replicas differ");
    let moved = max_reference_diff(&bf16_run[0].weights, &f32_run[0].weights);
    println!("largest weight difference from the f32 run after 12 steps: {moved:e}");
    assert!(moved > 0.0, "the bf16 run took bitwise the f32 run's steps: the hook did not run");
    for (step, (bf16, f32)) in bf16_run[0].losses.iter().zip(&f32_run[0].losses).enumerate() {
        println!("step {}: loss {bf16:.5} with bf16 gradients, {f32:.5} with f32", step + 1);
        // Each step's gradients are within 0.8 % of the mean magnitude (chapter
        // 12's bound on 2 ranks); AdamW's steps then differ by far less than
        // the loss moves: measured, at most 4e-5 of it here.
        assert!((bf16 - f32).abs() <= 1e-3 * f32, "step {}: the loss left the f32 run's", step + 1);
    }
}

/// Every parameter's gradient, flattened and joined in registration order.
fn flat_gradients(vs: &VarStore) -> Tensor {
    let grads: Vec<Tensor> = named_parameters(vs).iter().map(|(_, p)| p.grad().reshape([-1])).collect();
    Tensor::cat(&grads, 0)
}

#[test]
fn the_runs_bf16_hook_averages_each_gradient_as_one_process_computes_it() {
    // The run's own model and wrapper (`train::build_model`, `train::wrap_model`,
    // which register the hook), one backward per rank on its own sequences.
    // Each rank also computes its own gradient on a plain copy of the model,
    // without DDP; one process then averages those as the hook must on 2
    // ranks: each halved (exact in f32), cast to bf16, the bf16 sum, back to
    // f32. The run's averaged gradient must be those bits, on every rank.
    let config = small_run(true);
    assert_eq!(config.world_size, 2, "the expected bits below are the 2-rank arithmetic");
    let rows = config.batch_size as i64;
    let per_rank = spawn(config.world_size, |pg| {
        tch::set_num_threads(1); // the run's threads_per_rank: the same kernels, the same bits
                                 // Each rank builds the task itself, as the run's ranks do.
        let task = TokenTask::standard(config.seed as i64, config.train_sequences as i64);
        let (inputs, targets, mask) = task.batch(pg.rank() as i64 * rows, rows);
        let (plain_vs, plain) = build_model(&config, &task);
        masked_cross_entropy(&plain.forward(&inputs), &targets, &mask).backward();
        let (vs, gpt) = build_model(&config, &task);
        let (ddp, _) = wrap_model(gpt, &vs, pg, &config)?;
        ddp.backward(&masked_cross_entropy(&ddp.forward(&inputs), &targets, &mask))?;
        Ok((flat_gradients(&plain_vs), flat_gradients(&vs)))
    })
    .unwrap_or_else(|e| panic!("a rank failed: {e}"));
    let own: Vec<&Tensor> = per_rank.iter().map(|(own, _)| own).collect();
    let expected = (own[0] / 2.0).to_kind(Kind::BFloat16) + (own[1] / 2.0).to_kind(Kind::BFloat16);
    let expected = expected.to_kind(Kind::Float);
    let mean = (own[0].to_kind(Kind::Double) + own[1].to_kind(Kind::Double)) / 2.0;
    for (rank, (_, synced)) in per_rank.iter().enumerate() {
        let ratio = (synced.to_kind(Kind::Double) / &mean).nan_to_num(1.0, 1.0, 1.0);
        let median_ratio = ratio.median().double_value(&[]);
        println!("rank {rank}: the averaged gradient's median ratio to the exact mean: {median_ratio:.4}");
        assert!(
            same_bits(synced, &expected),
            "rank {rank}: the run's averaged gradient is not the bf16 average of the ranks' own gradients \
             (halved, cast to bf16, summed in bf16): {} of {} elements differ, the median ratio to the exact \
             mean is {median_ratio:.4} (2: the sum, not divided by the world size; look at how the run \
             registers its hook, train::wrap_model)",
            synced.ne_tensor(&expected).sum(Kind::Int64).int64_value(&[]),
            synced.numel()
        );
    }
}
