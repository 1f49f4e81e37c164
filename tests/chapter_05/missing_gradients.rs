//! Chapter 05 tests, a parameter that loses its gradient: the bucket buffers
//! are allocated once and reused every step, so a slot that `sync_bucket`
//! skips instead of zeroing still holds the previous step's average.
//!
//! Compiled into `cargo test --test chapter_05` (see `tests/chapter_05.rs`).

use ddp_workbook::ch05_bucketing::{BucketCaps, LocalBackward, SimpleDistributedDataParallelism};
use ddp_workbook::check::{compare_to_reference, snapshot};
use ddp_workbook::ddp::naive;
use ddp_workbook::dist::{spawn_with, SpawnError};
use ddp_workbook::tch::Kind;

use super::training::{data, mlp_with_unused, Optim, GLOBAL_BATCH};
use crate::common::{mse, spawn_options, Named};

const WORLD_SIZE: i64 = 2;

/// Per step: the parameters after it, and whether `unused` had a gradient
/// after the sync.
type Record = Vec<(Named, bool)>;

/// Two SGD steps on two ranks. In step 1 every rank's loss uses `unused`; in
/// step 2 none does, so `zero_grad` leaves it without a gradient on every
/// rank. `bucketed`: this chapter's sync (one bucket with PyTorch's caps);
/// otherwise chapter 3's, which skips the parameter.
fn used_in_step_1_only(bucketed: bool) -> Result<Vec<Record>, SpawnError> {
    spawn_with(spawn_options(WORLD_SIZE as usize), |pg| {
        let (rank, data) = (pg.rank() as i64, data());
        let (vs, model) = mlp_with_unused();
        let mut optimizer = Optim::Sgd.build(&vs)?;
        let ddp = SimpleDistributedDataParallelism::with_bucket_caps(model, &vs, pg, BucketCaps::default())?;
        let unused =
            ddp.parameters().iter().find(|(n, _)| n == "unused").expect("the model has it").1.shallow_clone();
        let mut record = Record::new();
        for step in 0..2 {
            let rows = GLOBAL_BATCH / WORLD_SIZE;
            let (x, y) = data.batch(step * GLOBAL_BATCH + rank * rows, rows); // [rows, 4], [rows, 1]
            optimizer.zero_grad();
            let mut loss = mse(&ddp.forward(&x), &y);
            if step == 0 {
                loss += unused.square().sum(Kind::Double) * 0.5; // its gradient: `unused` itself, not 0
            }
            ddp.backward_local(&loss)?;
            if bucketed {
                ddp.sync_gradients()?;
            } else {
                naive::sync_gradients(ddp.process_group().as_ref(), ddp.parameters())?;
            }
            let had_gradient = unused.grad().defined();
            optimizer.step();
            record.push((snapshot(ddp.parameters()), had_gradient));
        }
        Ok(record)
    })
}

#[test]
fn a_slot_without_gradient_is_zeroed_every_step_not_left_from_the_last() {
    let naive = used_in_step_1_only(false).unwrap_or_else(|error| {
        panic!(
            "the run with chapter 3's sync failed (it plans its buckets with your plan_buckets too): {error}"
        )
    });
    assert_eq!(
        naive[0].iter().map(|(_, had)| *had).collect::<Vec<_>>(),
        vec![true, false],
        "the test's premise: `unused` has a gradient in step 1 and none after zero_grad in step 2"
    );
    let bucketed = used_in_step_1_only(true).unwrap_or_else(|error| {
        panic!(
            "the run with your sync_bucket failed: {error}\nIf it says that `unused` has no gradient but the \
             averaged bucket holds values for it: in step 2 `unused` has no gradient on any rank, but it had one \
             in step 1. The chapter expects zeros in its slot, because the buffer is reused every step: a slot \
             that is skipped instead of zeroed still holds step 1's average of `unused`, which then goes into \
             everyone's sum (zero it with `slot.f_zero_()` when `grad()` is not defined)"
        )
    });
    for (rank, (mine, reference)) in bucketed.iter().zip(&naive).enumerate() {
        for (step, ((params, had), (expected, _))) in mine.iter().zip(reference).enumerate() {
            let had_expected = step == 0;
            assert_eq!(
                *had,
                had_expected,
                "rank {rank}, step {}: after your sync `unused` {} a gradient, the chapter expects it {} one, \
                 because a gradient that was undefined before the sync stays undefined",
                step + 1,
                if *had { "has" } else { "has no" },
                if had_expected { "to keep" } else { "to have no" }
            );
            compare_to_reference(params, expected, 0.0).unwrap_or_else(|report| {
                panic!(
                    "rank {rank} after step {}, your bucketed sync against chapter 3's: {}",
                    step + 1,
                    report.hint(
                        "a parameter without gradient sends zeros in its slot, every step, whatever the \
                         buffer held before, and gets no gradient back"
                    )
                )
            });
        }
    }
}
