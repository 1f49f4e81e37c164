//! src/dist/nccl/ffi.rs: every raw NCCL and CUDA driver call of the NCCL
//! backend, through cudarc's `result` layer, each failure turned into a
//! sentence. cudarc opens both libraries the first time one of their
//! functions is called, and panics if it cannot; so nothing here calls
//! NCCL before [`nccl_library`], or the driver before [`cuda_library`], has
//! found the library. Tested by `cargo test --features nccl --test nccl`.

use std::ffi::{c_void, CStr};
use std::time::Instant;

use cudarc::driver::{result as cuda, sys as cuda_sys, DriverError};
use cudarc::nccl::{result as nccl, sys as nccl_sys};
use tch::Kind;

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

fn cuda_text(error: DriverError) -> String {
    format!("the CUDA driver returned {error}")
}

/// Whether NCCL can be loaded, or what to do about it.
pub fn nccl_library() -> Result<(), String> {
    // SAFETY: tries to open the library under its usual names, then closes it.
    match unsafe { nccl_sys::is_culib_present() } {
        true => Ok(()),
        false => Err("NCCL was not found. cudarc opens `libnccl.so`, and the torch wheel ships it \
                      as `libnccl.so.2`: run scripts/setup.sh, which links .nccl/libnccl.so to the \
                      wheel's copy (the binaries look there), or start the program with a folder \
                      holding a `libnccl.so` on LD_LIBRARY_PATH"
            .into()),
    }
}

/// Whether the CUDA driver can be loaded, or why not.
pub fn cuda_library() -> Result<(), String> {
    // SAFETY: as in nccl_library.
    match unsafe { cuda_sys::is_culib_present() } {
        true => Ok(()),
        false => Err("the CUDA driver (libcuda.so.1) was not found: this machine has no NVIDIA \
                      driver, so no GPU for NCCL to run on"
            .into()),
    }
}

/// The loaded NCCL's version as a number: 22809 for 2.28.9.
pub fn nccl_version() -> Result<i32, String> {
    nccl_library()?;
    nccl::get_nccl_version().map_err(nccl_text)
}

/// A fresh unique id. NCCL also starts a listener in this process, which
/// the other ranks reach at the address inside the id: keep this process
/// running until every rank has joined.
pub fn unique_id() -> Result<IdBytes, String> {
    nccl_library()?;
    let id = nccl::get_uniqueid().map_err(nccl_text)?;
    Ok(id.internal.map(|c| c as u8))
}

/// How many GPUs the driver sees.
pub fn device_count() -> Result<usize, String> {
    cuda_library()?;
    cuda::init().map_err(cuda_text)?;
    Ok(cuda::device::get_count().map_err(cuda_text)?.max(0) as usize)
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

/// A GPU's primary context, the one libtorch uses too; released on drop.
pub struct Device {
    device: cuda_sys::CUdevice,
    context: cuda_sys::CUcontext,
}

// SAFETY: a CUDA context may be made current on any thread.
unsafe impl Send for Device {}

impl Device {
    pub fn retain(ordinal: usize) -> Result<Device, String> {
        cuda_library()?;
        cuda::init().map_err(cuda_text)?;
        let device = cuda::device::get(ordinal as i32).map_err(cuda_text)?;
        // SAFETY: `device` came from the driver.
        let context = unsafe { cuda::primary_ctx::retain(device) }.map_err(cuda_text)?;
        let device = Device { device, context };
        device.bind()?;
        Ok(device)
    }

    /// Makes the context current on the calling thread: every driver call
    /// acts on the current context, and a caller may be any thread (the
    /// overlap hooks run on libtorch's autograd thread for the GPU).
    pub fn bind(&self) -> Result<(), String> {
        // SAFETY: the context is retained until drop.
        unsafe { cuda::ctx::set_current(self.context) }.map_err(cuda_text)
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `Device::retain`.
        _ = unsafe { cuda::primary_ctx::release(self.device) };
    }
}

/// The legacy default stream, where libtorch runs its kernels unless told
/// otherwise (tch never tells it otherwise).
pub fn torch_stream() -> cuda_sys::CUstream {
    cuda::stream::null()
}

/// A CUDA event: a point in one stream's queue of work.
pub struct Event(cuda_sys::CUevent);

// SAFETY: events may be queried and destroyed from any thread.
unsafe impl Send for Event {}

impl Event {
    /// An event recorded now on `stream`: it completes when everything
    /// queued on `stream` before it has.
    pub fn record_on(stream: cuda_sys::CUstream) -> Result<Event, String> {
        let flags = cuda_sys::CUevent_flags::CU_EVENT_DISABLE_TIMING;
        let event = Event(cuda::event::create(flags).map_err(cuda_text)?);
        // SAFETY: both handles are live.
        unsafe { cuda::event::record(event.0, stream) }.map_err(cuda_text)?;
        Ok(event)
    }

    /// Makes `stream` wait, on the GPU, for this event; the host goes on.
    pub fn block(&self, stream: cuda_sys::CUstream) -> Result<(), String> {
        let flags = cuda_sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT;
        // SAFETY: both handles are live.
        unsafe { cuda::stream::wait_event(stream, self.0, flags) }.map_err(cuda_text)
    }

    pub fn is_done(&self) -> Result<bool, String> {
        // SAFETY: the event is live.
        match unsafe { cuda::event::query(self.0) } {
            Ok(()) => Ok(true),
            Err(DriverError(cuda_sys::CUresult::CUDA_ERROR_NOT_READY)) => Ok(false),
            Err(error) => Err(cuda_text(error)),
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: destroying a recorded event is allowed; the driver frees
        // it once its work is done.
        _ = unsafe { cuda::event::destroy(self.0) };
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
    pub stream: cuda_sys::CUstream,
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
        let stream = cuda::stream::create(cuda::stream::StreamKind::NonBlocking).map_err(cuda_text)?;
        let mut config = non_blocking_config();
        let id = nccl_sys::ncclUniqueId { internal: id.map(|b| b as std::ffi::c_char) };
        let mut raw: nccl_sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: `raw` and `config` outlive the call.
        unsafe { nccl::comm_init_rank_config(&mut raw, world as i32, id, rank as i32, &mut config) }
            .map_err(nccl_text)?;
        Ok(Comm { raw, stream, device })
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

    /// Waits for `state` to leave `Busy`, until `deadline`.
    pub fn settle(&self, deadline: Instant) -> Result<(), String> {
        loop {
            match self.state() {
                State::Ready => return Ok(()),
                State::Failed(why) => return Err(why),
                State::Busy if Instant::now() >= deadline => return Err("deadline".into()),
                State::Busy => std::thread::yield_now(),
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
    fn drop(&mut self) {
        _ = self.device.bind();
        self.abort(); // nothing is in flight by now: the group waited for it
                      // SAFETY: the stream was created by `start_join` and is idle.
        _ = unsafe { cuda::stream::destroy(self.stream) };
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
    config.version = 22809; // the layout of NCCL 2.28.9
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
