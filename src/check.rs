//! Checks that replicas agree: the helpers every chapter test, example and
//! notebook uses to compare model parameters across ranks, or with a model
//! trained by one process. Their errors are written for a learner: which rank,
//! which parameter, how far apart, and what to try.
//!
//! Used by `cargo test --test chapter_02` and every later chapter test.
//!
//! ```
//! use ddp_workbook::check::{compare_replicas, snapshot};
//! use ddp_workbook::tch::Tensor;
//!
//! let rank0 = snapshot(&[("w".to_string(), Tensor::from_slice(&[1.0, 2.0]))]);
//! let rank1 = snapshot(&[("w".to_string(), Tensor::from_slice(&[1.0, 2.5]))]);
//! let report = compare_replicas(&[rank0, rank1], 0.0).unwrap_err();
//! assert_eq!(report.largest_difference(), 0.5);
//! println!("{report}"); // rank 1, parameter `w`, 0.5 apart, what to try
//! ```

use std::fmt;

use crate::models::Named;
use tch::{Kind, Tensor};

/// Detached copies of named tensors: safe to keep after the model changes,
/// and safe to return from a rank thread (each copy owns its storage).
pub fn snapshot(named: &[Named]) -> Vec<Named> {
    tch::no_grad(|| named.iter().map(|(name, t)| (name.clone(), t.detach().copy())).collect())
}

/// Whether two tensors hold the same dtype, shape and bits: what "bitwise
/// the same" means. Unlike comparing values, -0.0 and +0.0 differ, and a NaN
/// equals an identical NaN.
pub fn same_bits(a: &Tensor, b: &Tensor) -> bool {
    a.kind() == b.kind() && a.size() == b.size() && tensor_bytes(a) == tensor_bytes(b)
}

/// A tensor's raw bytes, in row-major order.
pub fn tensor_bytes(tensor: &Tensor) -> Vec<u8> {
    let tensor = tensor.contiguous();
    let numel = tensor.numel();
    let mut bytes = vec![0u8; numel * tensor.kind().elt_size_in_bytes()];
    tensor.copy_data_u8(&mut bytes, numel);
    bytes
}

/// The largest absolute difference between two tensors of the same shape,
/// computed in f64. Returns infinity when the shapes differ and NaN when
/// either tensor holds a NaN, so that neither can pass as "close".
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    if a.size() != b.size() {
        return f64::INFINITY;
    }
    if a.numel() == 0 {
        return 0.0;
    }
    tch::no_grad(|| {
        let a = a.to_kind(Kind::Double);
        let b = b.to_kind(Kind::Double);
        if a.isnan().any().int64_value(&[]) != 0 || b.isnan().any().int64_value(&[]) != 0 {
            return f64::NAN;
        }
        // Equal infinities are equal values; inf - inf would give NaN.
        if a.equal(&b) {
            return 0.0;
        }
        (&a - &b).abs().max().double_value(&[]) // a 0-dim tensor
    })
}

/// One thing that is wrong with one tensor on one rank.
#[derive(Clone, Debug, PartialEq)]
pub enum Problem {
    /// The values are further apart than the tolerance (or NaN).
    Values {
        max_abs_diff: f64,
    },
    Shape {
        expected: Vec<i64>,
        found: Vec<i64>,
    },
    Dtype {
        expected: Kind,
        found: Kind,
    },
    /// The reference has this tensor; the compared side does not.
    Missing,
    /// The compared side has this tensor; the reference does not.
    Unexpected,
}

/// Where a difference was found.
#[derive(Clone, Debug, PartialEq)]
pub struct Difference {
    /// The rank whose tensor differs, or `None` when comparing one model
    /// with a single-process reference.
    pub rank: Option<usize>,
    pub parameter: String,
    pub problem: Problem,
}

/// What was compared with what.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Comparison {
    /// Every rank's tensors against rank 0's.
    Replicas,
    /// A DDP model against one process trained on the global batch.
    Reference,
}

/// Why two sets of parameters do not agree. Its `Display` is meant to be
/// the panic message of a failing test.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplicaReport {
    pub comparison: Comparison,
    pub tolerance: f64,
    /// Every tensor that differs, in rank order, then parameter order.
    pub differences: Vec<Difference>,
    /// What to try; a default one fits most cases, see [`ReplicaReport::hint`].
    pub hint: String,
}

impl ReplicaReport {
    fn new(comparison: Comparison, tolerance: f64, differences: Vec<Difference>) -> Self {
        let hint = match comparison {
            Comparison::Replicas => {
                "every rank must start from the same weights (same seed before \
                building the model) and apply the same update (all-reduce every gradient, then \
                divide by the world size) before optimizer.step()"
            }
            Comparison::Reference => {
                "the distributed step must equal one process on the whole \
                global batch: all-reduce every gradient with SUM and divide by the world size \
                (did you divide by the world size? did every rank take its own, equal-sized \
                slice of the batch?)"
            }
        };
        ReplicaReport { comparison, tolerance, differences, hint: hint.to_string() }
    }

    /// Replaces the advice at the end of the message with one that fits the
    /// test, e.g. `report.hint("did you divide by the world size?")`.
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = hint.into();
        self
    }

    /// The largest value difference in the report (infinity when a tensor is
    /// missing or has the wrong shape or dtype, NaN when values are NaN).
    pub fn largest_difference(&self) -> f64 {
        let mut largest: f64 = 0.0;
        for d in &self.differences {
            let diff = match d.problem {
                Problem::Values { max_abs_diff } => max_abs_diff,
                _ => f64::INFINITY,
            };
            if diff.is_nan() {
                return f64::NAN;
            }
            largest = largest.max(diff);
        }
        largest
    }
}

/// How many differences the message lists before it summarises the rest.
const LISTED: usize = 8;

impl fmt::Display for ReplicaReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.comparison {
            Comparison::Replicas => "the replicas differ from rank 0's",
            Comparison::Reference => "the distributed model differs from the single-process reference",
        };
        let n = self.differences.len();
        write!(f, "{what}: {n} tensor(s) beyond the tolerance {:e}", self.tolerance)?;
        write!(f, " (largest difference {:.3e})", self.largest_difference())?;
        for d in self.differences.iter().take(LISTED) {
            let place = match d.rank {
                Some(rank) => format!("rank {rank}, `{}`", d.parameter),
                None => format!("`{}`", d.parameter),
            };
            let problem = match &d.problem {
                Problem::Values { max_abs_diff } if max_abs_diff.is_nan() => {
                    "holds NaN (did training diverge? try a smaller learning rate)".to_string()
                }
                Problem::Values { max_abs_diff } => format!("max abs diff {max_abs_diff:.3e}"),
                Problem::Shape { expected, found } => format!("shape {found:?}, expected {expected:?}"),
                Problem::Dtype { expected, found } => format!("dtype {found:?}, expected {expected:?}"),
                Problem::Missing => "missing (the models do not have the same parameters)".to_string(),
                Problem::Unexpected => {
                    "not in the reference (the models do not have the same parameters)".to_string()
                }
            };
            write!(f, "\n  {place}: {problem}")?;
        }
        if n > LISTED {
            write!(f, "\n  ... and {} more", n - LISTED)?;
        }
        write!(f, "\n  what to try: {}", self.hint)
    }
}

impl std::error::Error for ReplicaReport {}

/// Compares `candidate` with `reference` tensor by tensor, matched by name.
fn differences(
    rank: Option<usize>,
    candidate: &[Named],
    reference: &[Named],
    tolerance: f64,
) -> Vec<Difference> {
    let mut found = Vec::new();
    let mut push =
        |parameter: &str, problem| found.push(Difference { rank, parameter: parameter.to_string(), problem });
    for (name, expected) in reference {
        let Some((_, actual)) = candidate.iter().find(|(n, _)| n == name) else {
            push(name, Problem::Missing);
            continue;
        };
        if actual.size() != expected.size() {
            push(name, Problem::Shape { expected: expected.size(), found: actual.size() });
        } else if actual.kind() != expected.kind() {
            push(name, Problem::Dtype { expected: expected.kind(), found: actual.kind() });
        } else {
            let diff = max_abs_diff(actual, expected);
            // NaN must fail too, and `NaN > tolerance` is false.
            if diff.is_nan() || diff > tolerance {
                push(name, Problem::Values { max_abs_diff: diff });
            }
        }
    }
    for (name, _) in candidate {
        if !reference.iter().any(|(n, _)| n == name) {
            push(name, Problem::Unexpected);
        }
    }
    found
}

/// Checks that every rank holds the same tensors as rank 0, within
/// `tolerance` (largest absolute difference; use 0.0 for "bitwise equal").
/// `per_rank[r]` is rank `r`'s list, e.g. a [`snapshot`] returned by
/// `spawn`.
pub fn compare_replicas(per_rank: &[Vec<Named>], tolerance: f64) -> Result<(), ReplicaReport> {
    let Some((rank0, others)) = per_rank.split_first() else {
        return Ok(());
    };
    let found: Vec<Difference> = others
        .iter()
        .enumerate()
        .flat_map(|(i, tensors)| differences(Some(i + 1), tensors, rank0, tolerance))
        .collect();
    if found.is_empty() {
        Ok(())
    } else {
        Err(ReplicaReport::new(Comparison::Replicas, tolerance, found))
    }
}

/// Checks that a DDP model's tensors (any rank's) equal those of one process
/// trained on the concatenated global batch, within `tolerance`.
pub fn compare_to_reference(
    ddp_params: &[Named],
    single_process_params: &[Named],
    tolerance: f64,
) -> Result<(), ReplicaReport> {
    let found = differences(None, ddp_params, single_process_params, tolerance);
    if found.is_empty() {
        Ok(())
    } else {
        Err(ReplicaReport::new(Comparison::Reference, tolerance, found))
    }
}

/// The largest difference between any rank's tensor and rank 0's: the number
/// to print next to a tolerance, or to prove that replicas really diverged.
/// Infinity when the ranks do not hold the same tensors; NaN if any value is.
pub fn max_replica_diff(per_rank: &[Vec<Named>]) -> f64 {
    match compare_replicas(per_rank, 0.0) {
        Ok(()) => 0.0,
        Err(report) => report.largest_difference(),
    }
}

/// The largest difference between a DDP model and the single-process
/// reference (see [`max_replica_diff`]).
pub fn max_reference_diff(ddp_params: &[Named], single_process_params: &[Named]) -> f64 {
    match compare_to_reference(ddp_params, single_process_params, 0.0) {
        Ok(()) => 0.0,
        Err(report) => report.largest_difference(),
    }
}
