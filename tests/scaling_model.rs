//! The arithmetic of `examples/predict_scaling.rs`: its α–β ring and each
//! strategy's schedule, on small shapes whose steps are worked out by hand
//! in the comments. Run: `cargo test --test scaling_model`.

#[allow(dead_code)] // the example also prints names and makes the compute faster
#[path = "../examples/support/scaling_model.rs"]
mod scaling_model;

use scaling_model::{predict, Compute, Ring, Shape, Strategy};

/// 2 ranks, no latency, 1 GB/s: a collective of 4 MB moves 2 MB per step of the ring.
const RING: Ring = Ring { n: 2.0, alpha: 0.0, bytes_per_second: 1e9 };
/// 1 s of forward, 2 of backward, 0.5 of optimizer, in one micro-batch.
const COMPUTE: Compute = Compute { forward: 1.0, backward: 2.0, optimizer: 0.5, rest: 0.0 };

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

#[test]
fn the_ring_costs_chapter_1s_formula() {
    // 4 ranks, α = 1 µs, 1 GB/s, 4 MB: (N - 1)(α + n / (N B)) = 3 (1 µs + 1 ms).
    let ring = Ring { n: 4.0, alpha: 1e-6, bytes_per_second: 1e9 };
    assert!(close(ring.reduce_scatter(4e6), 3.003e-3), "{}", ring.reduce_scatter(4e6));
    assert!(close(ring.all_gather(4e6), 3.003e-3));
    assert!(close(ring.all_reduce(4e6), 6.006e-3), "{}", ring.all_reduce(4e6));
}

/// One block of 4 MB (stage 1: stages are the head, the block, the embeddings), in one bucket.
fn one_block() -> Shape {
    Shape {
        params: vec![(4e6, 1)],
        stage_share: vec![0.0, 1.0, 0.0],
        buckets: vec![(4e6, vec![0])],
        layers: 1,
    }
}

#[test]
fn ddp_with_one_bucket_hides_nothing() {
    // The bucket is ready when backward ends (1 + 2 = 3 s), its all-reduce
    // takes 2 (2 MB / 1 GB/s) = 4 ms, then the optimizer: 3.504 s.
    let p = predict(Strategy::Ddp, &one_block(), COMPUTE, RING, 1);
    assert!(close(p.step, 3.504), "step {}", p.step);
    assert!(close(p.bound, 3.5) && close(p.communication, 0.004));
    assert!(close(p.hidden_share(), 0.0), "hidden {}", p.hidden_share());
}

#[test]
fn ddp_hides_a_bucket_that_leaves_during_backward() {
    // Two blocks of 4 MB, each half the compute: block 1 (stage 1) is ready
    // at 2 s, its all-reduce ends at 2.004 s, under block 0's backward;
    // block 0's leaves at 3 s and ends at 3.004 s. Half the communication hidden.
    let shape = Shape {
        params: vec![(4e6, 2), (4e6, 1)],
        stage_share: vec![0.0, 0.5, 0.5, 0.0],
        buckets: vec![(4e6, vec![1]), (4e6, vec![0])],
        layers: 2,
    };
    let compute = Compute { optimizer: 0.0, ..COMPUTE };
    let p = predict(Strategy::Ddp, &shape, compute, RING, 1);
    assert!(close(p.step, 3.004), "step {}", p.step);
    assert!(close(p.hidden_share(), 0.5), "hidden {}", p.hidden_share());
}

#[test]
fn zero_1_steps_a_shard_then_gathers_the_parameters() {
    // DDP's 3.004 s, then half the optimizer (0.25 s), then an all-gather of
    // the 4 MB (2 ms): 3.256 s, none of it hidden.
    let p = predict(Strategy::Zero1, &one_block(), COMPUTE, RING, 1);
    assert!(close(p.step, 3.256), "step {}", p.step);
    assert!(close(p.communication, 0.006) && close(p.hidden_share(), 0.0));
}

#[test]
fn fsdp_gathers_twice_and_reduce_scatters_each_unit() {
    // Root (head 2 MB + embeddings 2 MB) and one block of 4 MB, 2 ms per
    // collective: gather the root, then the block (4 ms), forward 1 s,
    // gather the block again (1.006 s), backward 2 s (3.006 s), then the
    // reduce-scatters of the block and of the root: 3.010 s. With one block
    // there is nothing to prefetch under: five collectives, none hidden.
    let shape = Shape {
        params: vec![(2e6, 0), (4e6, 1), (2e6, 2)],
        stage_share: vec![0.0, 1.0, 0.0],
        buckets: vec![(8e6, vec![0, 1, 2])],
        layers: 1,
    };
    assert_eq!(shape.unit_bytes(), vec![4e6, 4e6], "the root's bytes, then the block's");
    let compute = Compute { optimizer: 0.0, ..COMPUTE };
    let p = predict(Strategy::Fsdp, &shape, compute, RING, 1);
    assert!(close(p.step, 3.010), "step {}", p.step);
    assert!(close(p.communication, 0.010) && close(p.hidden_share(), 0.0));
}
