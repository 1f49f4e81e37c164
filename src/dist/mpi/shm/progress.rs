//! Where one all-reduce through the node's shared memory stands: its phase
//! and what it waits on. The job that carries the call holds it
//! (`job.rs`); only the shared-memory path (`shm.rs`) reads or changes it.

use super::super::ffi::Request;

/// Where one call is.
#[derive(Clone, Copy, PartialEq, Debug)]
pub(super) enum Phase {
    Agree,
    ReceivePrevious,
    DataIn,
    Reduced,
    SendNext,
    Broadcast,
    ResultIn,
    /// The zero-copy path (`regions.rs`): every buffer complete, then every slice summed.
    Filled,
    Summed,
}

/// One all-reduce going through the window.
pub(crate) struct Progress {
    pub(super) phase: Phase,
    pub(super) request: Request,
    /// The agreement's buffer, then its maxima: [bytes, -bytes, region,
    /// -region, offset, -offset], the last four -1 for a tensor outside
    /// every region of `alloc_buffer`.
    pub(super) sizes: Box<[i64; 6]>,
    /// Where the buffer lies in a region, on every rank: (index, offset).
    pub(super) zero_copy: Option<(usize, usize)>,
}
