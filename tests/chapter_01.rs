//! Chapter 01 tests: a ring all-reduce built from `send`/`recv` must give the
//! built-in `all_reduce(Sum)`'s answer on every rank, send 2·(N-1)/N of the
//! buffer per rank, and make no collective call at all.
//!
//! Your code:      `cargo test --test chapter_01`
//! The reference:  `cargo test --features solutions --test chapter_01`
//! Each test runs every world size from 1 to 5 on the in-process backend.
//! `chapter_01/all_gather.rs` checks phase 2 on its own;
//! `chapter_01/waiting_sends.rs` runs the ring where a send waits for its
//! receive; `chapter_01/controls.rs` holds the controls, which never run
//! your code.

// `#[path]`, because a module file directly in `tests/` would be built as a
// test binary of its own.
#[path = "chapter_01/all_gather.rs"]
mod all_gather;
#[path = "chapter_01/controls.rs"]
mod controls;
#[allow(dead_code)] // the shared fixture: chapter 1 changes only send and recv
#[path = "common/forwarding.rs"]
mod forwarding;
#[path = "chapter_01/waiting_sends.rs"]
mod waiting_sends;

use std::time::Duration;

use approx::abs_diff_eq;

use ddp_workbook::ch01_collectives::{chunk_lengths, learner, ring_all_reduce, split_into_chunks};
use ddp_workbook::dist::{spawn_with, CommStats, DistError, ProcessGroup, ReduceOp, SpawnOptions};
use ddp_workbook::tch::{Device, Kind, Tensor};
use ddp_workbook::with_seed;

const WORLD_SIZES: [usize; 5] = [1, 2, 3, 4, 5];
/// 1, 7, 13, 100 and 15 elements: most do not divide by most world sizes, and
/// one element on 5 ranks leaves four chunks empty. [3, 5] is 2-D.
const SHAPES: [&[i64]; 5] = [&[1], &[7], &[13], &[100], &[3, 5]];

/// Why random f64 data is compared with a tolerance and not bitwise:
/// floating-point addition is not associative. The built-in adds in rank
/// order, ((x0 + x1) + x2) + ...; the ring sums chunk c in ring order starting
/// at rank c + 1, so the roundings differ. With N(0, 1) values on at most 5
/// ranks the partial sums stay below about 10, so the two orders differ by a
/// few ulps of 10 (on this data: at most 8.9e-16, in most elements once N >= 3),
/// while a missing or doubled contribution is off by about 1.
const F64_TOLERANCE: f64 = 1e-12;

/// Short enough that a ring that waits for a message nobody sends fails soon;
/// `DDP_TIMEOUT_SECS` still wins while you step through a debugger.
const TEST_TIMEOUT: Duration = Duration::from_secs(10);

type AllReduceFn = fn(&dyn ProcessGroup, &mut Tensor) -> Result<(), DistError>;
type InputFn = fn(usize, &[i64]) -> Tensor;

/// Distinct small integers per rank: any order of adding them is exact in f32.
fn integer_valued_f32(rank: usize, shape: &[i64]) -> Tensor {
    let numel: i64 = shape.iter().product();
    let values: Vec<f32> = (0..numel).map(|i| ((i * 31 + rank as i64 * 17) % 23 - 11) as f32).collect();
    Tensor::from_slice(&values).reshape(shape)
}

fn random_f64(rank: usize, shape: &[i64]) -> Tensor {
    with_seed(100 + rank as i64, || Tensor::randn(shape, (Kind::Double, Device::Cpu)))
}

/// What one rank saw. f32 widens to f64 exactly, so comparing the f64 bits
/// is comparing the f32 bits.
struct RankOutcome {
    ring: Vec<f64>,
    builtin: Vec<f64>,
    /// Taken right after the ring, before the built-in adds its own call.
    stats: CommStats,
}

fn values(tensor: &Tensor) -> anyhow::Result<Vec<f64>> {
    Ok(Vec::<f64>::try_from(tensor.to_kind(Kind::Double).reshape([-1]))?)
}

fn options(world_size: usize) -> SpawnOptions {
    let options = SpawnOptions::new(world_size);
    if std::env::var_os("DDP_TIMEOUT_SECS").is_some() {
        options
    } else {
        options.timeout(TEST_TIMEOUT)
    }
}

fn describe(world_size: usize, shape: &[i64], kind: Kind) -> String {
    format!("world size {world_size}, {kind:?} tensor of shape {shape:?}")
}

// ANCHOR: spawn
/// Runs `all_reduce` and then the built-in on the same input on every rank.
fn run_case(world_size: usize, shape: &[i64], input: InputFn, all_reduce: AllReduceFn) -> Vec<RankOutcome> {
    let outcome = spawn_with(options(world_size), |group| {
        let pg: &dyn ProcessGroup = group.as_ref();
        let original = input(pg.rank(), shape);
        let mut ring = original.copy();
        all_reduce(pg, &mut ring)?;
        let stats = pg.stats();
        let mut builtin = original.copy();
        pg.all_reduce(&mut builtin, ReduceOp::Sum)?;
        Ok(RankOutcome { ring: values(&ring)?, builtin: values(&builtin)?, stats })
    });
    let kind = input(0, shape).kind();
    outcome.unwrap_or_else(|error| panic!("{}: {error}", describe(world_size, shape, kind)))
}
// ANCHOR_END: spawn

/// Tolerance 0 means bitwise: then even -0.0 and 0.0 count as different.
fn same(a: f64, b: f64, tolerance: f64) -> bool {
    if tolerance == 0.0 {
        a.to_bits() == b.to_bits()
    } else {
        abs_diff_eq!(a, b, epsilon = tolerance)
    }
}

/// Element `flat` of a tensor of `shape`, as an index per dimension.
fn index_of(flat: usize, shape: &[i64]) -> Vec<i64> {
    let (mut index, mut rest) = (vec![0; shape.len()], flat as i64);
    for (slot, &dim) in index.iter_mut().zip(shape).rev() {
        (*slot, rest) = (rest % dim, rest / dim);
    }
    index
}

/// Every rank's ring result against the built-in's, element by element.
fn compare_with_builtin(
    outcomes: &[RankOutcome],
    shape: &[i64],
    tolerance: f64,
    case: &str,
) -> Result<(), String> {
    for (rank, outcome) in outcomes.iter().enumerate() {
        for (i, (&ring, &builtin)) in outcome.ring.iter().zip(&outcome.builtin).enumerate() {
            if !same(ring, builtin, tolerance) {
                return Err(format!(
                    "{case}: rank {rank}, element {:?}: the ring gave {ring} but the built-in \
                     all_reduce(Sum) gave {builtin} (off by {:e}, tolerance {tolerance:e}).\n  \
                     Check which chunk each step sends and which one it adds into; the test \
                     reduce_scatter_phase_sums_chunk_rank_on_each_rank checks phase 1 alone.",
                    index_of(i, shape),
                    (ring - builtin).abs()
                ));
            }
        }
    }
    Ok(())
}

/// Every rank's ring result against rank 0's, bitwise.
fn compare_across_ranks(outcomes: &[RankOutcome], shape: &[i64], case: &str) -> Result<(), String> {
    for (rank, outcome) in outcomes.iter().enumerate().skip(1) {
        for (i, (&mine, &rank0)) in outcome.ring.iter().zip(&outcomes[0].ring).enumerate() {
            if mine.to_bits() != rank0.to_bits() {
                return Err(format!(
                    "{case}: ranks disagree at element {:?}: rank {rank} holds {mine} but rank 0 \
                     holds {rank0}.\n  After phase 1 each rank has only its own chunk complete: \
                     does ring_all_gather pass every complete chunk all the way around the ring?",
                    index_of(i, shape)
                ));
            }
        }
    }
    Ok(())
}

/// The ring must be made of point-to-point messages only.
fn check_only_point_to_point(stats: &CommStats, rank: usize, case: &str) -> Result<(), String> {
    match stats.collectives() {
        0 => Ok(()),
        calls => Err(format!(
            "{case}: rank {rank} made {calls} collective call(s) during the ring ({stats:?}); \
             build it from pg.send and pg.recv only, no all_reduce, broadcast or all_gather"
        )),
    }
}

fn check_all(input: InputFn, tolerance: f64) {
    for world_size in WORLD_SIZES {
        let mut largest = 0.0_f64; // over every shape: what the chapter quotes (`-- --nocapture`)
        for shape in SHAPES {
            let case = describe(world_size, shape, input(0, shape).kind());
            let outcomes = run_case(world_size, shape, input, ring_all_reduce);
            let verdict = compare_across_ranks(&outcomes, shape, &case)
                .and_then(|()| compare_with_builtin(&outcomes, shape, tolerance, &case));
            verdict.unwrap_or_else(|message| panic!("{message}"));
            let differences = outcomes.iter().flat_map(|o| o.ring.iter().zip(&o.builtin));
            largest = differences.fold(largest, |m, (ring, builtin)| m.max((ring - builtin).abs()));
        }
        println!("{world_size} rank(s): the ring is at most {largest:.1e} from the built-in all_reduce");
    }
}

#[test]
fn ring_equals_builtin_bitwise_on_integer_valued_f32() {
    check_all(integer_valued_f32, 0.0);
}

#[test]
fn ring_equals_builtin_within_tolerance_on_random_f64() {
    check_all(random_f64, F64_TOLERANCE);
}

#[test]
fn reduce_scatter_phase_sums_chunk_rank_on_each_rank() {
    let (shape, len) = ([13_i64], 13);
    for world_size in WORLD_SIZES {
        let case = describe(world_size, &shape, Kind::Float);
        let phase_one = spawn_with(options(world_size), |group| {
            let pg: &dyn ProcessGroup = group.as_ref();
            let mut chunks = split_into_chunks(&integer_valued_f32(pg.rank(), &shape), world_size)?;
            learner::ring_reduce_scatter(pg, &mut chunks)?;
            values(&chunks[pg.rank()])
        });
        let phase_one = phase_one.unwrap_or_else(|error| panic!("{case}: {error}"));
        // Every rank's input is known here, so the expected sums need no communication.
        let start = |rank: usize| chunk_lengths(len, world_size)[..rank].iter().sum::<i64>() as usize;
        for (rank, got) in phase_one.iter().enumerate() {
            for (offset, &value) in got.iter().enumerate() {
                let element = start(rank) + offset;
                let expected: f64 =
                    (0..world_size).map(|q| values(&integer_valued_f32(q, &shape)).unwrap()[element]).sum();
                assert!(
                    value == expected,
                    "{case}: after ring_reduce_scatter, rank {rank}'s chunks[{rank}] holds {value} \
                     at element {element} of the buffer, but the sum over all ranks is {expected}.\n  \
                     Follow one chunk around the ring in the chapter's phase 1 table: a rank passes on \
                     the chunk it added into in the step before, and what arrives is ADDED into its own \
                     copy of that chunk."
                );
            }
        }
    }
}

#[test]
fn each_rank_sends_two_n_minus_one_over_n_of_the_buffer() {
    for world_size in WORLD_SIZES {
        for shape in SHAPES {
            let case = describe(world_size, shape, Kind::Float);
            let len: i64 = shape.iter().product();
            let lengths = chunk_lengths(len, world_size);
            let outcomes = run_case(world_size, shape, integer_valued_f32, ring_all_reduce);
            for (rank, RankOutcome { stats, .. }) in outcomes.iter().enumerate() {
                let steps = 2 * (world_size as u64 - 1);
                assert!(
                    stats.send == steps && stats.recv == steps,
                    "{case}: rank {rank} made {} sends and {} recvs; a ring makes one of each per \
                     step, N - 1 steps per phase: {steps} in all",
                    stats.send,
                    stats.recv
                );
                // A chunk is never sent on by the rank where its trip ends: in phase 1
                // chunk `rank` ends here, in phase 2 chunk `rank + 1` does.
                let elements = match world_size {
                    1 => 0,
                    n => 2 * len - lengths[rank] - lengths[(rank + 1) % n],
                };
                let expected_bytes = elements as u64 * 4; // f32
                assert_eq!(
                    stats.p2p_bytes_sent,
                    expected_bytes,
                    "{case}: rank {rank} sent {} bytes, expected {expected_bytes}: all chunks but \
                     chunks[{rank}] in phase 1 and all but chunks[{}] in phase 2",
                    stats.p2p_bytes_sent,
                    (rank + 1) % world_size
                );
                let ratio = stats.p2p_bytes_sent as f64 / (len * 4) as f64;
                let ideal = 2.0 * (world_size as f64 - 1.0) / world_size as f64;
                // Each chunk is within one element of len / N, and two chunks are skipped.
                assert!(
                    abs_diff_eq!(ratio, ideal, epsilon = 2.0 / len as f64),
                    "{case}: rank {rank} sent {ratio:.3} times the buffer, 2(N-1)/N = {ideal:.3}"
                );
            }
        }
    }
}

#[test]
fn the_ring_makes_no_collective_calls() {
    for world_size in WORLD_SIZES {
        let case = describe(world_size, &[100], Kind::Float);
        let outcomes = run_case(world_size, &[100], integer_valued_f32, ring_all_reduce);
        for (rank, outcome) in outcomes.iter().enumerate() {
            check_only_point_to_point(&outcome.stats, rank, &case).unwrap_or_else(|m| panic!("{m}"));
        }
    }
}

#[test]
fn the_ring_runs_inside_sub_groups_of_two() {
    // Ranks {0, 1} and {2, 3} form two pairs; each pair sums on its own ring.
    let sums = spawn_with(options(4), |pg| {
        let (low, high) = (pg.new_group(&[0, 1])?, pg.new_group(&[2, 3])?);
        let pair = low.or(high).expect("every rank is in one pair");
        let mut t = integer_valued_f32(pg.rank(), &[7]);
        ring_all_reduce(pair.as_ref(), &mut t)?;
        values(&t)
    });
    let sums = sums.unwrap_or_else(|error| panic!("two pairs of ranks: {error}"));
    for (rank, got) in sums.iter().enumerate() {
        let partner = rank ^ 1; // 0 <-> 1, 2 <-> 3
        let mine = values(&(integer_valued_f32(rank, &[7]) + integer_valued_f32(partner, &[7]))).unwrap();
        assert_eq!(got, &mine, "rank {rank}: the ring in its pair must sum ranks {rank} and {partner} only");
    }
}

// A negative control that runs your phase 1: without phase 2 the ranks
// disagree. The two that never run your code are in `chapter_01/controls.rs`.

/// Phase 1 without phase 2: each rank has only its own chunk summed.
fn reduce_scatter_only(pg: &dyn ProcessGroup, tensor: &mut Tensor) -> Result<(), DistError> {
    let torch = |source| DistError::Torch { rank: pg.rank(), op: "test".into(), cause: source };
    let mut chunks = split_into_chunks(&tensor.reshape([-1]), pg.world_size()).map_err(torch)?;
    learner::ring_reduce_scatter(pg, &mut chunks)?;
    tensor.copy_(&Tensor::cat(&chunks, 0).view(tensor.size().as_slice()));
    Ok(())
}

#[test]
fn negative_control_skipping_the_all_gather_leaves_ranks_disagreeing() {
    let outcomes = run_case(3, &[3, 5], random_f64, reduce_scatter_only);
    let error = compare_across_ranks(&outcomes, &[3, 5], "no all-gather").expect_err("must differ");
    assert!(error.contains("ranks disagree") && error.contains("rank 1"), "{error}");
    compare_with_builtin(&outcomes, &[3, 5], F64_TOLERANCE, "no all-gather").expect_err("must differ");
}
