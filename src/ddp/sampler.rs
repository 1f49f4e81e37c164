//! Spoiler: this file holds the reference answer to chapter 7's exercise,
//! `samples_per_rank` and `epoch_shard` (`src/ch07_sharding/exercise.rs`).
//! Working through the book? Write yours first; the book shows the parts of
//! this file you need, and the answer on the chapter's solution page.
//!
//! The distributed sampler: every rank trains on its own, equal part of each
//! epoch, with the semantics of PyTorch's `DistributedSampler` and, shuffled,
//! its very indices ([`permutation`] calls libtorch's `randperm` through
//! `randperm.cpp`). Chapter 7 of the book builds [`samples_per_rank`] and
//! [`shard_indices`]. What a sampler is built from, [`SamplerOptions`]
//! (PyTorch's keyword arguments, named at every call), and why it refuses
//! ([`SamplerError`]) are at the end.

use std::ffi::{c_char, CStr};

use tch::Tensor;

use crate::dist::ProcessGroup;

// ANCHOR: permutation
extern "C" {
    // src/ddp/randperm.cpp: `torch.randperm(n, generator=g)` with `g` a fresh
    // CPU generator seeded with `seed`; writes n numbers to `out`.
    fn ddp_randperm(n: i64, seed: u64, out: *mut i64, error: *mut c_char, error_len: usize) -> i32;
}

/// The numbers `0..len` in the order PyTorch's `DistributedSampler` draws
/// from `seed`: `g = torch.Generator(); g.manual_seed(seed);
/// torch.randperm(len, generator=g)`, by the same libtorch code. The
/// generator is made for this call alone, so every rank that calls it with
/// the same `len` and `seed` gets the same order, and the global generator
/// (`tch::manual_seed`, which draws initial weights and dropout) does not
/// move. The same order on every machine and run of this libtorch version.
pub fn permutation(len: usize, seed: u64) -> Vec<i64> {
    let mut order = vec![0i64; len];
    let mut error = [0 as c_char; 512];
    // SAFETY: `order` has room for `len` numbers; the shim writes at most
    // that many, and a NUL-terminated message into `error` on failure.
    let status =
        unsafe { ddp_randperm(len as i64, seed, order.as_mut_ptr(), error.as_mut_ptr(), error.len()) };
    if status != 0 {
        // Only an allocation of `len` numbers can fail here.
        let message = unsafe { CStr::from_ptr(error.as_ptr()) }.to_string_lossy();
        panic!("libtorch's randperm({len}) failed: {message}");
    }
    order
}
// ANCHOR_END: permutation

// ANCHOR: sampler
/// Hands each rank its own part of a data set of `dataset_len` examples,
/// every epoch, with the semantics of PyTorch's
/// `torch.utils.data.DistributedSampler`:
///
/// - with `shuffle`, the order of the whole data set is the [`permutation`]
///   drawn from `seed + epoch`: the same on every rank, and new every epoch
///   once you call [`set_epoch`](Self::set_epoch); without `shuffle` it is
///   `0, 1, 2, ...` every epoch;
/// - every rank gets the same number of examples, [`len`](Self::len): some
///   examples are handed out twice (`drop_last = false`), or some are left
///   out (`drop_last = true`), never both;
/// - read round by round (every rank's first index, in rank order, then
///   every rank's second, ...), the shards are that order from its start.
///
/// The sampler hands out indices, not data: look the rows up yourself, e.g.
/// with [`rows`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DistributedSampler {
    dataset_len: i64,
    num_replicas: usize,
    rank: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
    epoch: u64,
}

impl DistributedSampler {
    /// A sampler for rank `rank` of `num_replicas`, at epoch 0, ordering and
    /// cutting each epoch as `options` say. Pass the same `dataset_len` and
    /// `options` on every rank.
    pub fn with_options(
        dataset_len: i64,
        num_replicas: usize,
        rank: usize,
        options: SamplerOptions,
    ) -> Result<DistributedSampler, SamplerError> {
        let SamplerOptions { shuffle, seed, drop_last } = options;
        if num_replicas == 0 {
            return Err(SamplerError::NoReplicas);
        }
        if rank >= num_replicas {
            return Err(SamplerError::RankOutOfRange { rank, num_replicas });
        }
        if dataset_len < 0 {
            return Err(SamplerError::NegativeLength { dataset_len });
        }
        // PyTorch accepts these and hands every rank nothing; a training run
        // that silently does nothing is worse than an error.
        if dataset_len == 0 || (drop_last && (dataset_len as u64) < num_replicas as u64) {
            return Err(SamplerError::EmptyShards { dataset_len, num_replicas, drop_last });
        }
        Ok(DistributedSampler { dataset_len, num_replicas, rank, shuffle, seed, drop_last, epoch: 0 })
    }

    /// [`with_options`](Self::with_options) with this rank's place in `pg`:
    /// this rank's shard of a data set of `dataset_len` examples, e.g.
    /// `DistributedSampler::sharded(pg, len, SamplerOptions { seed, ..Default::default() })`.
    pub fn sharded(
        pg: &dyn ProcessGroup,
        dataset_len: i64,
        options: SamplerOptions,
    ) -> Result<DistributedSampler, SamplerError> {
        DistributedSampler::with_options(dataset_len, pg.world_size(), pg.rank(), options)
    }

    /// [`with_options`](Self::with_options) with PyTorch's positional
    /// arguments: `new(len, n, rank, shuffle, seed, drop_last)`.
    pub fn new(
        dataset_len: i64,
        num_replicas: usize,
        rank: usize,
        shuffle: bool,
        seed: u64,
        drop_last: bool,
    ) -> Result<DistributedSampler, SamplerError> {
        let options = SamplerOptions { shuffle, seed, drop_last };
        DistributedSampler::with_options(dataset_len, num_replicas, rank, options)
    }

    /// [`sharded`](Self::sharded) with positional arguments:
    /// `for_group(pg, len, shuffle, seed, drop_last)`.
    pub fn for_group(
        pg: &dyn ProcessGroup,
        dataset_len: i64,
        shuffle: bool,
        seed: u64,
        drop_last: bool,
    ) -> Result<DistributedSampler, SamplerError> {
        DistributedSampler::sharded(pg, dataset_len, SamplerOptions { shuffle, seed, drop_last })
    }

    /// Chooses the epoch whose order [`indices`](Self::indices) returns.
    /// Call it on every rank, with the same number, before each epoch:
    /// without it every epoch repeats epoch 0's order.
    pub fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }

    /// This rank's indices for the current epoch, in the order to visit them:
    /// [`len`](Self::len) of them, each in `0..dataset_len`.
    pub fn indices(&self) -> Vec<i64> {
        epoch_shard(self)
    }
}
// ANCHOR_END: sampler

impl DistributedSampler {
    /// The whole data set's order for the current epoch, before padding and
    /// sharding: the same list on every rank.
    pub fn epoch_order(&self) -> Vec<i64> {
        if self.shuffle {
            // seed + epoch, as PyTorch does: so seed s at epoch e + 1 shuffles
            // like seed s + 1 at epoch e. Use seeds far apart for unrelated runs.
            // Past u64::MAX the sum wraps around; PyTorch refuses such a seed.
            permutation(self.dataset_len as usize, self.seed.wrapping_add(self.epoch))
        } else {
            (0..self.dataset_len).collect()
        }
    }

    /// How many indices every rank gets per epoch: `ceil(dataset_len / N)`,
    /// or `floor(dataset_len / N)` with `drop_last`.
    pub fn len(&self) -> usize {
        samples_per_rank(self.dataset_len as usize, self.num_replicas, self.drop_last)
    }
    /// Always false: [`new`](Self::new) refuses samplers whose shards would be empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The number of indices handed out per epoch over all ranks:
    /// `len() * num_replicas`.
    pub fn total_size(&self) -> usize {
        self.len() * self.num_replicas
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn num_replicas(&self) -> usize {
        self.num_replicas
    }

    pub fn dataset_len(&self) -> i64 {
        self.dataset_len
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    pub fn shuffle(&self) -> bool {
        self.shuffle
    }

    pub fn drop_last(&self) -> bool {
        self.drop_last
    }
}

// ANCHOR: samples_per_rank
/// How many indices each of `num_replicas` ranks gets per epoch from a data
/// set of `dataset_len` examples; the same number for every rank. With
/// `drop_last`, no example is handed out twice in an epoch, and as few as
/// possible are left out; without it, every example is handed out, and as
/// few as possible twice.
pub fn samples_per_rank(dataset_len: usize, num_replicas: usize, drop_last: bool) -> usize {
    if drop_last {
        dataset_len / num_replicas // the incomplete last round is dropped
    } else {
        dataset_len.div_ceil(num_replicas) // the last round is completed by padding
    }
}
// ANCHOR_END: samples_per_rank

// ANCHOR: shard_indices
/// Rank `rank`'s shard of `order` (the whole data set's order for this
/// epoch, the same on every rank). The list is first made a multiple of
/// `num_replicas` long, by repeating its start (`drop_last = false`) or by
/// cutting its tail (`drop_last = true`); then rank `rank` takes positions
/// `rank, rank + num_replicas, rank + 2 * num_replicas, ...` of it.
pub fn shard_indices(order: &[i64], num_replicas: usize, rank: usize, drop_last: bool) -> Vec<i64> {
    let total_size = samples_per_rank(order.len(), num_replicas, drop_last) * num_replicas;
    // Position i of the padded list is order[i % len]: past the end it wraps
    // around to the start, as often as needed (a data set smaller than the
    // number of ranks wraps more than once). With drop_last, total_size <=
    // len, so the modulo never wraps and this just cuts the tail.
    let evened: Vec<i64> = (0..total_size).map(|i| order[i % order.len()]).collect();
    // Strided, as PyTorch's `indices[rank:total_size:num_replicas]`: each rank
    // gets examples from the whole list, and a rank's i-th index is the i-th
    // of its round, so the ranks' i-th micro-batches come from the same part
    // of the epoch.
    evened.into_iter().skip(rank).step_by(num_replicas).collect()
}
// ANCHOR_END: shard_indices

// ANCHOR: epoch_shard
/// This rank's indices for the sampler's current epoch, in the order to
/// visit them, `samples_per_rank(..)` of them. The epoch's order of the
/// whole data set is the same on every rank: `permutation(dataset_len,
/// seed + epoch)` when shuffling (PyTorch's rule), `0, 1, 2, ...`
/// otherwise. Read round by round (rank 0's first index, rank 1's first,
/// ..., then every rank's second, ...), all ranks' shards together are that
/// order from its start: where it runs out before the last round is full,
/// it goes on from its start again (`drop_last = false`); with `drop_last`,
/// the examples that do not fill a whole round are left out.
pub fn epoch_shard(sampler: &DistributedSampler) -> Vec<i64> {
    let order = sampler.epoch_order(); // the same list on every rank
    shard_indices(&order, sampler.num_replicas(), sampler.rank(), sampler.drop_last())
}
// ANCHOR_END: epoch_shard

// ANCHOR: rows
/// The rows of `tensor` at `indices`, in that order: `[indices.len(), ..]`,
/// a copy (rows picked one by one cannot be a view). Panics on an index
/// outside `0..tensor.size()[0]`.
pub fn rows(tensor: &Tensor, indices: &[i64]) -> Tensor {
    let index = Tensor::from_slice(indices).to_device(tensor.device()); // [indices.len()]
    tensor.index_select(0, &index) // [indices.len(), ..]
}
// ANCHOR_END: rows

/// How a [`DistributedSampler`] orders and cuts each epoch: PyTorch's
/// keyword arguments, named at every call, with its defaults
/// (`SamplerOptions::default()`: shuffled from seed 0, the tail padded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SamplerOptions {
    /// Draw each epoch's order from `seed + epoch`; else `0, 1, 2, ...`.
    pub shuffle: bool,
    pub seed: u64,
    /// Drop the tail that does not fill a last round of `num_replicas`;
    /// else pad it by repeating the start of the order.
    pub drop_last: bool,
}

impl Default for SamplerOptions {
    fn default() -> Self {
        SamplerOptions { shuffle: true, seed: 0, drop_last: false }
    }
}

/// Why a sampler could not be built. Each message says what to change.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SamplerError {
    #[error("a DistributedSampler needs at least one replica, got num_replicas = 0: pass pg.world_size()")]
    NoReplicas,

    #[error(
        "rank {rank} is not a rank of {num_replicas} replica(s) (ranks are 0..{num_replicas}): \
         pass pg.rank() and pg.world_size() of the same process group"
    )]
    RankOutOfRange { rank: usize, num_replicas: usize },

    #[error("the data set length must not be negative, got {dataset_len}")]
    NegativeLength { dataset_len: i64 },

    #[error(
        "{dataset_len} example(s) over {num_replicas} replica(s) leave every rank an empty shard \
         (drop_last = {drop_last}): an epoch would train on nothing. Use a larger data set, \
         fewer ranks, or drop_last = false (which pads by repeating examples)"
    )]
    EmptyShards { dataset_len: i64, num_replicas: usize, drop_last: bool },
}
