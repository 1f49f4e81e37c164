//! What a [`DistributedSampler`](super::DistributedSampler) is built from,
//! and why it refuses: its options, PyTorch's keyword arguments named at
//! every call (no `for_group(pg, len, true, seed, false)`), and its errors,
//! each saying what to change. The sampler itself is in `sampler.rs`.

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
