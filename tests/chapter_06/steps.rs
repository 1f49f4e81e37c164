//! Chapter 06 tests, part 1: each of the three steps alone; `mark_ready`
//! under every order of the hooks. Compiled into `cargo test --test
//! chapter_06` (see `tests/chapter_06.rs`).

use std::sync::mpsc;
use std::sync::Mutex;
use std::time::Duration;

use super::common::run;
use ddp_workbook::ch06_overlap::{learner, Bucket, BucketProgress};
use ddp_workbook::tch::{Device, Kind, Tensor};

/// Buckets of the given members (indices into 7 parameters of 1 element).
fn layout(members: &[&[usize]]) -> Vec<Bucket> {
    let bucket = |params: &[usize]| Bucket {
        kind: Kind::Float,
        device: Device::Cpu,
        params: params.to_vec(),
        numel: params.len(),
    };
    members.iter().map(|m| bucket(m)).collect()
}

#[test]
fn mark_ready_returns_each_of_three_buckets_once_as_early_as_it_may() {
    // Bucket 0 = {6, 5}, bucket 1 = {4, 3, 2}, bucket 2 = {1, 0}.
    let buckets = layout(&[&[6, 5], &[4, 3, 2], &[1, 0]]);
    let mut progress = BucketProgress::new(&buckets, 7);
    let mut mark = |p: usize| learner::mark_ready(&mut progress, p);
    assert_eq!(mark(6), Vec::<usize>::new(), "your mark_ready: bucket 0 still waits for parameter 5");
    assert_eq!(mark(6), Vec::<usize>::new(), "your mark_ready: a second mark of parameter 6 must count once");
    assert_eq!(mark(1), Vec::<usize>::new(), "your mark_ready: bucket 2 is not complete");
    assert_eq!(
        mark(0),
        Vec::<usize>::new(),
        "your mark_ready let bucket 2 leave as soon as it was complete, before buckets 0 and 1: a rank \
         whose hooks complete bucket 0 first would pair its first all-reduce (bucket 0) with this \
         one (bucket 2). The order buckets leave in must be one that no order of the hooks can change"
    );
    assert_eq!(mark(5), vec![0], "your mark_ready: parameter 5 completes bucket 0, the first to leave");
    assert_eq!(mark(4), Vec::<usize>::new(), "your mark_ready: bucket 1 waits for 3 and 2");
    assert_eq!(mark(3), Vec::<usize>::new(), "your mark_ready: bucket 1 waits for 2");
    assert_eq!(
        mark(2),
        vec![1, 2],
        "your mark_ready: bucket 1 completes, and bucket 2, complete already and waiting for it, \
         must leave at once after it, as early as it may"
    );
    assert_eq!(mark(2), Vec::<usize>::new(), "your mark_ready: every bucket has left, each once");
    assert_eq!(progress.pending, vec![0, 0, 0], "your mark_ready: no bucket waits for anything");
    assert!(progress.ready.iter().all(|&r| r), "your mark_ready: every parameter is marked ready");
}

#[test]
fn launch_bucket_returns_before_the_all_reduce_has_finished() {
    // Rank 1 joins the all-reduce only after rank 0's launch_bucket has
    // returned. A launch_bucket that waited for the result would wait for
    // rank 1 forever; the deadline ends it, and this test says why.
    let (to_rank_1, launched) = mpsc::channel::<()>();
    let (to_rank_1, launched) = (Mutex::new(to_rank_1), Mutex::new(launched));
    let averages = run(2, |pg| {
        let rank = pg.rank();
        let value = 1.0 + rank as f64; // rank 0 has 1s and 2s, rank 1 has 2s and 4s
        let params: Vec<(String, Tensor)> = ["w", "b"]
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let p = Tensor::zeros([2, 3 - i as i64], (Kind::Double, Device::Cpu)).set_requires_grad(true);
                let loss = (&p * (value * (i as f64 + 1.0))).sum(Kind::Double); // d loss / d p = value * (i + 1)
                loss.backward();
                (name.to_string(), p)
            })
            .collect();
        let bucket = Bucket { kind: Kind::Double, device: Device::Cpu, params: vec![1, 0], numel: 10 };
        let mut buffer = Tensor::zeros([10], (Kind::Double, Device::Cpu));
        if rank == 1 {
            let arrived = launched.lock().unwrap().recv_timeout(Duration::from_secs(10));
            anyhow::ensure!(
                arrived.is_ok(),
                "rank 0's launch_bucket did not return before rank 1 joined the all-reduce: it must \
                 start the all-reduce with `all_reduce_async` and return its Work without waiting"
            );
        }
        let work = learner::launch_bucket(pg.as_ref(), &bucket, &mut buffer, &params)?;
        if rank == 0 {
            to_rank_1.lock().unwrap().send(()).expect("rank 1 listens");
        }
        learner::finish_bucket(pg.as_ref(), &bucket, &mut buffer, work, &params)?;
        Ok(params
            .iter()
            .map(|(_, p)| Vec::<f64>::try_from(p.grad().reshape([-1])).unwrap())
            .collect::<Vec<_>>())
    });
    for (rank, grads) in averages.iter().enumerate() {
        assert_eq!(grads[0], vec![1.5; 6], "rank {rank}: `w`'s gradient is the mean of 1 and 2");
        assert_eq!(grads[1], vec![3.0; 4], "rank {rank}: `b`'s gradient is the mean of 2 and 4");
    }
}

#[test]
fn launch_bucket_sends_zeros_for_a_missing_gradient_and_finish_leaves_it_missing() {
    let per_rank = run(2, |pg| {
        let rank = pg.rank();
        let with_grad = Tensor::zeros([3], (Kind::Double, Device::Cpu)).set_requires_grad(true);
        (&with_grad * (rank as f64 + 1.0)).sum(Kind::Double).backward(); // gradient 1 on rank 0, 2 on rank 1
        let without = Tensor::zeros([2], (Kind::Double, Device::Cpu)).set_requires_grad(true);
        let params = vec![("used".to_string(), with_grad), ("unused".to_string(), without)];
        let bucket = Bucket { kind: Kind::Double, device: Device::Cpu, params: vec![1, 0], numel: 5 };
        let mut buffer = Tensor::full([5], 7.0, (Kind::Double, Device::Cpu)); // last step's leftovers
        let work = learner::launch_bucket(pg.as_ref(), &bucket, &mut buffer, &params)?;
        learner::finish_bucket(pg.as_ref(), &bucket, &mut buffer, work, &params)?;
        let used = Vec::<f64>::try_from(params[0].1.grad()).unwrap();
        Ok((used, params[1].1.grad().defined(), Vec::<f64>::try_from(&buffer).unwrap()))
    });
    for (rank, (used, unused_defined, buffer)) in per_rank.into_iter().enumerate() {
        assert_eq!(used, vec![1.5; 3], "rank {rank}: the used parameter's gradient is the mean of 1 and 2");
        assert!(!unused_defined, "rank {rank}: a parameter without a gradient must keep none");
        assert_eq!(
            buffer,
            vec![0.0, 0.0, 1.5, 1.5, 1.5],
            "rank {rank}: the bucket holds zeros in the missing gradient's slot, then the average"
        );
    }
}

/// Every order of `items`, by Heap's algorithm.
fn permutations(items: &[usize]) -> Vec<Vec<usize>> {
    fn heap(k: usize, items: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if k <= 1 {
            out.push(items.clone());
            return;
        }
        for i in 0..k {
            heap(k - 1, items, out);
            let j = if k.is_multiple_of(2) { i } else { 0 };
            items.swap(j, k - 1);
        }
    }
    let mut out = vec![];
    heap(items.len(), &mut items.to_vec(), &mut out);
    out
}

#[test]
fn mark_ready_launches_the_same_buckets_in_the_same_order_whatever_order_the_hooks_fire_in() {
    // Bucket 0 = {5, 4}, bucket 1 = {3}, bucket 2 = {2, 1, 0}: 720 hook orders.
    let members: [&[usize]; 3] = [&[5, 4], &[3], &[2, 1, 0]];
    let buckets = layout(&members);
    for order in permutations(&[0, 1, 2, 3, 4, 5]) {
        let mut progress = BucketProgress::new(&buckets, 6);
        let (mut launched, mut ready) = (vec![], vec![]);
        for &param in &order {
            ready.push(param);
            let got = learner::mark_ready(&mut progress, param);
            // Computed another way: bucket b may leave once its members and
            // those of every bucket before it are ready; it leaves at the
            // first mark after which that holds.
            let complete = |b: usize| members[..=b].iter().all(|m| m.iter().all(|p| ready.contains(p)));
            let may_leave = (0..members.len()).take_while(|&b| complete(b)).count();
            let want: Vec<usize> = (launched.len()..may_leave).collect();
            assert_eq!(
                got, want,
                "hooks firing in the order {order:?}: after parameter {param}, your mark_ready returned \
                 {got:?}, the chapter expects {want:?}, because a bucket leaves as soon as all its members \
                 AND every bucket before it are ready, never earlier and never later: another rank whose \
                 hooks fire in another order must make the same all-reduces in the same order"
            );
            launched.extend(got);
        }
        assert_eq!(launched, vec![0, 1, 2], "hooks in the order {order:?}: every bucket leaves once");
    }
}
