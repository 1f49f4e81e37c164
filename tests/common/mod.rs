//! tests/common: the fixture every chapter test shares, written once: the
//! run harness (ranks with a deadline), the optimizers, the models, one
//! process on the global batch as the reference, the check that compares a
//! DDP run with it, and the tolerance. Each `tests/chapter_NN.rs` says
//! `mod common;` and reads as the chapter's claims.
//!
//! Not a test binary of its own: cargo builds only `tests/*.rs` files as
//! tests, and this is `tests/common/mod.rs`.

#![allow(dead_code)] // every test binary uses its own part of the fixture

pub mod counting;
pub mod forwarding;

use std::time::Duration;

use ddp_workbook::check::{compare_replicas, compare_to_reference, max_reference_diff, snapshot};
use ddp_workbook::data::Regression;
use ddp_workbook::dist::{spawn_with, Group, SpawnOptions};
use ddp_workbook::models::{named_parameters, Mlp};
use ddp_workbook::tch::nn::{self, Module, OptimizerConfig, VarStore};
use ddp_workbook::tch::{Device, Kind, Reduction, Tensor};
use ddp_workbook::with_seed;

/// Named tensors, as `snapshot` returns them.
pub type Named = Vec<(String, Tensor)>;

/// Largest absolute difference allowed between DDP and one process on the
/// global batch, in f64. The maths is exact; only the order of the additions
/// differs (about 1e-16 relative). Tests print what they measured with
/// `-- --nocapture`.
pub const TOLERANCE: f64 = 1e-10;

/// Any collective that waits this long fails, so no test can hang.
pub const TIMEOUT: Duration = Duration::from_secs(20);

pub fn spawn_options(world_size: usize) -> SpawnOptions {
    quiet_libtorch_panics();
    SpawnOptions::new(world_size).timeout(TIMEOUT)
}

/// A learner's tch call that panics (`param.grad().copy()` on a parameter
/// without a gradient, say) carries libtorch's C++ stack in its message,
/// thirty lines of frames per rank. Print its cause in one line instead, and
/// every other panic (the tests' own reports) as it is.
pub fn quiet_libtorch_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            let payload = info.payload();
            let message = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied())
                .unwrap_or("(a panic without a message)");
            let text = if message.contains("Torch(\"") {
                ddp_workbook::dist::panic_in_words(message)
            } else {
                message.to_string()
            };
            let thread = std::thread::current();
            let location = info.location().map(|l| l.to_string()).unwrap_or_default();
            eprintln!("thread '{}' panicked at {location}:\n{text}", thread.name().unwrap_or("<unnamed>"));
        }));
    });
}

/// Runs `f` on `world_size` rank threads and returns what each returned; a
/// rank's failure fails the test with that rank's message.
pub fn run<T: Send>(world_size: usize, f: impl Fn(Group) -> anyhow::Result<T> + Sync) -> Vec<T> {
    spawn_with(spawn_options(world_size), f).unwrap_or_else(|error| {
        panic!(
            "a rank failed (if it says `not yet implemented: exercise chNN`, write that function \
             in src/chNN_*/exercise.rs): {error}"
        )
    })
}

/// The two optimizers every chapter proves its claims with: SGD has no
/// state, Adam's state would carry a wrong step into every later one.
#[derive(Clone, Copy, Debug)]
pub enum Optim {
    Sgd,
    Adam,
}

impl Optim {
    pub fn build(self, vs: &VarStore) -> anyhow::Result<nn::Optimizer> {
        Ok(match self {
            Optim::Sgd => nn::Sgd::default().build(vs, 0.1)?,
            Optim::Adam => nn::Adam::default().build(vs, 0.01)?,
        })
    }
}

/// The loss of every test: the mean squared error over the rows given.
pub fn mse(prediction: &Tensor, target: &Tensor) -> Tensor {
    prediction.mse_loss(target, Reduction::Mean) // []
}

/// An f64 MLP of `sizes` plus one trainable parameter, `unused`, that no loss
/// ever touches, so it never gets a gradient.
pub fn mlp_with_an_unused_parameter(seed: i64, sizes: &[i64]) -> (VarStore, Mlp) {
    with_seed(seed, || {
        let mut vs = VarStore::new(Device::Cpu);
        let mlp = Mlp::new(&vs.root(), sizes);
        let _unused = vs.root().randn("unused", &[3], 0.0, 1.0);
        vs.set_kind(Kind::Double);
        (vs, mlp)
    })
}

/// Global batch `s` of `data`: its rows `s * global_batch ..`, one per step.
pub fn global_batches(data: &Regression, global_batch: i64, steps: usize) -> Vec<(Tensor, Tensor)> {
    (0..steps as i64).map(|s| data.batch(s * global_batch, global_batch)).collect()
}

/// Detached copies of the parameters' gradients; a parameter without one is
/// left out.
pub fn gradients(params: &[(String, Tensor)]) -> Named {
    let defined: Named =
        params.iter().map(|(name, p)| (name.clone(), p.grad())).filter(|(_, g)| g.defined()).collect();
    snapshot(&defined)
}

/// One optimizer step as a rank (or the reference) saw it: the weights after
/// it, the gradient it stepped with, the loss, and the all-reduces it made.
pub struct Step {
    pub params: Named,
    pub grads: Named,
    pub loss: f64,
    pub all_reduces: u64,
}

/// One process, one model, one whole global batch per optimizer step: what
/// every DDP run must equal.
pub fn train_single_process<M: Module>(
    build: impl Fn() -> (VarStore, M),
    optim: Optim,
    batches: &[(Tensor, Tensor)],
) -> Vec<Step> {
    let (vs, model) = build();
    let mut optimizer = optim.build(&vs).expect("the optimizer builds");
    let mut steps = vec![];
    for (x, y) in batches {
        optimizer.zero_grad();
        let loss = mse(&model.forward(x), y); // the mean over the whole global batch
        loss.backward();
        optimizer.step();
        let params = named_parameters(&vs);
        let loss = loss.double_value(&[]);
        steps.push(Step { params: snapshot(&params), grads: gradients(&params), loss, all_reduces: 0 });
    }
    steps
}

/// What to tell the learner when a comparison fails.
pub struct Hints<'a> {
    /// When the ranks disagree with each other.
    pub replicas: &'a str,
    /// When the ranks agree but not with one process.
    pub reference: &'a str,
}

/// The two claims of every chapter, after every step: all ranks hold bitwise
/// the same parameters, and rank 0's equal one process's within `tolerance`.
/// `per_rank[r][s]` is rank r's parameters after step s. Returns the largest
/// difference from one process.
pub fn assert_matches_one_process(
    case: &str,
    per_rank: &[Vec<Named>],
    reference: &[Step],
    tolerance: f64,
    hints: &Hints,
) -> f64 {
    let mut largest: f64 = 0.0;
    for (s, expected) in reference.iter().enumerate() {
        let after: Vec<Named> = per_rank.iter().map(|steps| snapshot(&steps[s])).collect();
        compare_replicas(&after, 0.0)
            .unwrap_or_else(|report| panic!("{case}, after step {}: {}", s + 1, report.hint(hints.replicas)));
        compare_to_reference(&after[0], &expected.params, tolerance).unwrap_or_else(|report| {
            panic!("{case}, rank 0 after step {}: {}", s + 1, report.hint(hints.reference))
        });
        largest = largest.max(max_reference_diff(&after[0], &expected.params));
    }
    largest
}
