//! Spoiler: this file holds the reference answer to chapter 2's exercise,
//! `verify_replicas` (`src/ch02_replicas/exercise.rs`). Working through the
//! book? Write yours first; the book shows the parts of this file you need,
//! and the answer on the chapter's solution page.
//!
//! Identical replicas: before DDP trains anything, every rank must hold
//! exactly the same model. [`check_same_structure`] proves that the ranks hold
//! the same list of tensors (names, dtypes, shapes); [`verify_replicas`]
//! proves that their values are bitwise rank 0's. Chapter 2 of the book
//! builds `verify_replicas`; this is the reference the library runs when
//! asked for the strict check ([`InitSync::Verify`]). By default the
//! finished wrapper does what PyTorch's `DistributedDataParallel` does
//! instead: after the same structure check, [`sync_module_states`] copies
//! rank 0's parameters and buffers to every rank ([`InitSync::Broadcast`]).

use tch::{nn, Tensor};

use crate::check::{max_abs_diff, same_bits};
use crate::dist::{DistError, ProcessGroup};
use crate::fingerprint::fnv1a;
use crate::models::Named;
use crate::models::{named_buffers, named_parameters};

// ANCHOR: init_error
/// Why the replicas could not be wrapped. Every rank returns the same error,
/// at the same tensor, so that no rank goes on training alone.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// A tensor's values differ between rank 0 and `differing_ranks`.
    #[error(
        "the replicas differ at construction: `{parameter}` on rank(s) {differing_ranks:?} \
         differs from rank 0's copy by up to {max_abs_diff:.3e} (largest absolute difference; 0 \
         means equal values with other bits, such as -0.0 against +0.0). \
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

/// A fingerprint of a tensor's name, dtype, shape and whether it requires
/// grad (a parameter frozen on one rank only would leave the ranks'
/// buckets different): the same on every rank and every run.
fn structure_fingerprint(name: &str, tensor: &Tensor) -> i64 {
    fnv1a(&format!("{name}|{:?}|{:?}|{}", tensor.kind(), tensor.size(), tensor.requires_grad()))
}

// ANCHOR: structure
/// Checks, before any value is compared, that every rank holds the same list
/// of tensors: the same count, and at each position the same name, dtype,
/// shape and `requires_grad`. Without it, a rank with an extra layer would pair its tensors with
/// the wrong tensors of its peers, or wait for a call its peers never make.
/// On a difference every rank fails, at the same position: none goes on
/// alone.
// ANCHOR_END: structure
// (The book shows the contract above and not the body: the body shares
// every rank's findings the way chapter 2's exercise must.)
pub fn check_same_structure(pg: &dyn ProcessGroup, named: &[Named], what: &str) -> Result<(), InitError> {
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
    let mine: Vec<i64> = named.iter().map(|(name, t)| structure_fingerprint(name, t)).collect();
    let all = pg.all_gather(&Tensor::from_slice(&mine))?; // world_size x [count]
    let all: Vec<Vec<i64>> =
        all.iter().map(Vec::<i64>::try_from).collect::<Result<_, _>>().map_err(|source| {
            DistError::Torch { rank: pg.rank(), op: format!("comparing {what}"), cause: source }
        })?;
    for (i, (name, tensor)) in named.iter().enumerate() {
        let differing: Vec<usize> = (0..all.len()).filter(|&r| all[r][i] != mine[i]).collect();
        if !differing.is_empty() {
            let frozen = if tensor.requires_grad() { "" } else { " (requires_grad false)" };
            let detail = format!(
                "{} #{i} is `{name}` {:?}{:?}{frozen} on rank {}, but not on rank(s) {differing:?} \
                 (they have a different name, dtype, shape or requires_grad there: freeze a \
                 parameter on every rank or on none)",
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

// ANCHOR: verify_replicas
/// Compares each tensor of `named` with rank 0's copy. Returns
/// [`InitError::ReplicaMismatch`] on every rank, at the first tensor where any
/// rank differs; leaves every tensor unchanged.
pub fn verify_replicas(pg: &dyn ProcessGroup, named: &[(String, Tensor)]) -> Result<(), InitError> {
    for (name, tensor) in named {
        // Receive rank 0's values into a copy: overwriting our own tensor
        // first would make every comparison pass (and change the model).
        let mut rank0_copy = tensor.detach().copy();
        pg.broadcast(&mut rank0_copy, 0)?;
        // Bits decide (-0.0 is not +0.0; an identical NaN is the same); the
        // largest difference in value is what the message shows.
        let differs = if same_bits(tensor, &rank0_copy) { 0.0 } else { 1.0 };
        let mine = Tensor::from_slice(&[differs, max_abs_diff(tensor, &rank0_copy)]); // [2]

        // One rank alone must not decide: if rank 1 returned an error while
        // rank 2 went on to the next tensor, rank 2 would wait for a peer
        // that never comes. So every rank learns every rank's verdict and
        // all of them take the same decision.
        let all = pg.all_gather(&mine)?; // world_size x [2]
        let all: Vec<(f64, f64)> = all.iter().map(|t| (t.double_value(&[0]), t.double_value(&[1]))).collect();
        let differing_ranks: Vec<usize> = (0..all.len()).filter(|&r| all[r].0 != 0.0).collect();
        if !differing_ranks.is_empty() {
            // The largest difference; NaN (a NaN weight) wins so that it shows.
            let largest = differing_ranks.iter().map(|&r| all[r].1).fold(0.0_f64, |a, d| {
                if a.is_nan() || d.is_nan() {
                    f64::NAN
                } else {
                    a.max(d)
                }
            });
            return Err(InitError::ReplicaMismatch {
                parameter: name.clone(),
                max_abs_diff: largest,
                differing_ranks,
            });
        }
    }
    Ok(())
}
// ANCHOR_END: verify_replicas

/// PyTorch's `_sync_module_states`, which `DistributedDataParallel` runs at
/// construction: copies rank 0's value of each tensor of `named` into every
/// rank's, in place. After [`check_same_structure`], so that every rank
/// receives into a tensor of the same dtype and shape. A rank that seeded
/// differently, or loaded a checkpoint alone, then holds rank 0's model.
pub fn sync_module_states(pg: &dyn ProcessGroup, named: &[Named]) -> Result<(), InitError> {
    for (_, tensor) in named {
        // The same memory outside autograd: libtorch refuses an in-place
        // write into a leaf that requires grad.
        let mut shared = tensor.detach();
        pg.broadcast(&mut shared, 0)?;
    }
    Ok(())
}

/// How a wrapper compares the replicas' values, or makes them equal:
/// [`verify_replicas`], [`sync_module_states`], or chapter 2's check through
/// `ddp::seams` (which alone exports this name).
pub type ReplicaCheck = fn(&dyn ProcessGroup, &[Named]) -> Result<(), InitError>;

/// How the finished wrapper makes sure, at construction, that every rank
/// starts from the same model (PyTorch's `init_sync`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InitSync {
    /// PyTorch's `DistributedDataParallel(init_sync=True)`, the default:
    /// check that every rank holds the same tensors (names, dtypes, shapes),
    /// then broadcast rank 0's parameters and buffers ([`sync_module_states`]).
    #[default]
    Broadcast,
    /// Chapter 2's strict check: the same structure check, then refuse, on
    /// every rank, a model whose values differ from rank 0's anywhere
    /// ([`verify_replicas`], [`InitError::ReplicaMismatch`]); nothing is
    /// changed. For a run that must prove its ranks built the same model.
    Verify,
}

impl InitSync {
    /// The function that compares (or copies) the values.
    pub fn check(self) -> ReplicaCheck {
        match self {
            InitSync::Broadcast => sync_module_states,
            InitSync::Verify => verify_replicas,
        }
    }
}

/// The parameters that require grad (registration order, each tensor once)
/// and the buffers (by name) of `vs`, once [`check_same_structure`] has shown
/// that every rank holds the same ones and `check` has compared their values
/// (or made them equal). A parameter frozen after building
/// (`set_requires_grad(false)`) is checked (or broadcast) with the others but
/// is not returned: autograd gives it no gradient, and PyTorch's DDP leaves it
/// out of its buckets too.
pub fn verified_tensors(
    vs: &nn::VarStore,
    pg: &dyn ProcessGroup,
    check: ReplicaCheck,
) -> Result<(Vec<Named>, Vec<Named>), InitError> {
    let parameters = named_parameters(vs);
    let buffers = named_buffers(vs);
    check_same_structure(pg, &parameters, "parameters")?;
    check(pg, &parameters)?;
    check_same_structure(pg, &buffers, "buffers")?;
    check(pg, &buffers)?;
    let trained = parameters.into_iter().filter(|(_, p)| p.requires_grad()).collect();
    Ok((trained, buffers))
}
