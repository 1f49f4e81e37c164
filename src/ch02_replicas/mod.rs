//! Chapter 02: identical replicas. Before DDP trains anything, every rank
//! must hold exactly the same model. You write the check that proves it,
//! [`verify_replicas`], and [`SimpleDistributedDataParallelism::new`] runs it
//! on the parameters and the buffers of the model it wraps.
//!
//! Your code:           `cargo test --test chapter_02`
//! The reference code:  `cargo test --features solutions --test chapter_02`
//!
//! This file holds the part that is already solved: the error type, a check
//! that every rank has the same parameter names, shapes and dtypes (so that
//! your check compares like with like), and the wrapper itself.

use tch::nn::{self, Module};
use tch::Tensor;

use crate::dist::{DistError, Group, ProcessGroup};
use crate::models::{named_buffers, named_parameters};

pub mod exercise; // the file you edit
pub mod solution; // the reference solution

#[cfg(not(feature = "solutions"))]
use exercise as active;
#[cfg(feature = "solutions")]
use solution as active;

pub use active::verify_replicas;

// ANCHOR: init_error
/// Why the replicas could not be wrapped. Every rank returns the same error,
/// at the same tensor, so that no rank goes on training alone.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// A tensor's values differ between rank 0 and `differing_ranks`.
    #[error(
        "the replicas differ at construction: `{parameter}` on rank(s) {differing_ranks:?} \
         differs from rank 0's copy by up to {max_abs_diff:.3e} (largest absolute difference). \
         Every rank must start from the same weights: set the same seed on every rank before \
         building the model, e.g. `Mlp::seeded(seed, ..)` or \
         `ddp_workbook::with_seed(seed, || build_your_model())`, or broadcast rank 0's weights \
         to every rank before wrapping the model. Do not change the model (or its buffers) on \
         one rank only."
    )]
    ReplicaMismatch { parameter: String, max_abs_diff: f64, differing_ranks: Vec<usize> },

    /// A collective failed while comparing, most often because the ranks do
    /// not hold models of the same structure.
    #[error("{}", describe_dist_error(.0))]
    Dist(DistError),
}
// ANCHOR_END: init_error

// Not `#[from]`: that would also make the DistError the error's `source`, and
// `{:#}` would print its message twice.
impl From<DistError> for InitError {
    fn from(error: DistError) -> Self {
        InitError::Dist(error)
    }
}

fn describe_dist_error(error: &DistError) -> String {
    match error {
        DistError::Mismatch { .. } => format!(
            "the replicas cannot be compared because the models differ in structure: {error}. \
             Build the model the same way on every rank (same layers, same sizes, same dtype) \
             and do not add, remove or resize a layer on one rank only."
        ),
        _ => format!("a collective failed while comparing the replicas: {error}"),
    }
}

/// A 64-bit FNV-1a hash: a short fingerprint of a tensor's name, dtype and
/// shape that is the same on every rank and every run.
fn fingerprint(name: &str, tensor: &Tensor) -> i64 {
    let text = format!("{name}|{:?}|{:?}", tensor.kind(), tensor.size());
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash as i64
}

// ANCHOR: structure
/// Checks, before any value is compared, that every rank holds the same list
/// of tensors: the same count, and at each position the same name, dtype and
/// shape. Without it, a rank with an extra layer would pair its tensors with
/// the wrong tensors of its peers, or wait for a call its peers never make.
/// Every rank sees every rank's answer, so all of them fail together.
pub fn check_same_structure(
    pg: &dyn ProcessGroup,
    named: &[(String, Tensor)],
    what: &str,
) -> Result<(), InitError> {
    let mismatch =
        |detail: String| DistError::Mismatch { rank: pg.rank(), op: format!("the list of {what}"), detail };
    let counts = pg.all_gather(&Tensor::from(named.len() as i64))?; // world_size x []
    let counts: Vec<i64> = counts.iter().map(|c| c.int64_value(&[])).collect();
    if counts.iter().any(|&c| c != counts[0]) {
        let detail = format!("the ranks hold different numbers of {what}: {counts:?} (in rank order)");
        return Err(mismatch(detail).into());
    }
    if named.is_empty() {
        return Ok(());
    }
    let mine: Vec<i64> = named.iter().map(|(name, t)| fingerprint(name, t)).collect();
    let all = pg.all_gather(&Tensor::from_slice(&mine))?; // world_size x [count]
    let all: Vec<Vec<i64>> =
        all.iter().map(Vec::<i64>::try_from).collect::<Result<_, _>>().map_err(|source| {
            DistError::Torch { rank: pg.rank(), op: format!("comparing {what}"), source }
        })?;
    for (i, (name, tensor)) in named.iter().enumerate() {
        let differing: Vec<usize> = (0..all.len()).filter(|&r| all[r][i] != mine[i]).collect();
        if !differing.is_empty() {
            let detail = format!(
                "{} #{i} is `{name}` {:?}{:?} on rank {}, but not on rank(s) {differing:?} \
                 (they have a different name, dtype or shape there)",
                what.trim_end_matches('s'), // "parameter #2"
                tensor.kind(),
                tensor.size(),
                pg.rank()
            );
            return Err(mismatch(detail).into());
        }
    }
    Ok(())
}
// ANCHOR_END: structure

// ANCHOR: wrapper
/// A model replicated on every rank of a process group: chapter 2's first
/// piece of DDP. It owns the model and remembers its tensors in a fixed
/// order, the same on every rank.
pub struct SimpleDistributedDataParallelism<M: Module> {
    module: M,
    /// Trainable tensors, in registration order (shallow handles: they share
    /// storage with the model).
    parameters: Vec<(String, Tensor)>,
    /// Non-trainable tensors (buffers), sorted by name.
    buffers: Vec<(String, Tensor)>,
    process_group: Group,
}

impl<M: Module> SimpleDistributedDataParallelism<M> {
    /// Wraps `module`, whose variables live in `vs`, after checking that every
    /// rank of `pg` holds bitwise the same parameters and buffers. Every rank
    /// must call `new` (it runs collectives); on a mismatch every rank gets
    /// the same error.
    pub fn new(module: M, vs: &nn::VarStore, pg: Group) -> Result<Self, InitError> {
        let parameters = named_parameters(vs);
        let buffers = named_buffers(vs);
        check_same_structure(pg.as_ref(), &parameters, "parameters")?;
        verify_replicas(pg.as_ref(), &parameters)?;
        check_same_structure(pg.as_ref(), &buffers, "buffers")?;
        verify_replicas(pg.as_ref(), &buffers)?;
        Ok(SimpleDistributedDataParallelism { module, parameters, buffers, process_group: pg })
    }

    /// Runs the wrapped model: the forward pass needs no communication.
    pub fn forward(&self, xs: &Tensor) -> Tensor {
        self.module.forward(xs)
    }
}
// ANCHOR_END: wrapper

/// Named tensors in a fixed order, as `named_parameters` lists them.
pub type Named = Vec<(String, Tensor)>;

/// Chapter 2's construction check as later chapters reuse it: the parameters
/// (registration order) and buffers (by name) of `vs`, once the structure
/// check and the REFERENCE `verify_replicas` have shown that every rank holds
/// bitwise the same ones. Chapter 2's own `new` above calls your
/// `verify_replicas` instead.
pub fn verified_tensors(vs: &nn::VarStore, pg: &dyn ProcessGroup) -> Result<(Named, Named), InitError> {
    let parameters = named_parameters(vs);
    let buffers = named_buffers(vs);
    check_same_structure(pg, &parameters, "parameters")?;
    solution::verify_replicas(pg, &parameters)?;
    check_same_structure(pg, &buffers, "buffers")?;
    solution::verify_replicas(pg, &buffers)?;
    Ok((parameters, buffers))
}

impl<M: Module> SimpleDistributedDataParallelism<M> {
    /// The wrapped model (for example to save it on rank 0).
    pub fn module(&self) -> &M {
        &self.module
    }

    pub fn process_group(&self) -> &Group {
        &self.process_group
    }

    /// The trainable tensors, in registration order.
    pub fn parameters(&self) -> &[(String, Tensor)] {
        &self.parameters
    }

    /// The non-trainable tensors, sorted by name.
    pub fn buffers(&self) -> &[(String, Tensor)] {
        &self.buffers
    }
}
