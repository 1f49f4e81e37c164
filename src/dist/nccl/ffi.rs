//! The raw NCCL calls of the NCCL backend, through
//! cudarc's `result` layer, each failure turned into a sentence (the CUDA
//! driver's are in cuda.rs). cudarc opens NCCL the first time one of its
//! functions is called, and panics if it cannot; so nothing here calls
//! NCCL before [`nccl_library`] has found it.

use std::ffi::{c_void, CStr};
use std::time::Instant;

use cudarc::driver::{result as driver, sys as driver_sys};
use cudarc::nccl::{result as nccl, sys as nccl_sys};
use tch::Kind;

use super::cuda::{cuda_text, Device};
use crate::dist::ReduceOp;

/// NCCL's unique id: the 128 bytes every rank needs to join one communicator.
pub type IdBytes = [u8; 128];

fn nccl_text(error: nccl::NcclError) -> String {
    // SAFETY: ncclGetErrorString returns a static string for any code.
    let text = unsafe { nccl_sys::ncclGetErrorString(error.0) };
    let text = match text.is_null() {
        true => "no description".to_string(),
        false => unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned(),
    };
    format!("NCCL returned {:?}: {text}", error.0)
}

/// Whether NCCL can be loaded, or what to do about it.
pub fn nccl_library() -> Result<(), String> {
    // SAFETY: tries to open the library under its usual names, then closes it.
    match unsafe { nccl_sys::is_culib_present() } {
        true => Ok(()),
        false => Err("NCCL was not found. cudarc opens `libnccl.so`, and pip installs NCCL with \
                      torch as `libnccl.so.2` (nvidia/nccl/lib): run scripts/setup.sh, which links \
                      .nccl/libnccl.so to it (the binaries look there), or start the program with a \
                      folder holding a `libnccl.so` on LD_LIBRARY_PATH"
            .into()),
    }
}

/// The loaded NCCL's version as a number: 22809 for 2.28.9.
pub fn nccl_version() -> Result<i32, String> {
    nccl_library()?;
    nccl::get_nccl_version().map_err(nccl_text)
}

/// An NCCL version code as "2.28.9".
pub fn version_text(code: i32) -> String {
    format!("{}.{}.{}", code / 10000, code / 100 % 100, code % 100)
}

/// The NCCL release whose `ncclConfig_t` layout [`non_blocking_config`]
/// fills in (the struct grows with releases and carries its version).
const CONFIG_LAYOUT: i32 = 22809;

/// Fails for an NCCL older than the config layout this backend fills in.
/// An older one refuses the config with a bare `ncclInvalidArgument` (seen
/// on a GPU machine whose system NCCL 2.28.3 was found before the wheel's
/// 2.28.9); cudarc would panic at the first missing function of a much
/// older one.
pub fn recent_enough() -> Result<(), String> {
    match nccl_version()? {
        code if code >= CONFIG_LAYOUT => Ok(()),
        code => Err(format!(
            "the NCCL found is {}, and this backend needs {} or newer (it fills in that \
             release's communicator config): put the NCCL that pip installs with torch first \
             (scripts/setup.sh links it as .nccl/libnccl.so; scripts/gpu_check.sh puts it on \
             LD_LIBRARY_PATH), not the system's",
            version_text(code),
            version_text(CONFIG_LAYOUT)
        )),
    }
}

/// A fresh unique id. NCCL also starts a listener in this process, which
/// the other ranks reach at the address inside the id: keep this process
/// running until every rank has joined.
pub fn unique_id() -> Result<IdBytes, String> {
    nccl_library()?;
    let id = nccl::get_uniqueid().map_err(nccl_text)?;
    Ok(id.internal.map(|c| c as u8))
}

/// NCCL's name for a tensor element type; `None` for the ones it lacks.
/// Booleans travel as bytes (NCCL has no boolean type).
pub fn data_type(kind: Kind) -> Option<nccl_sys::ncclDataType_t> {
    use nccl_sys::ncclDataType_t::*;
    Some(match kind {
        Kind::Float => ncclFloat32,
        Kind::Double => ncclFloat64,
        Kind::Half => ncclFloat16,
        Kind::BFloat16 => ncclBfloat16,
        Kind::Int => ncclInt32,
        Kind::Int64 => ncclInt64,
        Kind::Int8 => ncclInt8,
        Kind::Uint8 | Kind::Bool => ncclUint8,
        _ => return None,
    })
}

/// NCCL's reduction for each `ReduceOp`: all five exist in NCCL (Avg since
/// 2.10, computed inside the collective, floating point only).
pub fn reduction(op: ReduceOp) -> nccl_sys::ncclRedOp_t {
    use nccl_sys::ncclRedOp_t::*;
    match op {
        ReduceOp::Sum => ncclSum,
        ReduceOp::Avg => ncclAvg,
        ReduceOp::Min => ncclMin,
        ReduceOp::Max => ncclMax,
        ReduceOp::Product => ncclProd,
    }
}

/// What a non-blocking communicator says about its last call.
pub enum State {
    Ready,
    Busy,
    Failed(String),
}

/// One rank's NCCL communicator, with its own stream for the collectives.
/// Non-blocking (NCCL's `blocking = 0`): no call can hang the host, so
/// every wait here has a deadline, and `abort` can always end it.
pub struct Comm {
    raw: nccl_sys::ncclComm_t,
    pub stream: driver_sys::CUstream,
    pub device: Device,
}

// SAFETY: the group uses a communicator from one thread at a time (a mutex).
unsafe impl Send for Comm {}

impl Comm {
    /// Starts joining the communicator of `world` ranks that `id` names;
    /// poll [`Comm::state`] until it is `Ready`.
    pub fn start_join(ordinal: usize, rank: usize, world: usize, id: &IdBytes) -> Result<Comm, String> {
        nccl_library()?;
        let device = Device::retain(ordinal)?;
        let stream = driver::stream::create(driver::stream::StreamKind::NonBlocking).map_err(cuda_text)?;
        // Made first, so that its drop frees the stream (and whatever NCCL
        // set up) if joining fails right here.
        let mut comm = Comm { raw: std::ptr::null_mut(), stream, device };
        let mut config = non_blocking_config();
        let id = nccl_sys::ncclUniqueId { internal: id.map(|b| b as std::ffi::c_char) };
        // SAFETY: `comm.raw` and `config` outlive the call.
        unsafe { nccl::comm_init_rank_config(&mut comm.raw, world as i32, id, rank as i32, &mut config) }
            .map_err(nccl_text)?;
        Ok(comm)
    }

    /// Whether the last call has finished queueing (NCCL's async error).
    pub fn state(&self) -> State {
        if self.raw.is_null() {
            return State::Failed("the communicator was aborted".into());
        }
        let mut state = nccl_sys::ncclResult_t::ncclSuccess;
        // SAFETY: `raw` is live until abort or drop.
        if let Err(error) = unsafe { nccl_sys::ncclCommGetAsyncError(self.raw, &mut state) }.result() {
            return State::Failed(nccl_text(error));
        }
        match state.result() {
            Ok(nccl::NcclStatus::InProgress) => State::Busy,
            Ok(_) => State::Ready,
            Err(error) => State::Failed(nccl_text(error)),
        }
    }

    /// Waits for `state` to leave `Busy`, until `deadline`, or until
    /// `peer_failed` names a reason to stop waiting.
    pub fn settle(&self, deadline: Instant, peer_failed: &dyn Fn() -> Option<String>) -> Result<(), String> {
        loop {
            match self.state() {
                State::Ready => return Ok(()),
                State::Failed(why) => return Err(why),
                State::Busy if Instant::now() >= deadline => return Err("deadline".into()),
                State::Busy => match peer_failed() {
                    Some(why) => return Err(why),
                    None => std::thread::yield_now(),
                },
            }
        }
    }

    /// Ends the communicator at once, whatever it is doing (PyTorch does the
    /// same when a collective misses its deadline); later calls fail.
    pub fn abort(&mut self) {
        if !self.raw.is_null() {
            // SAFETY: `raw` is live; it is never used again.
            _ = unsafe { nccl::comm_abort(self.raw) };
            self.raw = std::ptr::null_mut();
        }
    }

    /// Queues one NCCL call on this communicator's stream; `call` gets the
    /// communicator and the stream in NCCL's types.
    pub fn queue(
        &self,
        call: impl FnOnce(
            nccl_sys::ncclComm_t,
            nccl_sys::cudaStream_t,
        ) -> Result<nccl::NcclStatus, nccl::NcclError>,
    ) -> Result<(), String> {
        if self.raw.is_null() {
            return Err("the communicator was aborted".into());
        }
        call(self.raw, self.stream as nccl_sys::cudaStream_t).map(drop).map_err(nccl_text)
    }
}

impl Drop for Comm {
    /// A healthy communicator is finalized (NCCL flushes what its helper
    /// threads still send over the network) and destroyed; one that fails
    /// to finalize within 30 s, or was never healthy, is aborted.
    fn drop(&mut self) {
        _ = self.device.bind();
        if !self.raw.is_null() {
            // SAFETY: `raw` is live; nothing else uses it during drop.
            let finalized = unsafe { nccl::comm_finalize(self.raw) }.is_ok()
                && self.settle(Instant::now() + std::time::Duration::from_secs(30), &|| None).is_ok();
            if finalized && unsafe { nccl::comm_destroy(self.raw) }.is_ok() {
                self.raw = std::ptr::null_mut();
            }
        }
        self.abort(); // nothing to do after a clean destroy
                      // SAFETY: the stream was created by `start_join` and is idle.
        _ = unsafe { driver::stream::destroy(self.stream) };
    }
}

/// NCCL's `NCCL_CONFIG_INITIALIZER` (a C macro, so cudarc cannot offer it)
/// with `blocking = 0`: every field unset but the non-blocking flag.
fn non_blocking_config() -> nccl_sys::ncclConfig_t {
    const UNSET: i32 = i32::MIN; // NCCL_CONFIG_UNDEF_INT
                                 // SAFETY: the struct is plain integers and pointers; zero is valid.
    let mut config: nccl_sys::ncclConfig_t = unsafe { std::mem::zeroed() };
    config.size = std::mem::size_of::<nccl_sys::ncclConfig_t>();
    config.magic = 0xcafe_beef;
    config.version = CONFIG_LAYOUT as u32;
    for field in [
        &mut config.cgaClusterSize,
        &mut config.minCTAs,
        &mut config.maxCTAs,
        &mut config.splitShare,
        &mut config.trafficClass,
        &mut config.collnetEnable,
        &mut config.CTAPolicy,
        &mut config.shrinkShare,
        &mut config.nvlsCTAs,
        &mut config.nChannelsPerNetPeer,
        &mut config.nvlinkCentricSched,
    ] {
        *field = UNSET;
    }
    config.blocking = 0;
    config
}

/// A tensor's device memory as NCCL takes it.
pub fn pointer(tensor: &tch::Tensor) -> *mut c_void {
    tensor.data_ptr()
}
