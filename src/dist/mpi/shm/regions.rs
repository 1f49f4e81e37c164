//! Buffers that every rank of the node maps
//! (`ProcessGroup::alloc_buffer`, PyTorch's and NCCL's "symmetric memory"),
//! and the all-reduce that sums them where they lie, with no copy. DDP's
//! gradient buckets are made here (`src/ddp/reducer/buckets.rs`). Try it:
//! `cargo test --features solutions,mpi,nccl --test mpi zero_copy`.
//!
//! One `alloc_buffer` of B bytes on a node of N ranks is one file in
//! /dev/shm of N strides (B rounded up to a page): rank 0 of the node
//! creates it under a unique name and reserves its memory with
//! `posix_fallocate` (a full /dev/shm then fails here, at once, rather than
//! as a SIGBUS on a later write), the name goes to the other ranks, every
//! rank maps the whole file, and rank 0 unlinks the name once all have.
//! Rank r's buffer is stride r; every rank sees every buffer.
//!
//! A job killed between the creation and the unlink (a few milliseconds)
//! leaves the file behind, holding its memory until reboot. The name
//! carries the creating process's id, so the next job's first `create`
//! on the machine (and `scripts/launch.sh`, after each job) removes every
//! such file whose process is gone (`remove_stale`).
//!
//! **Lifetime: a region is never unmapped.** The tensor over it owns
//! nothing (`Tensor::from_blob` has no deleter), and gradients stay views
//! of DDP's buckets after the wrapper, the group or MPI itself is gone; a
//! region unmapped then would turn a later touch into a SIGSEGV. Our own
//! mapping outlives `MPI_Finalize` (an MPI window would not), and the
//! memory returns to the system when the last process of the node exits.
//! So each call keeps B × N bytes of the node's memory (once, shared by its
//! ranks) until then: per DDP construction, its buckets' bytes times the
//! ranks on the node.
//!
//! A plain tensor instead (every rank alike, decided from what all agreed
//! on): with one rank on the node, several nodes, a sub-group, a GPU or a
//! dtype MPI does not carry, `DDP_MPI_SHM=off` or `copy` (to measure what
//! in place saves) on some rank, or when some rank cannot make or map the
//! file (it says why on stderr).
//!
//! The all-reduce (`shm.rs` drives it): when the agreement shows every rank
//! passed the same region at the same offset, a barrier (every buffer is
//! complete), rank i sums slice i of every rank's buffer in rank order and
//! writes it into slice i of every buffer, a barrier (every slice is
//! written), done: about 2 bytes of memory traffic per byte, a memcpy's.

use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering};

use tch::Tensor;

use super::super::ffi;
use super::Node;
use crate::dist::ReduceOp;

/// All-reduces this process finished in place in shared buffers: the
/// tests' proof that the zero-copy path was taken ([`super::super::zero_copy_all_reduces`]).
pub(crate) static ZERO_COPY: AtomicU64 = AtomicU64::new(0);

/// One `alloc_buffer`'s memory, as this process maps it.
pub(crate) struct Region {
    /// Where each rank's buffer starts, in node rank order.
    buffers: Vec<*mut u8>,
    /// Bytes of one buffer.
    len: usize,
}

/// The longest name of a file in /dev/shm that we make, with its NUL.
const NAME_BYTES: usize = 64;

impl Node {
    /// `alloc_buffer`'s collective part: every rank of the node calls it
    /// with the same `bytes`, once all agreed. This rank's buffer, zeroed,
    /// or `None` (every rank alike) where the caller makes a plain tensor.
    pub fn share(&mut self, bytes: usize) -> Result<Option<*mut u8>, String> {
        if self.spread || self.size < 2 || bytes == 0 {
            return Ok(None);
        }
        let stride = bytes.next_multiple_of(4096);
        let total = stride * self.size;
        let mut name = [0u8; NAME_BYTES];
        // DDP_MPI_SHM=copy on some rank: no name here, or no mapping there;
        // either way every rank learns it below, and all make plain tensors.
        if self.rank == 0 && self.buffers {
            match create(total) {
                Ok(made) => name[..made.len()].copy_from_slice(made.as_bytes()),
                Err(why) => warn(&why),
            }
        }
        ffi::bcast_bytes_blocking(self.comm, &mut name, 0)?;
        let made = String::from_utf8_lossy(&name).trim_end_matches('\0').to_string();
        let mapped = match made.is_empty() || !self.buffers {
            true => None,
            false => map(&made, total).map_err(|why| warn(&why)).ok(),
        };
        let all_mapped = ffi::min_blocking(self.comm, i64::from(mapped.is_some()))? == 1;
        if self.rank == 0 && !made.is_empty() {
            // Every rank has tried to open it: the name can go.
            let path = CString::new(made).expect("no NUL in the name");
            // SAFETY: a plain call on a NUL-terminated string.
            unsafe { libc::shm_unlink(path.as_ptr()) };
        }
        let Some(base) = mapped else { return Ok(None) };
        if !all_mapped {
            // Nobody handed out a tensor over it yet: safe to unmap.
            // SAFETY: the mapping made just above, `total` bytes.
            unsafe { libc::munmap(base.cast(), total) };
            return Ok(None);
        }
        let buffers: Vec<*mut u8> = (0..self.size).map(|r| base.wrapping_add(r * stride)).collect();
        let mine = buffers[self.rank];
        self.regions.push(Region { buffers, len: bytes });
        Ok(Some(mine))
    }

    /// Where `buf` lies: (the region's index, its offset in this rank's
    /// buffer), or `None` when it is not wholly inside one.
    pub fn place(&self, buf: &Tensor) -> Option<(usize, usize)> {
        let (at, len) = (buf.data_ptr() as usize, super::super::job::byte_len(buf));
        self.regions.iter().enumerate().find_map(|(index, region)| {
            let mine = region.buffers[self.rank] as usize;
            (at >= mine && at + len <= mine + region.len).then(|| (index, at - mine))
        })
    }

    /// The zero-copy all-reduce's work, between its barriers: this rank's
    /// slice of every rank's `buf` (at `offset` in region `index` on each),
    /// summed in rank order and written back into every one.
    pub fn sum_in_place(
        &self,
        buf: &Tensor,
        op: ReduceOp,
        (index, offset): (usize, usize),
    ) -> Result<(), String> {
        let buffers: Vec<*mut u8> =
            self.regions[index].buffers.iter().map(|b| b.wrapping_add(offset)).collect();
        let call = super::slices::Call::new(buf, op, self.rank, self.size, &buffers, std::ptr::null_mut())?;
        call.reduce_own_slice_everywhere().map_err(|e| format!("the slice's reduction: {e}"))
    }
}

/// Creates and reserves a file of `total` bytes in /dev/shm under a name
/// no other process uses; its name.
fn create(total: usize) -> Result<String, String> {
    static MADE: AtomicU64 = AtomicU64::new(0);
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(remove_stale);
    let name = format!("/{PREFIX}{}-{}", std::process::id(), MADE.fetch_add(1, Ordering::Relaxed));
    let path = CString::new(name.clone()).expect("no NUL in the name");
    let flags = libc::O_CREAT | libc::O_EXCL | libc::O_RDWR;
    // SAFETY: plain calls on a NUL-terminated name and the descriptor they return.
    unsafe {
        let fd = libc::shm_open(path.as_ptr(), flags, 0o600);
        if fd < 0 {
            return Err(format!("shm_open({name}): {}", std::io::Error::last_os_error()));
        }
        let reserved = libc::posix_fallocate(fd, 0, total as libc::off_t);
        libc::close(fd);
        if reserved != 0 {
            libc::shm_unlink(path.as_ptr());
            let why = std::io::Error::from_raw_os_error(reserved);
            return Err(format!("reserving {total} bytes in /dev/shm: {why} (is /dev/shm full?)"));
        }
    }
    Ok(name)
}

/// The start of the name of every file that [`create`] makes, in /dev/shm;
/// the creating process's id and a count follow.
const PREFIX: &str = "ddp-workbook-";

/// Removes the files of /dev/shm that [`create`] made in processes that
/// are gone: killed before they could unlink them. A process that still
/// runs keeps its files, whoever owns it (`kill(pid, 0)` fails with ESRCH
/// only for a process that does not exist); a file another user made
/// cannot be removed and is left, silently. A process of another pid
/// namespace that shares this /dev/shm looks gone: if its file goes in the
/// milliseconds before its own unlink, that job's ranks cannot map it and
/// make plain tensors instead (saying so), as when /dev/shm is full.
fn remove_stale() {
    let Ok(entries) = std::fs::read_dir("/dev/shm") else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) =
            name.to_str().and_then(|n| n.strip_prefix(PREFIX)).and_then(|rest| rest.split('-').next())
        else {
            continue;
        };
        let Ok(pid) = pid.parse::<libc::pid_t>() else { continue };
        // SAFETY: signal 0 only asks whether the process exists.
        let gone = pid > 0
            && unsafe { libc::kill(pid, 0) } == -1
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            let path = CString::new(format!("/{}", name.to_string_lossy())).expect("no NUL in a file name");
            // SAFETY: a plain call on a NUL-terminated string.
            unsafe { libc::shm_unlink(path.as_ptr()) };
        }
    }
}

/// Maps the whole file `name` (`total` bytes), shared with every process
/// that maps it.
fn map(name: &str, total: usize) -> Result<*mut u8, String> {
    let path = CString::new(name).map_err(|_| format!("a NUL in the name {name:?}"))?;
    // SAFETY: plain calls; the mapping stays valid after the descriptor is closed.
    unsafe {
        let fd = libc::shm_open(path.as_ptr(), libc::O_RDWR, 0);
        if fd < 0 {
            return Err(format!("shm_open({name}): {}", std::io::Error::last_os_error()));
        }
        let (rw, shared) = (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED);
        let at = libc::mmap(std::ptr::null_mut(), total, rw, shared, fd, 0);
        let error = std::io::Error::last_os_error();
        libc::close(fd);
        if at == libc::MAP_FAILED {
            return Err(format!("mapping {total} bytes of {name}: {error}"));
        }
        Ok(at.cast())
    }
}

fn warn(why: &str) {
    eprintln!(
        "alloc_buffer: no shared memory ({why}); this buffer is a plain tensor and its all-reduces copy"
    );
}
