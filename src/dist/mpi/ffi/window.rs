//! The raw MPI calls of the shared-memory
//! all-reduce (`shm.rs`): the node's communicator, the blocking
//! collectives it makes once when the job starts, and the MPI-3 window
//! whose memory every rank of the node reads and writes directly. Try it:
//! `cargo test --features mpi --test mpi shared_memory`.

use std::ffi::{c_int, c_void};

use mpi::ffi as sys;

use super::{check, start, Comm, Request};

extern "C" {
    /// In `in_place.c`: MPI_MODE_NOCHECK, whose value depends on the MPI library.
    fn ddp_mpi_mode_nocheck() -> c_int;
}

/// The processes of `comm` that share memory with this one (this machine),
/// ordered by `key` (the world rank), errors returned, not fatal.
pub(crate) fn node_of(comm: Comm, key: usize) -> Result<Comm, String> {
    // SAFETY: a collective split of a valid communicator that every member joins.
    unsafe {
        let mut node = sys::RSMPI_COMM_NULL;
        let (shared, info) = (sys::RSMPI_COMM_TYPE_SHARED, sys::RSMPI_INFO_NULL);
        check(sys::MPI_Comm_split_type(comm, shared, key as c_int, info, &mut node), "MPI_Comm_split_type")?;
        check(sys::MPI_Comm_set_errhandler(node, sys::RSMPI_ERRORS_RETURN), "MPI_Comm_set_errhandler")?;
        Ok(node)
    }
}

/// The members of `comm` that pass the same `color`, ordered by `key`.
pub(crate) fn split_by(comm: Comm, color: usize, key: usize) -> Result<Comm, String> {
    // SAFETY: reading a constant that mpi-sys exports.
    let mut part = unsafe { sys::RSMPI_COMM_NULL };
    // SAFETY: a collective split of a valid communicator that every member joins.
    check(unsafe { sys::MPI_Comm_split(comm, color as c_int, key as c_int, &mut part) }, "MPI_Comm_split")?;
    Ok(part)
}

/// Every member's `value`, in rank order (blocking: used once, at start).
pub(crate) fn all_gather_blocking(comm: Comm, value: i64, members: usize) -> Result<Vec<i64>, String> {
    let mut all = vec![0i64; members];
    // SAFETY: one i64 sent, one per member received, into a buffer of that size.
    let code = unsafe {
        let mine: *const i64 = &value;
        let dt = sys::RSMPI_INT64_T;
        sys::MPI_Allgather(mine.cast(), 1, dt, all.as_mut_ptr().cast(), 1, dt, comm)
    };
    check(code, "MPI_Allgather")?;
    Ok(all)
}

/// The smallest `value` of all members (blocking: used once, at start).
pub(crate) fn min_blocking(comm: Comm, value: i64) -> Result<i64, String> {
    let mut least = 0i64;
    // SAFETY: one i64 in, one out.
    let code = unsafe {
        let mine: *const i64 = &value;
        let out: *mut i64 = &mut least;
        sys::MPI_Allreduce(mine.cast(), out.cast(), 1, sys::RSMPI_INT64_T, sys::RSMPI_MIN, comm)
    };
    check(code, "MPI_Allreduce")?;
    Ok(least)
}

/// Root's `bytes` into every member's (blocking: used once every member
/// agreed to make the call, by `alloc_buffer`).
pub(crate) fn bcast_bytes_blocking(comm: Comm, bytes: &mut [u8], root: usize) -> Result<(), String> {
    let (ptr, count) = (bytes.as_mut_ptr().cast::<c_void>(), bytes.len() as c_int);
    // SAFETY: `count` bytes at `ptr`, alive for the blocking call.
    check(unsafe { sys::MPI_Bcast(ptr, count, sys::RSMPI_UINT8_T, root as c_int, comm) }, "MPI_Bcast")
}

/// Starts the element-wise maximum of `values` over `comm`, in place.
///
/// # Safety
/// `values` must stay alive and untouched until the request completes.
pub(crate) unsafe fn iall_max(values: &mut [i64], comm: Comm) -> Result<Request, String> {
    let (ptr, count) = (values.as_mut_ptr().cast::<c_void>(), values.len() as c_int);
    let (dt, max) = (sys::RSMPI_INT64_T, sys::RSMPI_MAX);
    start("MPI_Iallreduce", |r| sys::MPI_Iallreduce(super::ddp_mpi_in_place(), ptr, count, dt, max, comm, r))
}

/// An MPI-3 shared-memory window: every rank's segment, mapped into every
/// rank's address space.
pub(crate) struct SharedWindow {
    win: sys::MPI_Win,
    /// Where each member's segment starts, in this process.
    pub segments: Vec<*mut u8>,
}

/// Allocates a window on `comm` (collective: every member, each its own
/// `bytes`) and opens the passive epoch that `sync` needs: `lock_all` with
/// NOCHECK, since ranks never lock against each other here; barriers on
/// the node's communicator order the accesses instead.
pub(crate) fn allocate_shared(comm: Comm, bytes: usize, members: usize) -> Result<SharedWindow, String> {
    // SAFETY: a collective that every member of `comm` joins (the caller
    // agreed on it first); the queries read sizes and addresses MPI owns.
    unsafe {
        let mut win = sys::RSMPI_WIN_NULL;
        let mut base: *mut u8 = std::ptr::null_mut();
        let info = sys::RSMPI_INFO_NULL;
        let base_out: *mut *mut u8 = &mut base;
        let code =
            sys::MPI_Win_allocate_shared(bytes as sys::MPI_Aint, 1, info, comm, base_out.cast(), &mut win);
        check(code, &format!("MPI_Win_allocate_shared of {bytes} bytes (is /dev/shm full?)"))?;
        check(sys::MPI_Win_set_errhandler(win, sys::RSMPI_ERRORS_RETURN), "MPI_Win_set_errhandler")?;
        check(sys::MPI_Win_lock_all(ddp_mpi_mode_nocheck(), win), "MPI_Win_lock_all")?;
        let mut segments = Vec::with_capacity(members);
        for member in 0..members {
            let (mut size, mut unit, mut at): (sys::MPI_Aint, c_int, *mut u8) = (0, 0, std::ptr::null_mut());
            let at_out: *mut *mut u8 = &mut at;
            let code = sys::MPI_Win_shared_query(win, member as c_int, &mut size, &mut unit, at_out.cast());
            check(code, "MPI_Win_shared_query")?;
            segments.push(at);
        }
        Ok(SharedWindow { win, segments })
    }
}

impl SharedWindow {
    /// Makes this process's stores to the window visible to the other
    /// ranks, and theirs to this process, once a barrier separates the two
    /// syncs (MPI-3's unified model: a memory barrier, `MPI_Win_sync`).
    pub fn sync(&self) -> Result<(), String> {
        // SAFETY: the window is open (lock_all) until `free`.
        check(unsafe { sys::MPI_Win_sync(self.win) }, "MPI_Win_sync")
    }

    /// Closes the epoch and frees the window (collective, like the
    /// allocation: only after every member agreed to).
    pub fn free(mut self) -> Result<(), String> {
        // SAFETY: the window is open; nobody touches its segments afterwards.
        unsafe {
            check(sys::MPI_Win_unlock_all(self.win), "MPI_Win_unlock_all")?;
            check(sys::MPI_Win_free(&mut self.win), "MPI_Win_free")
        }
    }
}
