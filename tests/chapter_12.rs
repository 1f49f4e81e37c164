//! Chapter 12 tests: bf16 gradients. A communication hook that sends each
//! bucket as bfloat16 must halve the bytes of every step, leave the mean
//! within the bound bf16's 8 significant bits allow (derived in
//! `chapter_12/arithmetic.rs`) and round nowhere else, and keep the
//! replicas bitwise equal.
//!
//! Your code:           `cargo test --test chapter_12`
//! The reference code:  `cargo test --features solutions --test chapter_12`
//! See the measured numbers: add `-- --nocapture`
//!
//! Every claim is checked against arithmetic done another way: the exact
//! mean in f64 in one process, or the hook's honest orders of
//! operations computed in one process with libtorch's own bf16 additions.

#[path = "chapter_12/arithmetic.rs"]
mod arithmetic;
mod common;
#[path = "chapter_12/training.rs"]
mod training;

use arithmetic::*;
use common::run;
use ddp_workbook::ch12_bf16::learner;
use ddp_workbook::check::same_bits;
use ddp_workbook::tch::{Kind, Tensor};

/// Every rank runs the learner's hook on its `rank_buffer` and returns the
/// buffer afterwards.
fn hooked_buffers(world: usize, numel: i64, kind: Kind) -> Vec<Tensor> {
    run(world, |pg| {
        let buffer = rank_buffer(pg.rank(), numel, kind);
        learner::bf16_compress_hook(pg.as_ref(), &buffer)?.wait()?;
        Ok(buffer)
    })
}

#[test]
fn the_mean_is_within_n_bf16_roundings_on_2_3_and_4_ranks() {
    for kind in [Kind::Float, Kind::Double] {
        for world in [2, 3, 4] {
            let results = hooked_buffers(world, 10_000, kind);
            let contributions: Vec<Tensor> = (0..world).map(|r| rank_buffer(r, 10_000, kind)).collect();
            assert_eq!(results[0].kind(), kind, "the bucket keeps its dtype");
            for (rank, result) in results.iter().enumerate() {
                assert!(same_bits(result, &results[0]), "rank {rank} holds other bits than rank 0");
            }
            let worst = within_bound(&results[0], &contributions)
                .unwrap_or_else(|e| panic!("{kind:?} on {world} ranks: {e}"));
            println!(
                "{kind:?}, {world} ranks: worst error {worst:.3} of the bound {:.2e}",
                bf16_bound(world)
            );
        }
    }
}

#[test]
fn the_mean_has_no_rounding_the_wire_does_not_need() {
    // One more operation in bf16 (PyTorch's hook divides after the cast)
    // changes some of these 10,000 elements on 3 ranks: see the controls.
    let results = hooked_buffers(3, 10_000, Kind::Float);
    let contributions: Vec<Tensor> = (0..3).map(|r| rank_buffer(r, 10_000, Kind::Float)).collect();
    let honest = orders_without_extra_roundings(&contributions);
    assert!(
        honest.iter().any(|order| same_bits(&results[0], order)),
        "the hook's mean is neither (x / 3 in f32, to bf16, summed) nor (x to bf16, summed, back, / 3), \
         nor either with * (1/3) for / 3: some value was rounded to bf16 once more than the all-reduce needs \
         (a division or a copy in bf16?)"
    );
}

mod controls {
    //! Tests that never run the learner's code: they show what the backend
    //! does with bf16, and that each check above can fail.
    use super::*;
    use ddp_workbook::dist::{torch_error, DistError, ProcessGroup, ReduceOp, Work};

    #[test]
    fn the_in_process_backend_sums_bf16_in_bf16_in_rank_order() {
        let contributions: Vec<Tensor> =
            (0..3).map(|r| rank_buffer(r, 10_000, Kind::Float).to_kind(Kind::BFloat16)).collect();
        let results = run(3, |pg| {
            let mut tensor = rank_buffer(pg.rank(), 10_000, Kind::Float).to_kind(Kind::BFloat16);
            pg.all_reduce(&mut tensor, ReduceOp::Sum)?;
            Ok(tensor)
        });
        let chain = bf16_chain(&contributions);
        assert!(same_bits(&results[0], &chain), "not libtorch's bf16 additions in rank order");
        // Not a sum widened to f32 and rounded once: the partial sums are rounded too.
        let widened =
            contributions.iter().fold(Tensor::zeros([10_000], (Kind::Float, results[0].device())), |s, c| {
                s + c.to_kind(Kind::Float)
            });
        assert!(!same_bits(&results[0], &widened.to_kind(Kind::BFloat16)));
    }

    #[test]
    fn a_division_in_bf16_is_one_rounding_too_many() {
        let contributions: Vec<Tensor> = (0..3).map(|r| rank_buffer(r, 10_000, Kind::Float)).collect();
        let pytorch_order: Vec<Tensor> =
            contributions.iter().map(|c| c.to_kind(Kind::BFloat16) / 3.0).collect();
        let pytorch = bf16_chain(&pytorch_order).to_kind(Kind::Float);
        for honest in orders_without_extra_roundings(&contributions) {
            assert!(!same_bits(&pytorch, &honest), "the extra rounding changed nothing");
        }
        within_bound(&pytorch, &contributions).expect("still within the worst case, which allows for it");
    }

    /// Sums in bf16 and copies back, without dividing.
    fn no_division(pg: &dyn ProcessGroup, buffer: &Tensor) -> Result<Work, DistError> {
        let sent = buffer.to_kind(Kind::BFloat16);
        let sum = pg.all_reduce_async(&sent, ReduceOp::Sum)?;
        let (mut bucket, on_error) = (buffer.shallow_clone(), torch_error(pg, "copy"));
        Ok(Work::new(move || {
            sum.wait()?;
            bucket.f_copy_(&sent).map_err(on_error)
        }))
    }

    /// Copies back before the sum has arrived: this rank's own share.
    fn copies_too_early(pg: &dyn ProcessGroup, buffer: &Tensor) -> Result<Work, DistError> {
        let sent = (buffer / pg.world_size() as f64).to_kind(Kind::BFloat16);
        buffer.shallow_clone().f_copy_(&sent).map_err(torch_error(pg, "copy"))?;
        pg.all_reduce_async(&sent, ReduceOp::Sum)
    }

    #[test]
    fn wrong_hooks_fail_the_bound() {
        type Hook = fn(&dyn ProcessGroup, &Tensor) -> Result<Work, DistError>;
        for (name, hook) in [("no division", no_division as Hook), ("copies too early", copies_too_early)] {
            let results = run(3, |pg| {
                let buffer = rank_buffer(pg.rank(), 1000, Kind::Float);
                hook(pg.as_ref(), &buffer)?.wait()?;
                Ok(buffer)
            });
            let contributions: Vec<Tensor> = (0..3).map(|r| rank_buffer(r, 1000, Kind::Float)).collect();
            assert!(within_bound(&results[0], &contributions).is_err(), "{name} passed the bound");
        }
    }
}
