//! The training run with its gradients sent as bfloat16 (`TrainConfig`'s
//! `bf16_gradients`, `--grad-dtype bf16` of `examples/train.rs`: chapter
//! 12's hook in the finished run). Run: `cargo test --test train_bf16`
//! (add `-- --nocapture` to see the measured numbers).

mod train_runs;

use ddp_workbook::check::max_reference_diff;
use ddp_workbook::train::TrainConfig;
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
