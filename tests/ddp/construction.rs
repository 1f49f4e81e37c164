//! What the finished wrapper does at construction, as PyTorch's
//! `DistributedDataParallel(module)` does: it checks that every rank holds
//! the same tensors, then gives every rank rank 0's parameters and buffers,
//! and buckets only the parameters that require grad, each tensor once. Each
//! test trains ranks that were seeded differently and compares them with one
//! process, seeded as rank 0, on the global batch; the strict check of
//! chapter 2 stays available as `InitSync::Verify`.

use super::common::{assert_matches_one_process, mse, run, spawn_options, Hints, Named, Step, TOLERANCE};
use ddp_workbook::check::snapshot;
use ddp_workbook::data::Regression;
use ddp_workbook::ddp::{BucketCaps, BucketingError, InitError, InitSync, SimpleDistributedDataParallelism};
use ddp_workbook::dist::{spawn_with, RankFailure};
use ddp_workbook::tch::nn::{Module, VarStore};
use ddp_workbook::tch::{Device, Kind, Tensor};
use ddp_workbook::with_seed;

const SMALL: BucketCaps = BucketCaps { cap_bytes: 256, first_cap_bytes: 64 };
const WORLD: usize = 2;
const ROWS_PER_RANK: i64 = 4;
const STEPS: usize = 3;
const LR: f64 = 0.1;
/// Rank r builds its model from seed `SEED + r`; the one process from `SEED`.
const SEED: i64 = 100;

/// Which of PyTorch's construction cases the test model shows.
#[derive(Clone, Copy, Default)]
struct Case {
    /// `decoder.weight` is `encoder.weight`: one tensor registered under two
    /// names and used by two layers (tied weights).
    tied: bool,
    /// `hidden.weight` is frozen after building (`set_requires_grad(false)`).
    frozen: bool,
    /// The non-trainable `shift` is drawn from the seed (zeros otherwise).
    random_buffer: bool,
}

/// in [4] -> encoder [6x4] -> tanh -> hidden [6x6] + bias -> tanh ->
/// decoder [6x4], transposed -> head [1x4] + bias, with the non-trainable
/// `shift` subtracted from the input first.
struct Net {
    encoder: Tensor,
    hidden: Tensor,
    hidden_bias: Tensor,
    decoder: Tensor,
    head: Tensor,
    head_bias: Tensor,
    shift: Tensor,
    /// The distinct tensors an optimizer steps, written out by hand so that
    /// the one-process reference does not lean on the library's lists.
    trained: Vec<Tensor>,
    /// Every tensor of the state, once, by the name the test compares.
    state: Vec<(String, Tensor)>,
}

impl Module for Net {
    fn forward(&self, xs: &Tensor) -> Tensor {
        let h = (xs - &self.shift).matmul(&self.encoder.tr()).tanh(); // [b, 6]
        let h = (h.matmul(&self.hidden.tr()) + &self.hidden_bias).tanh(); // [b, 6]
        h.matmul(&self.decoder).matmul(&self.head.tr()) + &self.head_bias // [b, 1]
    }
}

impl std::fmt::Debug for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Net")
    }
}

fn build(seed: i64, case: Case) -> (VarStore, Net) {
    with_seed(seed, || {
        let vs = VarStore::new(Device::Cpu);
        let root = vs.root();
        let random = |shape: &[i64]| Tensor::randn(shape, (Kind::Double, Device::Cpu)) * 0.5;
        let encoder = (&root / "encoder").add("weight", random(&[6, 4]), true);
        let hidden = (&root / "hidden").add("weight", random(&[6, 6]), true);
        let hidden_bias = (&root / "hidden").add("bias", random(&[6]), true);
        let decoder = if case.tied {
            (&root / "decoder").add("weight", encoder.shallow_clone(), true) // PyTorch: decoder.weight = encoder.weight
        } else {
            (&root / "decoder").add("weight", random(&[6, 4]), true)
        };
        let head = (&root / "head").add("weight", random(&[1, 4]), true);
        let head_bias = (&root / "head").add("bias", random(&[1]), true);
        let shift =
            if case.random_buffer { random(&[4]) } else { Tensor::zeros([4], (Kind::Double, Device::Cpu)) };
        let shift = root.add("shift", shift, false);
        if case.frozen {
            let _ = hidden.set_requires_grad(false); // after building, as a user freezes a layer
        }
        let mut trained = vec![encoder.shallow_clone()];
        if !case.frozen {
            trained.push(hidden.shallow_clone());
        }
        trained.push(hidden_bias.shallow_clone());
        if !case.tied {
            trained.push(decoder.shallow_clone());
        }
        trained.extend([head.shallow_clone(), head_bias.shallow_clone()]);
        let mut state = vec![
            ("encoder.weight", &encoder),
            ("hidden.weight", &hidden),
            ("hidden.bias", &hidden_bias),
            ("head.weight", &head),
            ("head.bias", &head_bias),
            ("shift", &shift),
        ];
        if !case.tied {
            state.push(("decoder.weight", &decoder));
        }
        let state = state.into_iter().map(|(n, t)| (n.to_string(), t.shallow_clone())).collect();
        let net = Net { encoder, hidden, hidden_bias, decoder, head, head_bias, shift, trained, state };
        (vs, net)
    })
}

/// Plain SGD over `params`, skipping a tensor without a gradient.
fn sgd_step(params: &[Tensor]) {
    tch::no_grad(|| {
        for p in params {
            let grad = p.grad();
            if grad.defined() {
                let _ = p.shallow_clone().g_sub_(&(&grad * LR));
            }
        }
    });
}

fn zero_grad(params: &[Tensor]) {
    for p in params {
        let mut grad = p.grad();
        if grad.defined() {
            let _ = grad.zero_();
        }
    }
}

fn data() -> Regression {
    Regression::new(1, ROWS_PER_RANK * WORLD as i64 * STEPS as i64, 4, 1, Kind::Double)
}

/// One process, seeded as rank 0, on each whole global batch.
fn one_process(case: Case) -> Vec<Step> {
    let (_vs, net) = build(SEED, case);
    let data = data();
    let global = ROWS_PER_RANK * WORLD as i64;
    (0..STEPS as i64)
        .map(|s| {
            zero_grad(&net.trained);
            let (x, y) = data.batch(s * global, global);
            let loss = mse(&net.forward(&x), &y);
            loss.backward();
            sgd_step(&net.trained);
            Step { params: snapshot(&net.state), grads: vec![], loss: loss.double_value(&[]), all_reduces: 0 }
        })
        .collect()
}

/// Each rank seeded `SEED + rank`, wrapped with `init_sync`, trained on its
/// shard of each global batch with SGD over `ddp.parameters()`: the state
/// after each step, and the names the wrapper averages.
fn ddp_ranks(case: Case) -> Vec<(Vec<Named>, Vec<String>)> {
    run(WORLD, |pg| {
        let rank = pg.rank() as i64;
        let (vs, net) = build(SEED + rank, case);
        let state: Vec<(String, Tensor)> =
            net.state.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect();
        let ddp = SimpleDistributedDataParallelism::with_bucket_caps(net, &vs, pg, SMALL)?;
        let params: Vec<Tensor> = ddp.parameters().iter().map(|(_, p)| p.shallow_clone()).collect();
        let names = ddp.parameters().iter().map(|(n, _)| n.clone()).collect();
        let data = data();
        let mut after = vec![];
        for s in 0..STEPS as i64 {
            zero_grad(&params);
            let (x, y) = data.batch(s * ROWS_PER_RANK * WORLD as i64 + rank * ROWS_PER_RANK, ROWS_PER_RANK);
            ddp.backward(&mse(&ddp.forward(&x), &y))?;
            sgd_step(&params);
            after.push(snapshot(&state));
        }
        Ok((after, names))
    })
}

const HINTS: Hints = Hints {
    replicas: "the wrapper must give every rank rank 0's parameters and buffers at construction",
    reference: "DDP must train as one process on the global batch, from rank 0's model",
};

/// Trains `case` on ranks seeded differently and compares with one process.
/// Returns the names the wrapper averages (on rank 0).
fn trains_as_one_process(name: &str, case: Case) -> Vec<String> {
    let (per_rank, mut names): (Vec<_>, Vec<_>) = ddp_ranks(case).into_iter().unzip();
    let largest = assert_matches_one_process(name, &per_rank, &one_process(case), TOLERANCE, &HINTS);
    println!("{name}: largest difference from one process {largest:e}");
    names.swap_remove(0)
}

#[test]
fn ranks_seeded_differently_get_rank_0s_model_and_train_as_one_process() {
    let names = trains_as_one_process("per-rank seeds", Case::default());
    let expected =
        ["encoder.weight", "hidden.weight", "hidden.bias", "decoder.weight", "head.weight", "head.bias"];
    assert_eq!(names, expected, "the parameters in registration order; `shift` is a buffer");
}

#[test]
fn a_non_trainable_tensor_is_broadcast_with_the_parameters() {
    trains_as_one_process("a random buffer", Case { random_buffer: true, ..Case::default() });
}

#[test]
fn a_parameter_frozen_after_building_is_broadcast_and_left_out_of_the_buckets() {
    let names = trains_as_one_process("a frozen parameter", Case { frozen: true, ..Case::default() });
    assert!(!names.contains(&"hidden.weight".to_string()), "a frozen parameter is not averaged: {names:?}");
}

#[test]
fn tied_weights_are_one_parameter_averaged_and_stepped_once() {
    let names = trains_as_one_process("tied weights", Case { tied: true, ..Case::default() });
    // Listed once, under the first of its two names in sorted order.
    let tied: Vec<&String> = names.iter().filter(|n| n.ends_with("coder.weight")).collect();
    assert_eq!(tied, ["decoder.weight"], "{names:?}");
}

#[test]
fn every_case_at_once_still_trains_as_one_process() {
    let all = Case { tied: true, frozen: true, random_buffer: true };
    trains_as_one_process("tied, frozen and a random buffer", all);
}

#[test]
fn init_sync_verify_refuses_ranks_seeded_differently_and_changes_nothing() {
    let result = spawn_with(spawn_options(WORLD), |pg| {
        let rank = pg.rank() as i64;
        let (vs, net) = build(SEED + rank, Case::default());
        let before = snapshot(&net.state);
        let state: Vec<(String, Tensor)> =
            net.state.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect();
        match SimpleDistributedDataParallelism::with_init_sync(net, &vs, pg, SMALL, InitSync::Verify) {
            Ok(_) => anyhow::bail!("rank {rank}: ranks seeded differently must be refused"),
            Err(error) => {
                let unchanged = before.iter().zip(&state).all(|((_, a), (_, b))| a.equal(b));
                Ok((
                    error.to_string(),
                    matches!(error, BucketingError::Init(InitError::ReplicaMismatch { .. })),
                    unchanged,
                ))
            }
        }
    })
    .unwrap_or_else(|e| panic!("{e}"));
    for (rank, (message, mismatch, unchanged)) in result.iter().enumerate() {
        assert!(mismatch, "rank {rank}: {message}");
        assert!(
            message.contains("set the same seed on every rank"),
            "rank {rank}: chapter 2's advice: {message}"
        );
        assert!(unchanged, "rank {rank}: the strict check must not change the model");
    }
}

#[test]
fn a_parameter_frozen_on_one_rank_only_is_refused_by_name() {
    let result = spawn_with(spawn_options(WORLD), |pg| {
        let (vs, net) = build(SEED, Case { frozen: pg.rank() == 1, ..Case::default() });
        SimpleDistributedDataParallelism::with_bucket_caps(net, &vs, pg, SMALL).map(|_| ())?;
        Ok(())
    });
    let error = result.expect_err("ranks whose buckets would differ must not train");
    for rank in 0..WORLD {
        let Some(RankFailure::Error(failure)) = error.failure_of(rank) else {
            panic!("rank {rank} must fail with an error: {error}")
        };
        let message = format!("{failure:#}");
        assert!(
            message.contains("`hidden.weight`") && message.contains("requires_grad"),
            "rank {rank}: the error must name the parameter and requires_grad: {message}"
        );
    }
}
