//! Chapter 02 tests: identical replicas. Every rank must hold bitwise the
//! same model, and the chapter's `SimpleDistributedDataParallelism::new`
//! (the library's `Replicated` core with your `verify_replicas`) must
//! refuse, on every rank at once, to wrap replicas that differ; once
//! wrapped, identical local steps keep the replicas equal.
//!
//! Your code:           `cargo test --test chapter_02`
//! The reference code:  `cargo test --features solutions --test chapter_02`
//! See the messages:    add `-- --nocapture`
//! `chapter_02/several_ranks.rs`: several ranks that differ at once;
//! `chapter_02/training.rs`: the replicas after `optimizer.step()`;
//! `chapter_02/controls.rs`: the control, which never runs your code.

mod common;
// `#[path]`, because a module file directly in `tests/` would be built as a
// test binary of its own.
#[path = "chapter_02/controls.rs"]
mod controls;
#[path = "chapter_02/several_ranks.rs"]
mod several_ranks;
#[path = "chapter_02/training.rs"]
mod training;

use std::time::{Duration, Instant};

use ddp_workbook::ch02_replicas::{learner, InitError, SimpleDistributedDataParallelism};
use ddp_workbook::check::{compare_replicas, max_abs_diff, max_replica_diff, snapshot};
use ddp_workbook::dist::Group;
use ddp_workbook::models::{named_buffers, named_parameters, Mlp};
use ddp_workbook::tch::nn::Module;
use ddp_workbook::tch::{self, Kind, Tensor};

const SIZES: &[i64] = &[4, 16, 16, 1];
const SEED: i64 = 7;
/// A run that fails must have failed by itself, well before the timeout
/// (`common::TIMEOUT`) after which any collective gives up.
const PROMPTLY: Duration = Duration::from_secs(10);

/// `common::run`, timed.
fn run<T: Send>(world_size: usize, f: impl Fn(Group) -> anyhow::Result<T> + Sync) -> (Vec<T>, Duration) {
    let start = Instant::now();
    let results = common::run(world_size, f);
    (results, start.elapsed())
}

/// Wraps the model and returns the wrapper's error, if any, as a value.
fn wrap(vs: &tch::nn::VarStore, mlp: Mlp, pg: Group) -> Option<InitError> {
    SimpleDistributedDataParallelism::new(mlp, vs, pg).err()
}

/// Fails, saying why, if checking the replicas changed a tensor.
fn assert_unchanged(rank: usize, before: &[(String, Tensor)], after: &[(String, Tensor)]) {
    for ((name, was), (_, is)) in before.iter().zip(after) {
        let moved = max_abs_diff(was, is);
        assert!(
            moved == 0.0,
            "rank {rank}: your verify_replicas changed `{name}` by {moved:e}; the chapter expects every \
             tensor left as it was: broadcast rank 0's values into a copy, not into the tensor itself \
             (which also makes every comparison pass)"
        );
    }
}

/// Why an error other than `ReplicaMismatch` came back, when the cause is
/// the usual one: a collective that found a peer gone means that some rank
/// returned its verdict alone while the others went on comparing.
fn why_not_a_mismatch(error: &InitError) -> &'static str {
    match error {
        InitError::Dist(_) => {
            ". A collective failed instead: a rank returned its error while its peers went on \
             comparing, and their next call found it gone. Every rank must learn what every other \
             rank found before any of them decides (the chapter's \"Decide together\")"
        }
        InitError::ReplicaMismatch { .. } => "",
    }
}

fn all_tensors(vs: &tch::nn::VarStore) -> Vec<(String, Tensor)> {
    let mut tensors = snapshot(&named_parameters(vs));
    tensors.extend(snapshot(&named_buffers(vs)));
    tensors
}

#[test]
fn same_seed_on_every_rank_passes_and_the_replicas_match() {
    let (per_rank, _) = run(3, |pg| {
        let (vs, mlp) = Mlp::seeded(SEED, SIZES, Kind::Double);
        let expected_output = mlp.forward(&Tensor::ones([2, 4], (Kind::Double, tch::Device::Cpu)));
        let rank = pg.rank();
        let ddp = SimpleDistributedDataParallelism::new(mlp, &vs, pg).map_err(|e| {
            anyhow::anyhow!("rank {rank}: wrapping rejected replicas built from the same seed: {e}")
        })?;
        let output = ddp.forward(&Tensor::ones([2, 4], (Kind::Double, tch::Device::Cpu))); // [2, 1]
        anyhow::ensure!(
            output.equal(&expected_output),
            "rank {rank}: ddp.forward must run the wrapped model"
        );
        anyhow::ensure!(
            ddp.parameters().len() == 6 && ddp.buffers().len() == 1,
            "rank {rank}: wrong tensor lists"
        );
        let mut tensors = snapshot(ddp.parameters());
        tensors.extend(snapshot(ddp.buffers()));
        Ok(tensors)
    });
    compare_replicas(&per_rank, 0.0).unwrap_or_else(|report| panic!("{report}"));
}

#[test]
fn a_different_seed_on_one_rank_fails_on_every_rank_promptly() {
    let (outcomes, elapsed) = run(3, |pg| {
        let seed = if pg.rank() == 1 { SEED + 1 } else { SEED };
        let (vs, mlp) = Mlp::seeded(seed, SIZES, Kind::Double);
        let before = all_tensors(&vs);
        let error = wrap(&vs, mlp, pg);
        Ok((before, all_tensors(&vs), error))
    });
    assert!(
        elapsed < PROMPTLY,
        "wrapping took {elapsed:?}: did a rank wait for a peer that had already returned?"
    );
    // The first parameter in registration order already differs (tch's
    // `linear` creates the bias before the weight): the error must name it.
    let (first, _) = &outcomes[0].0[0];
    assert_eq!(first, "layers.0.bias", "the Mlp's first parameter changed; update this test");
    let expected_diff = max_abs_diff(&outcomes[1].0[0].1, &outcomes[0].0[0].1);
    assert!(expected_diff > 0.0, "seeds {SEED} and {} built the same weights?", SEED + 1);
    for (rank, (before, after, error)) in outcomes.iter().enumerate() {
        // First, because a check that broadcasts into the weights themselves
        // also makes every comparison pass: say that, not what follows from it.
        assert_unchanged(rank, before, after);
        let Some(error) = error else {
            panic!(
                "rank {rank}: wrapping accepted replicas built from different seeds (rank 1 used {}). \
                 Every rank must return the error, or some ranks go on training alone: \
                 let every rank learn what every rank found, and decide from all of it (the chapter's \
                 \"Decide together\")",
                SEED + 1
            );
        };
        let message = error.to_string();
        if rank == 0 {
            println!("rank 0's error:\n{message}");
        }
        let InitError::ReplicaMismatch { parameter, max_abs_diff: diff, differing_ranks } = error else {
            panic!(
                "rank {rank}: expected InitError::ReplicaMismatch, got: {message}{}",
                why_not_a_mismatch(error)
            );
        };
        assert_eq!(parameter, first, "rank {rank}: report the FIRST tensor that differs, in the order given");
        assert_eq!(differing_ranks, &[1], "rank {rank}: only rank 1 was built from another seed");
        assert_eq!(
            *diff, expected_diff,
            "rank {rank}: max_abs_diff must be the largest |rank 1 - rank 0| of that tensor"
        );
        for needle in [first.as_str(), &format!("{expected_diff:.3e}"), "seed", "before building the model"] {
            assert!(
                message.contains(needle),
                "rank {rank}: the message should mention {needle:?}: {message}"
            );
        }
    }
}

#[test]
fn a_buffer_that_differs_on_one_rank_is_caught_and_named() {
    let (errors, elapsed) = run(2, |pg| {
        let (vs, mlp) = Mlp::seeded(SEED, SIZES, Kind::Double);
        if pg.rank() == 1 {
            // Buffers are model state outside autograd, such as batch norm's running mean.
            let (_, mut shift) =
                named_buffers(&vs).into_iter().find(|(name, _)| name == "input_shift").unwrap();
            let _ = tch::no_grad(|| shift.f_add_scalar_(0.5))?;
        }
        let before = all_tensors(&vs);
        let error = wrap(&vs, mlp, pg);
        Ok((before, all_tensors(&vs), error))
    });
    assert!(
        elapsed < PROMPTLY,
        "wrapping took {elapsed:?}: did a rank wait for a peer that had already returned?"
    );
    for (rank, (before, after, error)) in errors.iter().enumerate() {
        assert_unchanged(rank, before, after);
        match error {
            Some(InitError::ReplicaMismatch { parameter, max_abs_diff, differing_ranks }) => {
                assert_eq!(parameter, "input_shift", "rank {rank}: the buffer `input_shift` differs");
                assert_eq!(*max_abs_diff, 0.5, "rank {rank}: rank 1 added 0.5 to `input_shift`");
                assert_eq!(differing_ranks, &[1], "rank {rank}");
            }
            other => panic!(
                "rank {rank}: your verify_replicas gave {other:?} for the buffers, where rank 1's \
                 `input_shift` differs by 0.5; the chapter expects ReplicaMismatch on `input_shift`{}",
                match other {
                    Some(error @ InitError::Dist(_)) => why_not_a_mismatch(error),
                    _ => ", because buffers take part in the forward pass just like parameters",
                }
            ),
        }
    }
}

#[test]
fn bits_decide_minus_zero_is_not_plus_zero_and_an_identical_nan_is_the_same() {
    // "Bitwise the same" is about bits, not values: -0.0 == +0.0 as numbers,
    // and NaN != NaN, so a comparison of values gets both cases wrong.
    let (verdicts, _) = run(2, |pg| {
        let rank = pg.rank();
        let zero = if rank == 1 { -0.0 } else { 0.0 };
        let signed_zero = vec![("w".to_string(), Tensor::from_slice(&[1.0, zero]))];
        let same_nan = vec![("w".to_string(), Tensor::from_slice(&[f64::NAN, 2.0]))];
        let on_zero = learner::verify_replicas(pg.as_ref(), &signed_zero).err().map(|e| e.to_string());
        let on_nan = learner::verify_replicas(pg.as_ref(), &same_nan).err().map(|e| e.to_string());
        Ok((on_zero, on_nan))
    });
    for (rank, (on_zero, on_nan)) in verdicts.iter().enumerate() {
        let message = on_zero.as_deref().unwrap_or_else(|| {
            panic!(
                "rank {rank}: your verify_replicas passed +0.0 on rank 0 against -0.0 on rank 1; the \
                 chapter expects a ReplicaMismatch, because the replicas must be bitwise the same \
                 (decide with check::same_bits, not by the size of the difference)"
            )
        });
        assert!(message.contains("rank(s) [1]"), "rank {rank}: the message must name rank 1: {message}");
        assert!(
            on_nan.is_none(),
            "rank {rank}: your verify_replicas refused bitwise-identical NaN weights: {on_nan:?}; the \
             chapter expects them to pass, since their bits are the same (decide with check::same_bits)"
        );
    }
}

#[test]
fn a_model_changed_on_one_rank_is_a_clear_error_on_every_rank_not_a_hang() {
    // (what changes on rank 1, its sizes, its dtype, what every rank's message
    // must say, what rank 1's message must say about its own model)
    let cases: [(&str, &[i64], Kind, &str, &str); 3] = [
        ("an extra layer", &[4, 16, 16, 16, 1], Kind::Double, "numbers of parameters: [6, 8]", "[6, 8]"),
        ("a resized layer", &[4, 32, 16, 1], Kind::Double, "parameter #0 is `layers.0.bias`", "Double[32]"),
        ("another dtype", SIZES, Kind::Float, "parameter #0 is `layers.0.bias`", "Float[16]"),
    ];
    for (change, rank1_sizes, rank1_kind, needle, rank1_needle) in cases {
        let (errors, elapsed) = run(2, |pg| {
            // First the same model everywhere: this must pass.
            let (vs, mlp) = Mlp::seeded(SEED, SIZES, Kind::Double);
            if let Some(error) = wrap(&vs, mlp, pg.clone()) {
                anyhow::bail!("rank {}: wrapping rejected identical replicas: {error}", pg.rank());
            }
            // Then a model built differently on rank 1.
            let (sizes, kind) =
                if pg.rank() == 1 { (rank1_sizes, rank1_kind) } else { (SIZES, Kind::Double) };
            let (vs, mlp) = Mlp::seeded(SEED, sizes, kind);
            Ok(wrap(&vs, mlp, pg).map(|e| e.to_string()))
        });
        assert!(
            elapsed < PROMPTLY,
            "{change}: wrapping took {elapsed:?}, so some rank waited for a peer that never came"
        );
        for (rank, error) in errors.iter().enumerate() {
            let Some(message) = error else { panic!("{change} on rank 1: rank {rank}'s wrapping passed") };
            println!("{change} on rank 1, rank {rank}'s error:\n{message}");
            let own = if rank == 1 { rank1_needle } else { needle };
            for needle in [needle, own, "structure", "same way on every rank"] {
                assert!(
                    message.contains(needle),
                    "{change}, rank {rank}: the message should mention {needle:?}: {message}"
                );
            }
        }
    }
}

#[test]
fn a_model_changed_after_wrapping_goes_unnoticed_until_checked_again() {
    let (outcomes, _) = run(2, |pg| {
        let (vs, mlp) = Mlp::seeded(SEED, SIZES, Kind::Double);
        let rank = pg.rank();
        let ddp = SimpleDistributedDataParallelism::new(mlp, &vs, pg.clone())
            .map_err(|e| anyhow::anyhow!("rank {rank}: wrapping rejected identical replicas: {e}"))?;
        if rank == 1 {
            let (_, bias) = ddp.parameters().iter().find(|(name, _)| name == "layers.1.bias").unwrap();
            let mut bias = bias.shallow_clone(); // shares storage with the model's bias
            let _ = tch::no_grad(|| bias.f_add_scalar_(1e-3))?; // nothing stops this, nothing notices it
        }
        let recheck = learner::verify_replicas(pg.as_ref(), ddp.parameters()).err();
        Ok((snapshot(ddp.parameters()), recheck))
    });
    let (per_rank, rechecks): (Vec<_>, Vec<_>) = outcomes.into_iter().unzip();
    let drift = max_replica_diff(&per_rank);
    assert!(
        drift > 9e-4,
        "rank 1 changed `layers.1.bias` by 1e-3 after wrapping, yet the replicas differ by {drift:e}"
    );
    for (rank, recheck) in rechecks.iter().enumerate() {
        match recheck {
            Some(InitError::ReplicaMismatch { parameter, .. }) => {
                assert_eq!(parameter, "layers.1.bias", "rank {rank}")
            }
            other => panic!(
                "rank {rank}: checking again gave {other:?}; the chapter expects ReplicaMismatch on \
                 `layers.1.bias`, which rank 1 changed after wrapping"
            ),
        }
    }
}

#[test]
fn a_single_rank_passes_trivially() {
    let (ok, _) = run(1, |pg| {
        let (vs, mlp) = Mlp::seeded(SEED, SIZES, Kind::Double);
        Ok(wrap(&vs, mlp, pg).map(|e| e.to_string()))
    });
    assert_eq!(ok[0], None, "one rank always agrees with itself");
}
