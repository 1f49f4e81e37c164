//! Chapter 03 tests: averaging gradients. N ranks, each training on its own
//! B/N rows of every global batch of B rows, must stay bitwise identical and
//! take the same steps as one process training on all B rows.
//!
//! Your code:           `cargo test --test chapter_03`
//! The reference code:  `cargo test --features solutions --test chapter_03`
//! See the measured differences: add `-- --nocapture`
//!
//! Why averaging is exact. Each rank's loss is a MEAN over its own rows:
//!     L_r = (1/b) * sum of l_i over the b = B/N rows i of rank r.
//! The global-batch loss is the mean over all B rows, and because every
//! rank has the same number of rows it is the mean of the per-rank means:
//!     L = (1/B) * sum over all i of l_i = (1/N) * (L_0 + L_1 + ... + L_{N-1}).
//! Gradients are linear, so grad L = (1/N) * (grad L_0 + ... + grad L_{N-1}):
//! all-reduce the per-rank gradients with SUM, divide by N, and every rank
//! holds exactly the gradient one process would compute on all B rows. Only
//! the order of the floating-point additions differs, hence a tiny tolerance.
//! (With unequal shards, the mean of the means would weigh the rows of a
//! small shard more: this is why every rank gets B/N rows.)

mod common;
// The control, which never runs your code, and the mean in half precision.
// `#[path]`, because a module file directly in `tests/` would be built as a
// test binary of its own.
#[path = "chapter_03/controls.rs"]
mod controls;
#[path = "chapter_03/half_precision.rs"]
mod half_precision;

use common::{
    assert_matches_one_process, global_batches, mse, run, train_single_process, Hints, Named, Optim,
};
use common::{mlp_with_an_unused_parameter, TOLERANCE};
use ddp_workbook::ch03_averaging::{train_step, LocalBackward, SimpleDistributedDataParallelism};
use ddp_workbook::check::snapshot;
use ddp_workbook::data::Regression;
use ddp_workbook::models::Mlp;
use ddp_workbook::tch::nn::VarStore;
use ddp_workbook::tch::Kind;

const SIZES: &[i64] = &[4, 16, 1];
const MODEL_SEED: i64 = 3;
const DATA_SEED: i64 = 4;
/// Rows of one global batch: divisible by every world size we test (1, 2, 3).
const GLOBAL_BATCH: i64 = 12;
const STEPS: usize = 5;

/// The model of most tests.
fn mlp() -> (VarStore, Mlp) {
    Mlp::seeded(MODEL_SEED, SIZES, Kind::Double)
}

/// The same model plus one trainable parameter that no loss ever uses.
fn mlp_with_unused() -> (VarStore, Mlp) {
    mlp_with_an_unused_parameter(MODEL_SEED, SIZES)
}

fn data() -> Regression {
    Regression::new(DATA_SEED, GLOBAL_BATCH * STEPS as i64, 4, 1, Kind::Double)
}

/// What to try when a run differs: from the other ranks, from one process.
const HINTS: Hints = Hints {
    replicas: "every rank must call sync_gradients after backward and before optimizer.step, \
               and all-reduce every gradient (not the weights) with the same operation, in the \
               tensor `param.grad()` returns: the optimizer never sees an all-reduced copy",
    reference: "the summed gradient must be divided by the world size exactly once \
                (did you divide by the world size? divide twice? all-reduce the weights?)",
};

/// One rank's record of a run.
struct RankRun {
    /// Every parameter after each `optimizer.step()`.
    after_each_step: Vec<Named>,
    /// How many all-reduces each step made, how many collectives of any
    /// kind, and how many parameters had a gradient to send.
    all_reduces: Vec<u64>,
    collectives: Vec<u64>,
    with_gradient: Vec<u64>,
}

/// Trains on `world_size` ranks for STEPS steps, each rank on its own B/N
/// rows of every global batch; `sync: false` leaves out `sync_gradients`
/// (the negative control).
fn train_ddp(world_size: i64, optim: Optim, sync: bool, build: fn() -> (VarStore, Mlp)) -> Vec<RankRun> {
    run(world_size as usize, |pg| {
        let (rank, data) = (pg.rank() as i64, data());
        let (vs, model) = build();
        let mut optimizer = optim.build(&vs)?;
        let ddp = SimpleDistributedDataParallelism::new(model, &vs, pg)?;
        let mut run = RankRun {
            after_each_step: vec![],
            all_reduces: vec![],
            collectives: vec![],
            with_gradient: vec![],
        };
        for step in 0..STEPS as i64 {
            let before = ddp.stats();
            let rows = GLOBAL_BATCH / world_size; // every rank gets as many rows
            let (x, y) = data.batch(step * GLOBAL_BATCH + rank * rows, rows); // its own slice
            if sync {
                train_step(&ddp, &mut optimizer, &x, &y, mse)?;
            } else {
                optimizer.zero_grad();
                ddp.backward_local(&mse(&ddp.forward(&x), &y))?;
                optimizer.step(); // each rank with its own gradient
            }
            let after = ddp.stats();
            run.all_reduces.push(after.all_reduce - before.all_reduce);
            run.collectives.push(after.collectives() - before.collectives());
            run.with_gradient
                .push(ddp.parameters().iter().filter(|(_, p)| p.grad().defined()).count() as u64);
            run.after_each_step.push(snapshot(ddp.parameters()));
        }
        Ok(run)
    })
}

/// After every step: all ranks hold bitwise the same parameters, and they
/// equal one process's within TOLERANCE. Returns the largest difference from
/// the single-process run.
fn check_against_one_process(world_size: i64, optim: Optim, build: fn() -> (VarStore, Mlp)) -> f64 {
    let runs = train_ddp(world_size, optim, true, build);
    let reference = train_single_process(build, optim, &global_batches(&data(), GLOBAL_BATCH, STEPS));
    let per_rank: Vec<Vec<Named>> = runs.into_iter().map(|run| run.after_each_step).collect();
    let case = format!("{optim:?} on {world_size} ranks");
    let largest = assert_matches_one_process(&case, &per_rank, &reference, TOLERANCE, &HINTS);
    println!("{case}: largest difference from one process over {STEPS} steps: {largest:e}");
    largest
}

#[test]
fn one_rank_is_exactly_one_process() {
    for optim in [Optim::Sgd, Optim::Adam] {
        let diff = check_against_one_process(1, optim, mlp);
        assert_eq!(diff, 0.0, "{optim:?}: on one rank, sync_gradients must leave the gradient as it is (sum of one, divided by 1)");
    }
}

#[test]
fn sgd_on_2_and_3_ranks_equals_one_process_on_the_global_batch() {
    for world_size in [2, 3] {
        check_against_one_process(world_size, Optim::Sgd, mlp);
    }
}

#[test]
fn adam_on_2_and_3_ranks_equals_one_process_on_the_global_batch() {
    for world_size in [2, 3] {
        check_against_one_process(world_size, Optim::Adam, mlp);
    }
}

#[test]
fn parameters_without_a_gradient_are_skipped() {
    let runs = train_ddp(2, Optim::Sgd, true, mlp_with_unused);
    for (rank, run) in runs.iter().enumerate() {
        // 2 layers of weight and bias have gradients; `unused` has none.
        assert_eq!(run.with_gradient, vec![4; STEPS], "rank {rank}: the test model changed");
        assert_eq!(
            run.all_reduces, run.with_gradient,
            "rank {rank}: one all-reduce per parameter WITH a gradient, each step (skip `!grad.defined()`)"
        );
    }
    // And the run is still right, for this model too.
    check_against_one_process(2, Optim::Sgd, mlp_with_unused);
}

#[test]
fn one_collective_per_parameter_with_a_gradient_and_no_other() {
    // The stub's rule: every rank makes one collective per parameter that has
    // a gradient, and nothing else: no barrier "to be safe", no broadcast,
    // no second all-reduce for the division.
    let runs = train_ddp(3, Optim::Sgd, true, mlp_with_unused);
    for (rank, run) in runs.iter().enumerate() {
        for (step, (&calls, &expected)) in run.collectives.iter().zip(&run.with_gradient).enumerate() {
            assert_eq!(
                calls,
                expected,
                "rank {rank}, step {}: your sync_gradients made {calls} collective call(s), the chapter expects \
                 {expected}, one all-reduce per parameter with a gradient (`unused` has none), because every \
                 collective pays a fixed cost and the mean needs no other: all-reduce each gradient, then divide \
                 it in place, with no barrier, broadcast or extra all-reduce",
                step + 1
            );
        }
    }
}
