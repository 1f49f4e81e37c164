//! Chapter 01 tests, phase 2 on its own: `ring_all_gather`, started from what
//! phase 1 leaves (chunk r complete on rank r, something else in the other
//! chunks), must hand every rank every complete chunk. The ring tests of
//! `tests/chapter_01.rs` run it only after your phase 1, and never on one
//! rank (`ring_all_reduce` returns early there).
//!
//! Compiled into `cargo test --test chapter_01` (see `tests/chapter_01.rs`).

use ddp_workbook::ch01_collectives::{chunk_lengths, learner, split_into_chunks};
use ddp_workbook::dist::{spawn_with, ProcessGroup};
use ddp_workbook::tch::{Kind, Tensor};

use super::{describe, integer_valued_f32, options, values, WORLD_SIZES};

/// What rank r holds in a chunk that is not yet complete: 1000 + r, far from
/// any complete sum of these inputs (at most 5 x 11 in size).
const NOT_COMPLETE: f64 = 1000.0;

/// The complete sum over `world_size` ranks' inputs, computed on one rank.
fn complete(world_size: usize, shape: &[i64]) -> Tensor {
    (1..world_size).fold(integer_valued_f32(0, shape), |sum, q| sum + integer_valued_f32(q, shape))
}

#[test]
fn all_gather_phase_alone_replaces_every_chunk_with_the_complete_one() {
    // [13] leaves chunks of unequal lengths; [2] on 3 to 5 ranks leaves empty ones.
    for shape in [[13_i64], [2]] {
        for world_size in WORLD_SIZES {
            let case = describe(world_size, &shape, Kind::Float);
            let gathered = spawn_with(options(world_size), |group| {
                let pg: &dyn ProcessGroup = group.as_ref();
                let rank = pg.rank();
                let mut chunks = split_into_chunks(&complete(world_size, &shape), world_size)?;
                for (c, chunk) in chunks.iter_mut().enumerate() {
                    if c != rank {
                        let _ = chunk.fill_(NOT_COMPLETE + rank as f64); // a partial sum, as far as phase 2 knows
                    }
                }
                learner::ring_all_gather(pg, &mut chunks)?;
                values(&Tensor::cat(&chunks, 0))
            });
            let gathered = gathered.unwrap_or_else(|error| {
                panic!(
                    "{case}: your ring_all_gather failed: {error}\n  With N = 1 it must make no step at all \
                     (a loop over `0..n - 1`; `0..=n - 2` underflows)."
                )
            });
            let expected = values(&complete(world_size, &shape)).unwrap();
            let lengths = chunk_lengths(shape[0], world_size);
            let chunk_of = |element: usize| {
                let mut end = 0;
                lengths.iter().position(|&len| {
                    end += len as usize;
                    element < end
                })
            };
            for (rank, got) in gathered.iter().enumerate() {
                for (element, (&got, &want)) in got.iter().zip(&expected).enumerate() {
                    let owner = chunk_of(element).expect("the element is in some chunk");
                    assert!(
                        got == want,
                        "{case}: after your ring_all_gather rank {rank} holds {got} at element {element} (in \
                         chunks[{owner}]), the chapter expects {want}, the complete chunk rank {owner} started \
                         phase 2 with, because phase 2 passes every complete chunk all the way around the ring \
                         and each one REPLACES what it arrives on ({} means it never arrived; adding it counts \
                         the partial sum twice). A rank first sends the chunk it completed itself, then \
                         forwards the chunk it received in the step before.",
                        NOT_COMPLETE + rank as f64
                    );
                }
            }
        }
    }
}
