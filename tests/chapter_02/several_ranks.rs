//! Chapter 02 tests, several ranks that differ at once: the error must name
//! every one of them, and report the largest of their differences, a NaN
//! included. The tests of `tests/chapter_02.rs` make only rank 1 differ.
//!
//! Compiled into `cargo test --test chapter_02` (see `tests/chapter_02.rs`).

use ddp_workbook::ch02_replicas::{learner, InitError};
use ddp_workbook::tch::Tensor;

use super::{run, why_not_a_mismatch};

/// Every rank's `verify_replicas` on one tensor `w`, whose value rank r sets.
fn verdicts(world_size: usize, w: impl Fn(usize) -> Vec<f64> + Sync) -> Vec<Option<InitError>> {
    let (verdicts, _) = run(world_size, |pg| {
        let named = vec![("w".to_string(), Tensor::from_slice(&w(pg.rank())))];
        Ok(learner::verify_replicas(pg.as_ref(), &named).err())
    });
    verdicts
}

#[test]
fn every_differing_rank_is_named_with_the_largest_difference_of_them_all() {
    // Ranks 1, 2 and 3 differ from rank 0 by 0.25, 0.5 and 0.125: the largest
    // is neither the first differing rank's nor the last one's.
    let offsets = [0.0, 0.25, 0.5, 0.125];
    for (rank, verdict) in verdicts(4, |rank| vec![1.0, 2.0 + offsets[rank]]).iter().enumerate() {
        let Some(InitError::ReplicaMismatch { parameter, max_abs_diff, differing_ranks }) = verdict else {
            panic!(
                "rank {rank}: your verify_replicas gave {verdict:?} for `w`, which ranks 1, 2 and 3 hold \
                 differently from rank 0; the chapter expects ReplicaMismatch on every rank{}",
                verdict.as_ref().map_or("", why_not_a_mismatch)
            );
        };
        assert_eq!(parameter, "w", "rank {rank}: the mismatch is in `w`");
        assert_eq!(
            differing_ranks,
            &[1, 2, 3],
            "rank {rank}: your verify_replicas named rank(s) {differing_ranks:?}, the chapter expects [1, 2, 3], because the \
             error must name every rank that differs from rank 0, not only one of them: gather every rank's \
             verdict and collect all ranks whose bits differ"
        );
        assert_eq!(
            *max_abs_diff, 0.5,
            "rank {rank}: your verify_replicas reported a largest difference of {max_abs_diff}, the chapter expects 0.5, \
             because when several ranks differ (rank 1 by 0.25, rank 2 by 0.5, rank 3 by 0.125) the error \
             reports the largest of their differences"
        );
    }
}

#[test]
fn a_nan_difference_wins_over_the_finite_ones() {
    // Rank 1 holds a NaN where rank 0 holds 1.0 (its difference is NaN);
    // rank 2 differs by 0.5.
    let w = |rank: usize| match rank {
        1 => vec![f64::NAN, 2.0],
        2 => vec![1.0, 2.5],
        _ => vec![1.0, 2.0],
    };
    for (rank, verdict) in verdicts(3, w).iter().enumerate() {
        let Some(InitError::ReplicaMismatch { max_abs_diff, differing_ranks, .. }) = verdict else {
            panic!(
                "rank {rank}: your verify_replicas gave {verdict:?}; ranks 1 and 2 differ from rank 0{}",
                verdict.as_ref().map_or("", why_not_a_mismatch)
            );
        };
        assert_eq!(
            differing_ranks,
            &[1, 2],
            "rank {rank}: your verify_replicas named rank(s) {differing_ranks:?}, the chapter expects [1, 2], because ranks 1 \
             (a NaN) and 2 (by 0.5) differ from rank 0 (the bits decide, whatever the difference is)"
        );
        assert!(
            max_abs_diff.is_nan(),
            "rank {rank}: your verify_replicas reported a largest difference of {max_abs_diff}, the chapter expects NaN, \
             because rank 1 holds a NaN weight and the message must show it: let a NaN win when you take the \
             largest difference (`f64::max` quietly drops NaN)"
        );
    }
}
