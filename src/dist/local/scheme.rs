//! Which of its two algorithms the in-process all_reduce uses for a call,
//! chosen by the tensor's size and the number of ranks, as NCCL and MPI
//! libraries choose theirs. The sweep that sets the threshold:
//! `cargo run --release --example bench_collectives -- --sweep`.
//!
//! - rank order: the last rank to arrive adds every rank's tensor into a new
//!   one, in rank order, and every rank copies it out (`slot.rs`). One
//!   wake-up per call, but one thread reads all N tensors.
//! - split: the ranks cut the tensors into blocks and each block is reduced
//!   and copied back by whichever rank claims it (`split_reduce.rs`). The
//!   work is shared, at the price of a second wait: for the last block.
//!
//! Both give the same bits: the sum of the inputs in rank order.

/// The in-process all_reduce's algorithm; [`Auto`](Self::Auto) unless a
/// benchmark forces one with `SpawnOptions::all_reduce_scheme`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AllReduceScheme {
    /// By size and rank count: [`split_wins`].
    #[default]
    Auto,
    /// One rank sums all contributions in rank order, into a new tensor.
    RankOrder,
    /// Blocks reduced in place by whichever rank claims them.
    Split,
}

/// Below this many bytes per tensor the rank-order sum is faster when
/// every rank has a core: its one thread is done before a second
/// wait-and-wake would be. Measured by the sweep above (docs/decisions.md).
pub const SPLIT_FROM_BYTES: usize = 128 * 1024;

impl AllReduceScheme {
    /// Whether a call on `bytes` per rank and `size` ranks is split.
    pub(super) fn splits(self, bytes: usize, size: usize) -> bool {
        match self {
            AllReduceScheme::Auto => split_wins(bytes, size),
            AllReduceScheme::RankOrder => false,
            AllReduceScheme::Split => true,
        }
    }
}

/// The automatic choice: split from [`SPLIT_FROM_BYTES`] on, from twice
/// that with more ranks than cores. There the split costs most ranks a
/// second sleep and wake-up (they find no block left to claim and wait for
/// the last one), while the rank-order sum wakes each rank once. The sweep
/// on 2 cores found the two even at 64 KiB on 2 ranks and the split ahead
/// from 256 KiB on every world size up to 256 (1.7x on 16 ranks); below 64
/// KiB the rank-order sum, up to 4x on 2 ranks.
pub fn split_wins(bytes: usize, size: usize) -> bool {
    let oversubscribed = size > super::spin::cores();
    size > 1 && bytes >= SPLIT_FROM_BYTES * if oversubscribed { 2 } else { 1 }
}
