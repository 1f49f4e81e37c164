//! The in-process backend's asynchronous all-reduce progresses on its own
//! (each rank's communication thread), and a simulated link makes every
//! all-reduce take the α–β model's time. Compiled into
//! `cargo test --test dist` (see `tests/dist.rs`).

use std::time::{Duration, Instant};

use ddp_workbook::dist::{spawn_with, ReduceOp, SimulatedLink, SpawnOptions};
use ddp_workbook::tch::{Device, Kind, Tensor};

#[test]
fn an_async_all_reduce_completes_while_the_rank_computes_without_waiting() {
    let results = spawn_with(SpawnOptions::new(2).timeout(Duration::from_secs(20)), |pg| {
        let t = Tensor::ones([1000], (Kind::Float, Device::Cpu));
        let work = pg.all_reduce_async(&t, ReduceOp::Sum)?;
        // "Compute" without calling wait: the sum must still arrive.
        let started = Instant::now();
        while t.double_value(&[999]) != 2.0 {
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(10),
                "rank {}: the all-reduce made no progress before wait() (no communication thread?)",
                pg.rank()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        work.wait()?;
        Ok(t.double_value(&[0]))
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(results, vec![2.0, 2.0]);
}

#[test]
fn the_link_time_is_the_alpha_beta_model_of_a_ring() {
    let link = SimulatedLink::new(Duration::from_micros(50), 10.0); // 10 Gbit/s = 1.25 GB/s
                                                                    // 2 ranks move 2 (N-1)/N n = n bytes: 1e6 bytes take 0.8 ms, plus 50 µs.
    assert_eq!(link.all_reduce_time(1_000_000, 2), Duration::from_micros(850));
    // 4 ranks move 1.5 n.
    assert_eq!(link.all_reduce_time(1_000_000, 4), Duration::from_micros(1250));
    assert_eq!(link.all_reduce_time(1_000_000, 1), Duration::ZERO, "one rank sends nothing");
}

#[test]
fn with_a_link_every_all_reduce_takes_at_least_the_link_time_and_stays_exact() {
    let link = SimulatedLink::new(Duration::from_millis(30), 1.0);
    let bytes = 250_000 * 4; // 1 MB of f32: 8 ms at 1 Gbit/s on 2 ranks, plus 30 ms
    let expected = link.all_reduce_time(bytes, 2);
    let options = SpawnOptions::new(2).timeout(Duration::from_secs(20)).link(link);
    let per_rank = spawn_with(options, |pg| {
        let mut t = Tensor::ones([250_000], (Kind::Float, Device::Cpu));
        let started = Instant::now();
        pg.all_reduce(&mut t, ReduceOp::Sum)?;
        let sync = started.elapsed();
        let started = Instant::now();
        pg.all_reduce_async(&t, ReduceOp::Sum)?.wait()?;
        Ok((sync, started.elapsed(), t.double_value(&[0])))
    })
    .unwrap_or_else(|e| panic!("{e}"));
    for (rank, (sync, asynchronous, value)) in per_rank.into_iter().enumerate() {
        assert!(
            sync >= expected && asynchronous >= expected,
            "rank {rank}: {sync:?}, {asynchronous:?} < {expected:?}"
        );
        assert_eq!(value, 4.0, "rank {rank}: two sums of two ranks' ones");
    }
}
