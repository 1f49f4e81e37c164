//! Tests of the notebooks' `World` (`ddp_workbook::notebook::World`): rank
//! threads that outlive a cell, each rank's kept values, a failure, a panic
//! or a hang on one rank that leaves the world usable, the status, the end
//! of the threads, and two worlds side by side. Every number a collective
//! computes is checked against the same sum done in this thread.
//!
//! Run: `cargo test --test notebook_world`

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ddp_workbook::dist::{DistError, ReduceOp, SpawnOptions};
use ddp_workbook::notebook::{Found, KeptError, World};
use ddp_workbook::tch::{Kind, Tensor};

/// Rank `r`'s tensor in these tests: (r + 1) · [0, 1, 2, 3].
fn tensor_of(rank: usize) -> Tensor {
    Tensor::arange(4, (Kind::Double, ddp_workbook::tch::Device::Cpu)) * (rank as f64 + 1.0)
}

/// What an all-reduce sum of every rank's `tensor_of` gives, added up here.
fn sum_by_hand(world_size: usize) -> Vec<f64> {
    (0..4).map(|i| (0..world_size).map(|r| (r as f64 + 1.0) * i as f64).sum()).collect()
}

fn start(world_size: usize) -> World {
    World::start(world_size).unwrap_or_else(|e| panic!("{e}"))
}

/// Keeps `tensor_of(rank)` as "x" on every rank.
fn keep_x(world: &World) {
    world
        .run(|rank| {
            rank.keep("x", tensor_of(rank.rank()));
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Sums the kept "x" over the ranks (a copy, "x" stays) and returns each
/// rank's result.
fn all_reduce_x(world: &World) -> Vec<Vec<f64>> {
    world
        .run(|rank| {
            let mut sum = rank.get::<Tensor>("x")?.copy();
            rank.pg().all_reduce(&mut sum, ReduceOp::Sum)?;
            Ok(Vec::<f64>::try_from(&sum)?)
        })
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn values_kept_in_one_cell_are_there_in_the_next_and_another_rank_can_be_asked() {
    let world = start(3);
    keep_x(&world);
    assert_eq!(all_reduce_x(&world), vec![sum_by_hand(3); 3], "cell 2 reduces what cell 1 kept");
    // Cell 3 looks at rank 1's tensor only; the others wait.
    let seen = world.on(&[1], |rank| Ok(Vec::<f64>::try_from(rank.get::<Tensor>("x")?)?));
    assert_eq!(seen.unwrap_or_else(|e| panic!("{e}")), vec![vec![0.0, 2.0, 4.0, 6.0]]);
    // get_mut changes the kept value in place; take removes it.
    world
        .run(|rank| {
            *rank.get_mut::<Tensor>("x")? += 1.0;
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
    let taken = world.on(&[2, 0], |rank| Ok(Vec::<f64>::try_from(&rank.take::<Tensor>("x")?)?));
    assert_eq!(
        taken.unwrap_or_else(|e| panic!("{e}")),
        vec![vec![1.0, 4.0, 7.0, 10.0], vec![1.0, 2.0, 3.0, 4.0]]
    );
    let gone = world.on(&[0], |rank| Ok(rank.get::<Tensor>("x").map(|_| ()).map_err(|e| e.to_string())));
    let message = gone.unwrap_or_else(|e| panic!("{e}")).remove(0).expect_err("rank 0's x was taken");
    assert!(message.contains("rank 0 keeps no Tensor named \"x\" (it keeps nothing yet)"), "{message}");
}

#[test]
fn a_miss_or_a_wrong_type_names_the_rank_the_key_and_the_types() {
    let world = start(2);
    let errors = world
        .run(|rank| {
            rank.keep("lr", 0.1_f64);
            rank.keep("x", tensor_of(rank.rank()));
            let miss = rank.get::<Tensor>("modle").map(|_| ()).expect_err("nothing is kept as modle");
            let wrong = rank.get::<f32>("lr").map(|_| ()).expect_err("lr is an f64");
            let kept_still = *rank.get::<f64>("lr")?;
            let wrong_take = rank.take::<Vec<f64>>("x").map(|_| ()).expect_err("x is a Tensor");
            Ok((miss, wrong, kept_still, wrong_take, rank.get::<Tensor>("x").is_ok()))
        })
        .unwrap_or_else(|e| panic!("{e}"));
    let (miss, wrong, lr, wrong_take, x_still_kept): &(KeptError, KeptError, f64, KeptError, bool) =
        &errors[1];
    assert_eq!((miss.rank, miss.key.as_str(), miss.wanted.as_str()), (1, "modle", "Tensor"));
    assert!(matches!(&miss.found, Found::Missing(keys) if keys == &["lr", "x"]), "{miss:?}");
    assert_eq!(
        miss.to_string(),
        "rank 1 keeps no Tensor named \"modle\" (it keeps \"lr\", \"x\"): keep it first, with \
         rank.keep(\"modle\", value) in an earlier cell on this rank (was that cell run, and on rank 1? \
         or was it taken with rank.take?)"
    );
    assert_eq!(
        wrong.to_string(),
        "rank 1 keeps \"lr\" as a f64, not a f32: ask for rank.get::<f64>(\"lr\"), or keep a f32 under \
         another name"
    );
    assert!(wrong_take.to_string().contains("keeps \"x\" as a Tensor, not a Vec<f64>"), "{wrong_take}");
    assert_eq!((*lr, *x_still_kept), (0.1, true), "a failed get or take leaves the value kept");
    assert_eq!(errors[0].0.rank, 0, "each rank names itself");
    // `?` in a rank turns the miss into that rank's failure, named in the report.
    let failed = world.run(|rank| Ok(*rank.get::<u8>("lr")?)).expect_err("lr is no u8");
    assert!(
        failed.to_string().contains("rank 0 returned an error: rank 0 keeps \"lr\" as a f64"),
        "{failed}"
    );
}

#[test]
fn an_error_on_one_rank_names_it_and_the_world_goes_on_with_its_state() {
    let world = start(3);
    keep_x(&world);
    let error = world
        .run(|rank| {
            if rank.rank() == 1 {
                anyhow::bail!("rank 1's batch is empty");
            }
            let mut x = rank.get::<Tensor>("x")?.copy();
            rank.pg().all_reduce(&mut x, ReduceOp::Sum)?; // cannot complete without rank 1
            Ok(())
        })
        .expect_err("rank 1 fails");
    assert_eq!(error.first_failed_rank(), Some(1), "{error}");
    assert!(
        error.to_string().contains("first: rank 1 returned an error: rank 1's batch is empty"),
        "{error}"
    );
    let peer = error.error_of(0).and_then(|e| e.downcast_ref::<DistError>());
    assert!(
        matches!(peer, Some(DistError::PeerGone { peer: 1, .. })),
        "rank 0 learns why it stopped: {error}"
    );
    // The same world, a new group, the values kept: the sum is right again.
    assert_eq!(all_reduce_x(&world), vec![sum_by_hand(3); 3]);
    let status = world.status();
    assert_eq!(status.groups_made, 2, "{status}");
    let last = status.ranks[1].last_error.clone().unwrap_or_default();
    assert!(last.starts_with("cell 2: returned an error: rank 1's batch is empty"), "{status}");
}

#[test]
fn a_panic_on_one_rank_is_reported_with_its_place_and_the_world_goes_on() {
    let world = start(2);
    keep_x(&world);
    let error = world
        .run(|rank| {
            if rank.rank() == 0 {
                todo!("exercise ch99: planted in a test");
            }
            rank.pg().barrier()?;
            Ok(())
        })
        .expect_err("rank 0 panics");
    let message = error.to_string();
    assert_eq!(error.first_failed_rank(), Some(0), "{message}");
    assert!(message.contains("first: rank 0 panicked: not yet implemented: exercise ch99"), "{message}");
    assert!(message.contains(concat!(file!(), ":")), "the panic's place is kept: {message}");
    assert_eq!(all_reduce_x(&world), vec![sum_by_hand(2); 2], "both threads still run, with their x");
}

#[test]
fn a_collective_a_rank_never_joins_fails_at_the_deadline_naming_that_rank() {
    let deadline = Duration::from_millis(500);
    let world = World::start_with(SpawnOptions::new(2).timeout(deadline)).unwrap_or_else(|e| panic!("{e}"));
    keep_x(&world);
    let start = Instant::now();
    let error = world
        .on(&[1], |rank| {
            let mut x = rank.get::<Tensor>("x")?.copy();
            rank.pg().all_reduce(&mut x, ReduceOp::Sum)?; // rank 0 is not in this cell
            Ok(())
        })
        .expect_err("rank 0 never joins");
    let waited = start.elapsed();
    assert!(waited >= deadline && waited < deadline * 20, "failed after {waited:?}, deadline {deadline:?}");
    let timeout = error.error_of(1).and_then(|e| e.downcast_ref::<DistError>());
    assert!(
        matches!(timeout, Some(DistError::Timeout { rank: 1, missing, .. }) if missing == &[0]),
        "{error}"
    );
    assert!(error.to_string().contains("rank(s) [0] skipped this closure"), "{error}");
    // The unfinished all_reduce went with the old group: the next one pairs up right.
    assert_eq!(all_reduce_x(&world), vec![sum_by_hand(2); 2]);
}

#[test]
fn status_says_who_is_busy_what_each_rank_keeps_and_its_last_error() {
    let world = start(2);
    keep_x(&world);
    let release = Arc::new(AtomicBool::new(false));
    std::thread::scope(|scope| {
        let held = release.clone();
        let cell = scope.spawn(|| {
            world.on(&[0], move |_rank| {
                while !held.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Ok(())
            })
        });
        let busy_since = Instant::now();
        while world.status().ranks[0].busy_in_cell.is_none() {
            assert!(busy_since.elapsed() < Duration::from_secs(30), "rank 0 never showed busy");
            std::thread::sleep(Duration::from_millis(5));
        }
        let status = world.status();
        assert_eq!(status.ranks[0].busy_in_cell, Some(2), "{status}");
        assert_eq!(status.ranks[1].busy_in_cell, None, "{status}");
        release.store(true, Ordering::SeqCst);
        cell.join().expect("the cell's thread").unwrap_or_else(|e| panic!("{e}"));
    });
    _ = world.on(&[1], |_rank| -> anyhow::Result<()> { anyhow::bail!("no data") });
    let text = world.status().to_string();
    assert_eq!(
        text.lines().skip(1).collect::<Vec<_>>(),
        [
            "  rank 0: idle; keeps x: Tensor",
            "  rank 1: idle; keeps x: Tensor; last error: cell 3: returned an error: no data"
        ],
        "{text}"
    );
    assert!(text.starts_with("World of 2 ranks (in-process), 3 cell(s) run, group made 2 time(s)"), "{text}");
}

/// Counts its drops, to see where kept values end.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn shutdown_and_drop_end_the_threads_and_what_they_keep() {
    let dropped = Arc::new(AtomicUsize::new(0));
    let world = start(3);
    let counter = dropped.clone();
    world
        .run(move |rank| {
            rank.keep("counted", Counted(counter.clone()));
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(dropped.load(Ordering::SeqCst), 0, "kept values live on after their cell");
    world.shutdown();
    assert_eq!(dropped.load(Ordering::SeqCst), 3, "shutdown drops every rank's value");
    let status = world.status();
    assert!(status.ranks.iter().all(|r| r.ended && r.kept.is_empty()), "{status}");
    let after = world.run(|_rank| Ok(())).expect_err("a shut-down world runs nothing");
    assert!(after.to_string().contains("shut down") && after.to_string().contains("World::start"), "{after}");
    world.shutdown(); // twice is fine

    let counter = dropped.clone();
    let world = start(2);
    world
        .run(move |rank| {
            rank.keep("counted", Counted(counter.clone()));
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
    drop(world);
    assert_eq!(dropped.load(Ordering::SeqCst), 5, "dropping the world ends its threads too");
}

#[test]
fn two_worlds_in_one_process_keep_their_own_ranks_groups_and_values() {
    let (small, large) = (start(2), start(3));
    keep_x(&small);
    keep_x(&large);
    // Interleaved cells: each world's sum is over its own ranks only.
    assert_eq!(all_reduce_x(&large), vec![sum_by_hand(3); 3]);
    assert_eq!(all_reduce_x(&small), vec![sum_by_hand(2); 2]);
    std::thread::scope(|scope| {
        let a = scope.spawn(|| all_reduce_x(&small));
        let b = scope.spawn(|| all_reduce_x(&large));
        assert_eq!(a.join().expect("small world"), vec![sum_by_hand(2); 2]);
        assert_eq!(b.join().expect("large world"), vec![sum_by_hand(3); 3]);
    });
    _ = small.run(|_rank| -> anyhow::Result<()> { anyhow::bail!("only the small world fails") });
    assert_eq!(large.status().groups_made, 1, "a failure in one world leaves the other's group alone");
    small.shutdown();
    assert_eq!(all_reduce_x(&large), vec![sum_by_hand(3); 3], "and so does a shutdown");
}

#[test]
fn sync_passes_on_a_healthy_world_and_bad_rank_lists_are_clear_errors() {
    let world = start(3);
    world.sync().unwrap_or_else(|e| panic!("{e}"));
    let missing = world.on(&[0, 5], |_rank| Ok(())).expect_err("rank 5 of 3");
    assert!(missing.to_string().contains("rank 5 does not exist in a world of 3 ranks"), "{missing}");
    let twice = world.on(&[1, 1], |_rank| Ok(())).expect_err("rank 1 twice");
    assert!(twice.to_string().contains("listed twice"), "{twice}");
    assert_eq!(world.status().cells, 1, "rejected lists run no cell");
}

#[test]
fn a_value_holding_the_old_group_fails_after_a_failed_cell_saying_why() {
    let world = start(2);
    world
        .run(|rank| {
            rank.keep("old group", rank.pg().clone()); // as a DDP wrapper would hold it
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
    _ = world.on(&[0], |_rank| -> anyhow::Result<()> { anyhow::bail!("rank 0 fails cell 2") });
    let outcome = world
        .run(|rank| {
            let old = rank.get::<ddp_workbook::dist::Group>("old group")?;
            let mut x = tensor_of(rank.rank());
            Ok(old.all_reduce(&mut x, ReduceOp::Sum).map_err(|e| e.to_string()))
        })
        .unwrap_or_else(|e| panic!("{e}"));
    let message = outcome[1].clone().expect_err("the old group is retired");
    assert!(message.contains("rank 0 returned an error: rank 0 fails cell 2"), "{message}");
    assert!(message.contains("then the World made a new group: rank.pg()"), "{message}");
    // The new group, from rank.pg(), works: the sum is the one added up here.
    assert_eq!(
        world
            .run(|rank| {
                let mut x = tensor_of(rank.rank());
                rank.pg().all_reduce(&mut x, ReduceOp::Sum)?;
                Ok(Vec::<f64>::try_from(&x)?)
            })
            .unwrap_or_else(|e| panic!("{e}")),
        vec![sum_by_hand(2); 2]
    );
}
