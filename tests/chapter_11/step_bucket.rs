//! Chapter 11 tests, part 2: `step_bucket` alone, on one bucket built by
//! hand, on 3 ranks. Compiled into `cargo test --test chapter_11` (see
//! `tests/chapter_11.rs`).
//!
//! The bucket holds 10 parameters padded to 12, 4 per rank. Rank r's
//! gradient of element i is (i + 1)(r + 1) + r², small integers whose sum is
//! exact in any order and whose mean is not: sum-then-divide, multiplying
//! the sum by 1/3, dividing each rank's part before the sum and NCCL's
//! average (each part times 1/3, then summed) each round some of them to
//! other bits (and a second division after either, "you divided twice",
//! is 3 times off), and AdamW's first moment, (1 - beta1) times the gradient,
//! keeps the difference. The group here averages as NCCL does (this
//! machine's backends sum then divide, which would hide `ReduceOp::Avg`).
//! The expected values come from one process: AdamW on the whole buffer with
//! the sum divided by 3. `diagnose_step_bucket` names what differs; the
//! training and checkpoint tests quote it when they fail. The control that
//! the ways of averaging really differ here is in `controls.rs`.

use ddp_workbook::ch11_zero::{learner, AdamWUpdate, Shard, ShardedBucket};
use ddp_workbook::check::{max_abs_diff, same_bits};
use ddp_workbook::dist::{DistError, Group, ProcessGroup, ReduceOp};
use ddp_workbook::tch::{Device, Kind, Tensor};

use crate::common::forwarding::{Forwarding, Intercept};
use crate::common::run;

const WORLD_SIZE: usize = 3;
const NUMEL: usize = 10;
const SHARD_LEN: usize = 4; // 10 elements on 3 ranks: 4 each, 2 of padding
const ADAMW: AdamWUpdate =
    AdamWUpdate { lr: 0.01, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.1, step: 1 };

/// A group whose `ReduceOp::Avg` is NCCL's for floating point: each rank's
/// values times 1/N, then summed. Every other call is the real group's.
struct NcclAverage;

impl Intercept for NcclAverage {
    fn reduce_scatter(&self, inner: &Group, tensor: &Tensor, op: ReduceOp) -> Result<Tensor, DistError> {
        match op {
            ReduceOp::Avg => {
                inner.reduce_scatter(&(tensor * (1.0 / inner.world_size() as f64)), ReduceOp::Sum)
            }
            op => inner.reduce_scatter(tensor, op),
        }
    }
}

fn vector(values: &[f64]) -> Tensor {
    Tensor::from_slice(values).to_kind(Kind::Double)
}

/// Rank `rank`'s gradients, padded: (i + 1)(rank + 1) + rank², then zeros.
fn gradients(rank: usize) -> Vec<f64> {
    let real = (0..NUMEL).map(|i| ((i + 1) * (rank + 1) + rank * rank) as f64);
    real.chain([0.0; SHARD_LEN * WORLD_SIZE - NUMEL]).collect()
}

/// The parameters before the step, padded.
fn parameters() -> Vec<f64> {
    let real = (0..NUMEL).map(|i| 0.5 - 0.125 * i as f64);
    real.chain([0.0; SHARD_LEN * WORLD_SIZE - NUMEL]).collect()
}

/// What each rank's bucket holds after its `step_bucket`.
struct AfterStep {
    param: Tensor,
    /// A view of `param` taken before the step: what the model's
    /// parameters see.
    model_view: Tensor,
    exp_avg: Tensor,
}

fn step_on_three_ranks() -> Vec<AfterStep> {
    run(WORLD_SIZE, |pg: Group| {
        let rank = pg.rank();
        let group = Forwarding { inner: pg, name: "local, averaging as NCCL", intercept: NcclAverage };
        let shard = Shard { padded_numel: SHARD_LEN * WORLD_SIZE, offset: rank * SHARD_LEN, len: SHARD_LEN };
        let zeros = || Tensor::zeros([SHARD_LEN as i64], (Kind::Double, Device::Cpu));
        let mut bucket = ShardedBucket {
            members: vec![],
            numel: NUMEL,
            shard,
            param: vector(&parameters()),
            grad: vector(&gradients(rank)),
            exp_avg: zeros(),
            exp_avg_sq: zeros(),
        };
        let model_view = bucket.param.narrow(0, 0, NUMEL as i64);
        learner::step_bucket(&group as &dyn ProcessGroup, &mut bucket, &ADAMW)?;
        Ok(AfterStep { param: bucket.param, model_view, exp_avg: bucket.exp_avg })
    })
}

/// AdamW in one process on the whole padded buffer with gradient `grad`:
/// the parameters and the first moment after the step.
pub(super) fn adamw_on_the_whole(grad: &Tensor) -> (Tensor, Tensor) {
    let mut param = vector(&parameters());
    let (mut m, mut v) = (grad.zeros_like(), grad.zeros_like());
    ADAMW.apply(&mut param, grad, &mut m, &mut v).expect("AdamW steps");
    (param, m)
}

/// The gradient each way of averaging gives, the right one first.
pub(super) fn averages() -> Vec<(&'static str, Tensor)> {
    let parts: Vec<Tensor> = (0..WORLD_SIZE).map(|r| vector(&gradients(r))).collect();
    let n = WORLD_SIZE as f64;
    let sum = parts.iter().skip(1).fold(parts[0].copy(), |acc, part| acc + part);
    let each = |f: &dyn Fn(&Tensor) -> Tensor| parts.iter().skip(1).fold(f(&parts[0]), |acc, p| acc + f(p));
    vec![
        ("sum, then divide by N", &sum / n),
        (
            "the gradients are N times too large: did step_bucket divide the reduce_scatter's sum by \
             the world size?",
            sum.copy(),
        ),
        (
            "step_bucket multiplied the sum by 1/N: x * (1/3) rounds differently from x / 3. Divide the \
             reduce_scatter's sum by the world size, as DDP does",
            &sum * (1.0 / n),
        ),
        (
            "step_bucket reduced with ReduceOp::Avg: NCCL's Avg multiplies each rank's values by 1/N \
             before it sums them (as this test's group does), which rounds differently from DDP. \
             Reduce-scatter with ReduceOp::Sum, then divide by the world size",
            each(&|p| p * (1.0 / n)),
        ),
        (
            "step_bucket divided each rank's gradients by N before the sum, which rounds differently \
             from DDP. Reduce-scatter with ReduceOp::Sum, then divide by the world size",
            each(&|p| p / n),
        ),
        (
            "you divided twice: step_bucket reduced with ReduceOp::Avg, which already divides (NCCL's \
             multiplies each rank's values by 1/N before the sum), and then divided the result by the \
             world size again. Reduce-scatter with ReduceOp::Sum, then divide by the world size, once",
            &each(&|p| p * (1.0 / n)) / n,
        ),
        (
            "you divided twice: step_bucket divided the reduce_scatter's sum by the world size twice. \
             Divide it once",
            &sum / n / n,
        ),
    ]
}

/// `Ok` if `step_bucket` on 3 ranks leaves every rank with the parameters
/// and moments of AdamW on the whole bucket with the mean gradient (sum,
/// then divide), bit for bit; else what differs and what is likely wrong.
pub(super) fn diagnose_step_bucket() -> Result<(), String> {
    let after = step_on_three_ranks();
    let moments = Tensor::cat(&after.iter().map(|a| a.exp_avg.shallow_clone()).collect::<Vec<_>>(), 0);
    let untouched = Tensor::zeros([(SHARD_LEN * WORLD_SIZE) as i64], (Kind::Double, Device::Cpu));
    if same_bits(&moments, &untouched) {
        return Err("step_bucket left bucket.exp_avg at zero: AdamW must update the moments of this \
                    rank's shard in place (pass &mut bucket.exp_avg, not a copy)"
            .into());
    }
    let averages = averages();
    let (expected_param, expected_m) = adamw_on_the_whole(&averages[0].1);
    if !same_bits(&moments, &expected_m) {
        let matched = averages.iter().skip(1).find(|(_, g)| same_bits(&moments, &adamw_on_the_whole(g).1));
        let off = max_abs_diff(&moments, &expected_m);
        return Err(match matched {
            Some((what, _)) => format!("the first moments are not AdamW's with sum / N: {what}"),
            None => format!(
                "the first moments of the shards differ by up to {off:e} from AdamW's with the gradient's \
                 sum over the ranks divided by the world size: reduce-scatter bucket.grad with \
                 ReduceOp::Sum, divide by pg.world_size(), and step this rank's shard with it"
            ),
        });
    }
    let before = vector(&parameters());
    for (rank, a) in after.iter().enumerate() {
        let own = |t: &Tensor| t.narrow(0, (rank * SHARD_LEN) as i64, SHARD_LEN as i64);
        let problem = if same_bits(&own(&a.param), &own(&before)) {
            "its own shard of bucket.param is unchanged: AdamW stepped a copy of the shard, and the copy \
             is not what was gathered. Step a view (bucket.param.narrow), or gather the stepped copy"
        } else if !same_bits(&a.param, &expected_param) {
            "bucket.param is not AdamW's update on every shard: copy all the gathered shards, in rank \
             order, into bucket.param"
        } else if !same_bits(&a.model_view, &expected_param.narrow(0, 0, NUMEL as i64)) {
            "bucket.param holds the update, but a view of it taken before the step (what the model's \
             parameters are) does not: write into bucket.param in place (f_copy_), do not replace it"
        } else {
            continue;
        };
        return Err(format!("rank {rank} of {WORLD_SIZE}: {problem}"));
    }
    Ok(())
}

#[test]
fn step_bucket_averages_as_ddp_and_updates_the_bucket_in_place() {
    diagnose_step_bucket().unwrap_or_else(|problem| {
        panic!(
            "step_bucket, one bucket of {NUMEL} elements on {WORLD_SIZE} ranks, against AdamW in one \
             process with the gradients' sum divided by {WORLD_SIZE} (tolerance 0): {problem}"
        )
    });
    println!(
        "step_bucket on {WORLD_SIZE} ranks: every rank's bucket and moments bitwise those of AdamW on the \
         whole bucket with sum / {WORLD_SIZE}, and no other way of averaging gives them"
    );
}

/// What is likely wrong when a run built on `step_bucket` takes other steps
/// than it should: what the one-bucket test above finds, or else `otherwise`.
pub(super) fn likely_cause(otherwise: &str) -> String {
    match diagnose_step_bucket() {
        Err(problem) => format!("step_bucket's own test (one bucket on {WORLD_SIZE} ranks) fails: {problem}"),
        Ok(()) => format!("step_bucket passes its own test on one bucket built by hand; {otherwise}"),
    }
}
