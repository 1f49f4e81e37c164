//! Every raw MPI call the backend makes, in one place.
//! Each wrapper turns MPI's error code into a message; the communication
//! thread (`engine.rs`) is their only caller. Try the backend with
//! `cargo test --features mpi --test mpi`.
//!
//! Only non-blocking collectives are used (MPI_Ibcast, MPI_Iallreduce, ...):
//! a blocking MPI call cannot be given a deadline, a non-blocking one can be
//! tested until it completes or its deadline passes.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use mpi::ffi as sys;

use tch::{Kind, Tensor};

mod window;
pub(crate) use window::{
    all_gather_blocking, allocate_shared, bcast_bytes_blocking, iall_max, min_blocking, node_of, split_by,
    SharedWindow,
};

use crate::dist::ReduceOp;

pub(crate) use sys::{MPI_Comm as Comm, MPI_Request as Request};

extern "C" {
    /// In `in_place.c`: MPI_IN_PLACE, whose value depends on the MPI library.
    fn ddp_mpi_in_place() -> *mut c_void;
}

/// Message tags of the backend's own point-to-point traffic (collectives
/// never match point-to-point messages, whatever their tag).
pub(crate) const TAG_COLLECTIVE_SIGNATURE: c_int = 1;
pub(crate) const TAG_P2P_SIGNATURE: c_int = 2;
pub(crate) const TAG_P2P_DATA: c_int = 3;
/// A node's partial sum on its way to the next node (`shm.rs`).
pub(crate) const TAG_NODE_CHAIN: c_int = 4;
/// The first of the tags of the reductions in rank order (`ordered.rs`):
/// two per call, by the call's place among its communicator's collectives.
pub(crate) const TAG_ORDERED: c_int = 16;

/// MPI's description of error code `code`.
fn error_text(code: c_int) -> String {
    let mut text = vec![0u8; 512]; // more than MPI_MAX_ERROR_STRING
    let mut len: c_int = 0;
    // SAFETY: the buffer is larger than the longest message MPI writes.
    unsafe { sys::MPI_Error_string(code, text.as_mut_ptr().cast(), &mut len) };
    String::from_utf8_lossy(&text[..len.clamp(0, 512) as usize]).into_owned()
}

fn check(code: c_int, what: &str) -> Result<(), String> {
    match code {
        0 => Ok(()), // MPI_SUCCESS
        code => Err(format!("{what} failed: {}", error_text(code))),
    }
}

/// MPI's datatype for elements of `kind`. Half and BFloat16 travel as
/// 16-bit words: they can be moved, but MPI cannot add them (the backend
/// sums BFloat16 itself, in rank order: `ordered.rs`).
pub(crate) fn datatype(kind: Kind) -> Option<sys::MPI_Datatype> {
    // SAFETY: reading the constants that mpi-sys exports.
    unsafe {
        Some(match kind {
            Kind::Float => sys::RSMPI_FLOAT,
            Kind::Double => sys::RSMPI_DOUBLE,
            Kind::Int8 => sys::RSMPI_INT8_T,
            Kind::Uint8 => sys::RSMPI_UINT8_T,
            Kind::Int16 => sys::RSMPI_INT16_T,
            Kind::Int => sys::RSMPI_INT32_T,
            Kind::Int64 => sys::RSMPI_INT64_T,
            Kind::Bool => sys::RSMPI_C_BOOL,
            Kind::Half | Kind::BFloat16 => sys::RSMPI_UINT16_T,
            _ => return None,
        })
    }
}

/// How the backend reduces: by itself in rank order (`ordered.rs`), or
/// with an operation of MPI's.
pub(crate) enum Reduction {
    /// The order of the operands changes the bits (floating-point sums and
    /// products): Open MPI would combine them in an order of its own,
    /// which depends on the number of ranks and the message size.
    InRankOrder,
    Mpi(sys::MPI_Op),
}

/// How to reduce `kind` with `op`. AVG has no MPI operation: it is summed
/// and divided by the world size afterwards. On booleans, as in libtorch, a
/// sum is a logical or and a product a logical and. Floating-point sums and
/// products go in rank order, as in the in-process backend: any order gives
/// the same bits for integers, minima and maxima, so those keep MPI's.
pub(crate) fn reduction(kind: Kind, op: ReduceOp) -> Result<Reduction, String> {
    let float = matches!(kind, Kind::Float | Kind::Double | Kind::BFloat16);
    if float && matches!(op, ReduceOp::Sum | ReduceOp::Avg | ReduceOp::Product) {
        if kind == Kind::BFloat16 && op == ReduceOp::Product {
            return Err("MPI cannot multiply BFloat16 tensors (BFloat16 only sums); reduce them as Float \
                        (`.to_kind(Kind::Float)`)"
                .into());
        }
        return Ok(Reduction::InRankOrder);
    }
    if matches!(kind, Kind::Half | Kind::BFloat16) {
        return Err(format!(
            "MPI cannot {} {kind:?} tensors (BFloat16 only sums); reduce them as Float \
             (`.to_kind(Kind::Float)`)",
            op.name()
        ));
    }
    // SAFETY: reading the constants that mpi-sys exports.
    Ok(Reduction::Mpi(unsafe {
        match (kind == Kind::Bool, op) {
            (false, ReduceOp::Sum | ReduceOp::Avg) => sys::RSMPI_SUM,
            (false, ReduceOp::Product) => sys::RSMPI_PROD,
            (false, ReduceOp::Min) => sys::RSMPI_MIN,
            (false, ReduceOp::Max) => sys::RSMPI_MAX,
            (true, ReduceOp::Sum | ReduceOp::Max | ReduceOp::Avg) => sys::RSMPI_LOR,
            (true, ReduceOp::Product | ReduceOp::Min) => sys::RSMPI_LAND,
        }
    }))
}

/// The most elements (bytes, for point-to-point messages) one MPI call
/// carries: MPI counts in `int`. A larger transfer is made as several
/// calls of at most this many, posted one after the other, so a 3 GiB
/// checkpoint broadcast at a resume is two broadcasts on every rank.
pub(crate) const MOST_PER_CALL: usize = i32::MAX as usize;

/// The most per call this process uses: [`MOST_PER_CALL`], or what
/// `DDP_MPI_MOST_PER_CALL` (a test hook, read by [`init`](super::init))
/// says: fewer, so that the tests cut small tensors as a 3 GiB one would
/// be, or more, so that they meet MPI's own limit (the call is refused).
static MOST: AtomicUsize = AtomicUsize::new(MOST_PER_CALL);

/// Reads `DDP_MPI_MOST_PER_CALL` (unset: [`MOST_PER_CALL`]).
pub(crate) fn most_per_call_from_env() -> Result<(), String> {
    let Ok(text) = std::env::var("DDP_MPI_MOST_PER_CALL") else { return Ok(()) };
    match text.trim().parse::<usize>() {
        Ok(most @ 1..) => {
            MOST.store(most, Ordering::Relaxed);
            Ok(())
        }
        _ => Err(format!(
            "DDP_MPI_MOST_PER_CALL={text:?} is not a positive number of elements; fix it or unset it"
        )),
    }
}

pub(crate) fn most() -> usize {
    MOST.load(Ordering::Relaxed)
}

/// `n` as MPI's count, or why one call cannot carry it.
fn count(n: usize) -> Result<c_int, String> {
    c_int::try_from(n).map_err(|_| {
        format!("{n} elements is more than one MPI call can carry (2^31 - 1): DDP_MPI_MOST_PER_CALL is set too high")
    })
}

/// `len` cut into pieces of at most `most`: (start, length) of each, in
/// order. Zero is one empty piece: the call is still made on every rank.
pub(crate) fn pieces(len: usize, most: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..len.div_ceil(most).max(1)).map(move |k| (k * most, most.min(len - k * most)))
}

/// Where a contiguous CPU tensor's elements start, how many there are, and
/// the bytes of one.
fn elements(tensor: &Tensor) -> (*mut u8, usize, usize) {
    (tensor.data_ptr().cast(), tensor.numel(), tensor.kind().elt_size_in_bytes())
}

/// Starts one non-blocking MPI call through `start`, which receives the
/// address of the request to fill in.
fn start(what: &str, start: impl FnOnce(*mut Request) -> c_int) -> Result<Request, String> {
    // SAFETY: MPI_REQUEST_NULL is a plain constant; `start` overwrites it.
    let mut request = unsafe { sys::RSMPI_REQUEST_NULL };
    check(start(&mut request), what)?;
    Ok(request)
}

// SAFETY (all the i* functions below): the caller keeps every buffer alive
// and untouched until each request pushed onto `requests` has completed;
// `engine.rs` does so by holding the tensors in the job until then. A
// request already posted stays in `requests` when a later piece fails.

pub(crate) unsafe fn ibcast(
    t: &Tensor,
    dt: sys::MPI_Datatype,
    root: usize,
    comm: Comm,
    requests: &mut Vec<Request>,
) -> Result<(), String> {
    let (ptr, numel, elt) = elements(t);
    for (at, n) in pieces(numel, most()) {
        let (part, n) = (ptr.add(at * elt).cast(), count(n)?);
        requests.push(start("MPI_Ibcast", |r| sys::MPI_Ibcast(part, n, dt, root as c_int, comm, r))?);
    }
    Ok(())
}

pub(crate) unsafe fn iallreduce(
    t: &Tensor,
    dt: sys::MPI_Datatype,
    op: sys::MPI_Op,
    comm: Comm,
    requests: &mut Vec<Request>,
) -> Result<(), String> {
    let (ptr, numel, elt) = elements(t);
    for (at, n) in pieces(numel, most()) {
        let (part, inplace, n) = (ptr.add(at * elt).cast(), ddp_mpi_in_place(), count(n)?);
        requests.push(start("MPI_Iallreduce", |r| sys::MPI_Iallreduce(inplace, part, n, dt, op, comm, r))?);
    }
    Ok(())
}

/// Each rank's `input` into its row of `output`. A piece of a larger
/// input lands in every row at once through a datatype of the piece's
/// length whose extent is a whole row.
pub(crate) unsafe fn iallgather(
    input: &Tensor,
    output: &Tensor,
    dt: sys::MPI_Datatype,
    comm: Comm,
    requests: &mut Vec<Request>,
) -> Result<(), String> {
    let ((send, numel, elt), (recv, _, _)) = (elements(input), elements(output));
    if numel <= most() {
        let (send, recv, n) = (send.cast(), recv.cast(), count(numel)?);
        requests.push(start("MPI_Iallgather", |r| sys::MPI_Iallgather(send, n, dt, recv, n, dt, comm, r))?);
        return Ok(());
    }
    for (at, n) in pieces(numel, most()) {
        let mut piece = sys::RSMPI_DATATYPE_NULL;
        let n = count(n)?;
        check(sys::MPI_Type_contiguous(n, dt, &mut piece), "MPI_Type_contiguous")?;
        let mut row = sys::RSMPI_DATATYPE_NULL;
        let extent = (numel * elt) as sys::MPI_Aint;
        let resized = sys::MPI_Type_create_resized(piece, 0, extent, &mut row);
        sys::MPI_Type_free(&mut piece);
        check(resized, "MPI_Type_create_resized")?;
        check(sys::MPI_Type_commit(&mut row), "MPI_Type_commit")?;
        let (send, recv) = (send.add(at * elt).cast(), recv.add(at * elt).cast());
        let posted = start("MPI_Iallgather", |r| sys::MPI_Iallgather(send, n, dt, recv, 1, row, comm, r));
        sys::MPI_Type_free(&mut row); // MPI keeps it until the call completes
        requests.push(posted?);
    }
    Ok(())
}

pub(crate) unsafe fn ibarrier(comm: Comm) -> Result<Request, String> {
    start("MPI_Ibarrier", |r| sys::MPI_Ibarrier(comm, r))
}

fn too_long_for_one_message(len: usize) -> String {
    format!(
        "{len} bytes is more than one MPI message can carry (2^31 - 1 bytes): send the tensor in \
         parts (`chunk`), one send and one receive per part"
    )
}

/// Sends `len` bytes at `ptr` to `peer` with `tag`, as one message.
pub(crate) unsafe fn isend(
    ptr: *const c_void,
    len: usize,
    peer: usize,
    tag: c_int,
    comm: Comm,
) -> Result<Request, String> {
    let len = c_int::try_from(len).map_err(|_| too_long_for_one_message(len))?;
    start("MPI_Isend", |r| sys::MPI_Isend(ptr, len, sys::RSMPI_UINT8_T, peer as c_int, tag, comm, r))
}

/// Receives at most `len` bytes from `peer` with `tag` into `ptr`, as one message.
pub(crate) unsafe fn irecv(
    ptr: *mut c_void,
    len: usize,
    peer: usize,
    tag: c_int,
    comm: Comm,
) -> Result<Request, String> {
    let len = c_int::try_from(len).map_err(|_| too_long_for_one_message(len))?;
    start("MPI_Irecv", |r| sys::MPI_Irecv(ptr, len, sys::RSMPI_UINT8_T, peer as c_int, tag, comm, r))
}

/// Sends `len` bytes at `ptr` to `peer` with `tag`, in messages of at most
/// [`MOST_PER_CALL`] bytes; MPI delivers messages of one sender, tag and
/// communicator in the order they were sent, so [`irecv_all`] of the same
/// length puts each where it belongs.
pub(crate) unsafe fn isend_all(
    ptr: *const u8,
    len: usize,
    peer: usize,
    tag: c_int,
    comm: Comm,
    requests: &mut Vec<Request>,
) -> Result<(), String> {
    for (at, n) in pieces(len, most()) {
        requests.push(isend(ptr.add(at).cast(), n, peer, tag, comm)?);
    }
    Ok(())
}

/// Receives `len` bytes from `peer` with `tag` into `ptr`, as [`isend_all`] sends them.
pub(crate) unsafe fn irecv_all(
    ptr: *mut u8,
    len: usize,
    peer: usize,
    tag: c_int,
    comm: Comm,
    requests: &mut Vec<Request>,
) -> Result<(), String> {
    for (at, n) in pieces(len, most()) {
        requests.push(irecv(ptr.add(at).cast(), n, peer, tag, comm)?);
    }
    Ok(())
}

/// Whether a request has completed (and been tested) or was never made.
pub(crate) fn is_null(request: &Request) -> bool {
    // SAFETY: reading a constant that mpi-sys exports.
    *request == unsafe { sys::RSMPI_REQUEST_NULL }
}

/// Tests a request: `Ok(None)` while it runs, then `Ok(Some(bytes))` once
/// (the bytes received, for receives; the request becomes null). A request
/// that is already null has completed before: `Some(0)`.
pub(crate) fn test(request: &mut Request) -> Result<Option<usize>, String> {
    // SAFETY: a zeroed status is a valid out-parameter; the request is one
    // that MPI gave us (or null, which MPI_Test accepts).
    unsafe {
        if *request == sys::RSMPI_REQUEST_NULL {
            return Ok(Some(0));
        }
        let (mut flag, mut status): (c_int, sys::MPI_Status) = (0, std::mem::zeroed());
        check(sys::MPI_Test(request, &mut flag, &mut status), "MPI_Test")?;
        if flag == 0 {
            return Ok(None);
        }
        check(status.MPI_ERROR, "the transfer")?;
        let mut count: c_int = 0;
        check(sys::MPI_Get_count(&status, sys::RSMPI_UINT8_T, &mut count), "MPI_Get_count")?;
        Ok(Some(count.max(0) as usize))
    }
}

/// MPI_COMM_WORLD, duplicated so that the backend's traffic never meets
/// another library's, with errors returned instead of killing the process.
pub(crate) fn world() -> Result<Comm, String> {
    // SAFETY: plain MPI calls on the world communicator after MPI_Init.
    unsafe {
        let mut comm = sys::RSMPI_COMM_NULL;
        check(sys::MPI_Comm_dup(sys::RSMPI_COMM_WORLD, &mut comm), "MPI_Comm_dup")?;
        check(sys::MPI_Comm_set_errhandler(comm, sys::RSMPI_ERRORS_RETURN), "MPI_Comm_set_errhandler")?;
        Ok(comm)
    }
}

/// This process's rank in `comm`, and the size of `comm`.
pub(crate) fn rank_and_size(comm: Comm) -> Result<(usize, usize), String> {
    let (mut rank, mut size): (c_int, c_int) = (0, 0);
    // SAFETY: plain queries on a valid communicator.
    unsafe {
        check(sys::MPI_Comm_rank(comm, &mut rank), "MPI_Comm_rank")?;
        check(sys::MPI_Comm_size(comm, &mut size), "MPI_Comm_size")?;
    }
    Ok((rank as usize, size as usize))
}

/// This process's rank among the processes of `comm` on the same machine,
/// and how many there are: torch.distributed's LOCAL_RANK and
/// LOCAL_WORLD_SIZE.
pub(crate) fn local_rank_and_size(comm: Comm) -> Result<(usize, usize), String> {
    // SAFETY: a collective split of a valid communicator; freed below.
    unsafe {
        let mut node = sys::RSMPI_COMM_NULL;
        let info = sys::RSMPI_INFO_NULL;
        check(
            sys::MPI_Comm_split_type(comm, sys::RSMPI_COMM_TYPE_SHARED, 0, info, &mut node),
            "MPI_Comm_split_type",
        )?;
        let result = rank_and_size(node);
        sys::MPI_Comm_free(&mut node);
        result
    }
}

/// Splits `comm`: processes passing `Some(key)` get a new communicator in
/// which they are ordered by key; those passing `None` get `None`.
pub(crate) fn split(comm: Comm, key: Option<usize>) -> Result<Option<Comm>, String> {
    // SAFETY: a collective on a valid communicator that every member of
    // `comm` joins (the engine agrees on it first).
    unsafe {
        let color = if key.is_some() { 0 } else { sys::RSMPI_UNDEFINED };
        let mut new = sys::RSMPI_COMM_NULL;
        check(sys::MPI_Comm_split(comm, color, key.unwrap_or(0) as c_int, &mut new), "MPI_Comm_split")?;
        Ok((new != sys::RSMPI_COMM_NULL).then_some(new))
    }
}

/// Ends every process of the job (mpirun then exits with `code`).
pub(crate) fn abort(code: i32) -> ! {
    // SAFETY: MPI_Abort may be called from any thread at any time.
    unsafe { sys::MPI_Abort(sys::RSMPI_COMM_WORLD, code) };
    std::process::exit(code) // MPI_Abort does not return; this is for the type checker
}

#[cfg(test)]
mod tests {
    use super::pieces;

    #[test]
    fn pieces_cover_the_length_once_in_order_and_none_is_longer_than_allowed() {
        assert_eq!(pieces(0, 5).collect::<Vec<_>>(), [(0, 0)]);
        assert_eq!(pieces(5, 5).collect::<Vec<_>>(), [(0, 5)]);
        assert_eq!(pieces(12, 5).collect::<Vec<_>>(), [(0, 5), (5, 5), (10, 2)]);
        let big = 2_200_000_001;
        assert_eq!(
            pieces(big, i32::MAX as usize).collect::<Vec<_>>(),
            [(0, 2_147_483_647), (2_147_483_647, 52_516_354)]
        );
    }
}
