//! The CUDA driver calls of the NCCL backend, through
//! cudarc's `result` layer: the GPU's context, the default stream libtorch
//! uses, and events. cudarc opens the driver the first time one of its
//! functions is called, and panics if it cannot; so nothing here calls the
//! driver before [`cuda_library`] has found it.

use cudarc::driver::{result as cuda, sys as cuda_sys, DriverError};

pub fn cuda_text(error: DriverError) -> String {
    format!("the CUDA driver returned {error}")
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

/// How many GPUs the driver sees.
pub fn device_count() -> Result<usize, String> {
    cuda_library()?;
    cuda::init().map_err(cuda_text)?;
    Ok(cuda::device::get_count().map_err(cuda_text)?.max(0) as usize)
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
