//! Chapter 02 tests, after `optimizer.step()`: replicas that the chapter's
//! `SimpleDistributedDataParallelism` accepted, stepped on the same rows
//! with the same optimizer, stay bitwise equal after every step, and equal
//! one process that trains the same model on the same rows without any
//! wrapper or rank (the value computed another way). Chapter 3 is what lets
//! the ranks train on DIFFERENT rows; here nothing is synced yet.
//!
//! Compiled into `cargo test --test chapter_02` (see `tests/chapter_02.rs`).

use ddp_workbook::ch02_replicas::{LocalBackward, SimpleDistributedDataParallelism};
use ddp_workbook::check::snapshot;
use ddp_workbook::data::Regression;
use ddp_workbook::models::Mlp;
use ddp_workbook::tch::{Kind, Tensor};

use super::common::{
    assert_matches_one_process, global_batches, mse, train_single_process, Hints, Named, Optim, TOLERANCE,
};
use super::{run, SEED, SIZES};

const ROWS: i64 = 8;
const STEPS: usize = 4;

/// The same rows on every rank: with nothing synced, only identical inputs
/// keep identical replicas identical.
fn batches() -> Vec<(Tensor, Tensor)> {
    global_batches(&Regression::new(11, ROWS * STEPS as i64, 4, 1, Kind::Double), ROWS, STEPS)
}

#[test]
fn verified_replicas_stay_equal_after_every_identical_local_step() {
    for optim in [Optim::Sgd, Optim::Adam] {
        let (per_rank, _) = run(3, |pg| {
            let (vs, mlp) = Mlp::seeded(SEED, SIZES, Kind::Double);
            let mut optimizer = optim.build(&vs)?;
            let rank = pg.rank();
            let ddp = SimpleDistributedDataParallelism::new(mlp, &vs, pg)
                .map_err(|e| anyhow::anyhow!("rank {rank}: wrapping rejected identical replicas: {e}"))?;
            let mut after_each_step: Vec<Named> = vec![];
            for (x, y) in &batches() {
                optimizer.zero_grad();
                ddp.backward_local(&mse(&ddp.forward(x), y))?; // this rank's gradient, nothing sent
                optimizer.step();
                after_each_step.push(snapshot(ddp.parameters()));
            }
            Ok(after_each_step)
        });
        let reference = train_single_process(|| Mlp::seeded(SEED, SIZES, Kind::Double), optim, &batches());
        let hints = Hints {
            replicas: "the replicas started equal and took the same steps on the same rows, so your \
                       verify_replicas must have changed some rank's tensors while checking them: broadcast \
                       rank 0's values into a copy, never into the model",
            reference: "wrapping must leave the model as it was built: your verify_replicas changed the \
                        weights every rank trains from",
        };
        let case = format!("{optim:?} on 3 ranks, the same {ROWS} rows each");
        assert_matches_one_process(&case, &per_rank, &reference, TOLERANCE, &hints);
    }
}
