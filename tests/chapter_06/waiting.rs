//! Chapter 06 tests, the bucket belongs to the all-reduce until the wait.
//! The in-process all-reduce often finishes before `finish_bucket` even
//! starts, so a step that touches the bucket too early can pass by luck.
//! Here the process group's all-reduce takes the bucket as it is when
//! `all_reduce_async` is called, and delivers the sum into it only when its
//! `Work` is waited on, as a slow network would: a division or a copy placed
//! between the launch and the wait shows, every time.
//!
//! Compiled into `cargo test --test chapter_06` (see `tests/chapter_06.rs`).

use approx::relative_eq;
use ddp_workbook::ch06_overlap::{learner, Bucket};
use ddp_workbook::dist::{DistError, Group, ProcessGroup, ReduceOp, Work};
use ddp_workbook::tch::{self, Device, Kind, Tensor};

use super::common::forwarding::{Forwarding, ReplaceAllReduce};
use super::common::run;

/// An `all_reduce_async` that sends the tensor as it is at the call and
/// writes the result into it only at `wait()`.
fn late_all_reduce(group: &Group, tensor: &Tensor, op: ReduceOp) -> Result<Work, DistError> {
    let mut sent = tensor.copy(); // what travels: the bucket at the launch
    let mut target = tensor.shallow_clone(); // where the result lands, at the wait
    let group = group.clone();
    Ok(Work::new(move || {
        group.all_reduce(&mut sent, op)?;
        tch::no_grad(|| target.copy_(&sent));
        Ok(())
    }))
}

#[test]
fn the_bucket_is_read_and_divided_only_where_the_all_reduce_cannot_overwrite_it() {
    for world_size in [2, 3] {
        let per_rank = run(world_size, |group| {
            let pg = Forwarding {
                inner: group,
                name: "late-all-reduce",
                intercept: ReplaceAllReduce(late_all_reduce),
            };
            let own = 1.0 + pg.rank() as f64; // this rank's gradient, in every element
            let param = Tensor::zeros([2, 3], (Kind::Double, Device::Cpu)).set_requires_grad(true);
            (&param * own).sum(Kind::Double).backward();
            let params = vec![("w".to_string(), param)];
            let bucket = Bucket { kind: Kind::Double, device: Device::Cpu, params: vec![0], numel: 6 };
            let mut buffer = Tensor::zeros([6], (Kind::Double, Device::Cpu));
            let work = learner::launch_bucket(&pg, &bucket, &mut buffer, &params)?;
            // What launch_bucket left in the bucket: the gradients it copied
            // in, unless it changed them after starting the all-reduce.
            let launched = buffer.double_value(&[0]);
            learner::finish_bucket(&pg, &bucket, &mut buffer, work, &params)?;
            Ok((own, launched, Vec::<f64>::try_from(params[0].1.grad().reshape([-1]))?))
        });
        let n = world_size as f64;
        let sum: f64 = (1..=world_size).map(|r| r as f64).sum();
        let mean = sum / n;
        for (rank, (own, launched, grad)) in per_rank.iter().enumerate() {
            let got = grad[0];
            // Which function divided is told by the bucket as launch_bucket
            // left it: its own gradients, or already divided.
            let launch_divided = launched != own;
            let why = if got == sum && launch_divided {
                format!(
                    "the sum, undivided: your launch_bucket divided the bucket after all_reduce_async had \
                     started (it held {launched} when launch_bucket returned, not this rank's {own}), while \
                     the all-reduce still owned the bucket, and the sum it delivered at the wait overwrote \
                     the division. Divide before the all-reduce starts or, in finish_bucket, after the wait"
                )
            } else if got == sum {
                "the sum, undivided: your finish_bucket divided before work.wait(), while the all-reduce \
                 still owned the bucket, and the sum it delivered at the wait overwrote the division. \
                 Divide after the wait"
                    .to_string()
            } else if got == mean / n && launch_divided {
                "the mean divided by the world size once more: your launch_bucket divided before the \
                 all-reduce and your finish_bucket divided after the wait. Divide once, in one of them"
                    .to_string()
            } else if got == *own || got == own / n {
                "this rank's own gradient: your finish_bucket read the bucket before work.wait() had \
                 delivered the sum. Copy back only after the wait"
                    .to_string()
            } else {
                "neither the mean nor anything the chapter foresaw: check which slot your launch_bucket \
                 fills for each member and which one your finish_bucket reads"
                    .to_string()
            };
            assert!(
                relative_eq!(grad.as_slice(), [mean; 6].as_slice(), max_relative = 1e-12),
                "{world_size} ranks with gradients 1, 2{}: on an all-reduce that delivers its sum only \
                 at work.wait(), rank {rank}'s gradient is {got}, the mean is {mean}. It is {why}",
                if world_size == 3 { ", 3" } else { "" }
            );
        }
    }
}
