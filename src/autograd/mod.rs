//! What libtorch's autograd can do and the `tch` crate does not expose,
//! through a small C++ shim (`shim.cpp`, compiled by `build.rs`):
//!
//! - [`GradReadyHooks`]: a callback that runs the moment a parameter's
//!   gradient has been accumulated in a backward pass (PyTorch's
//!   `register_post_accumulate_grad_hook`). DDP uses it to start a bucket's
//!   all-reduce while backward still computes the earlier layers.
//! - [`set_grad`]: makes a tensor a parameter's `.grad` without copying
//!   (`param.grad = view`), so that backward accumulates into it;
//!   [`clear_grad`] sets `param.grad = None`.
//! - [`register_grad_hook`]: a callback that runs when the gradient of any
//!   tensor (an activation, say) has been computed, before autograd passes
//!   it on (PyTorch's `Tensor.register_hook`). FSDP gathers a unit's
//!   parameters there, just before the unit's backward.
//! - [`resize_storage`], [`storage_bytes`]: free a tensor's memory in place
//!   and allocate it again (FSDP2's `untyped_storage().resize_(0)`), so a
//!   parameter that autograd saved for backward can be dropped after the
//!   forward and filled again before the backward. CPU only.
//!
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use ddp_workbook::autograd::GradReadyHooks;
//! use ddp_workbook::tch::{Kind, Tensor};
//!
//! let (w, b) = (Tensor::ones([2], (Kind::Float, ddp_workbook::tch::Device::Cpu)).set_requires_grad(true),
//!               Tensor::zeros([2], (Kind::Float, ddp_workbook::tch::Device::Cpu)).set_requires_grad(true));
//! let order = Arc::new(Mutex::new(vec![]));
//! let seen = order.clone();
//! let hooks = GradReadyHooks::register(&[w.shallow_clone(), b.shallow_clone()], move |i| seen.lock().unwrap().push(i))?;
//! (&w * 3.0 + &b).sum(None).backward();
//! assert_eq!(order.lock().unwrap().len(), 2); // each gradient, once, when ready
//! drop(hooks); // removes them
//! # Ok::<(), ddp_workbook::autograd::AutogradError>(())
//! ```

use std::ffi::{c_char, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

use tch::Tensor;

type RawCallback = extern "C" fn(context: *mut c_void, index: i64);

extern "C" {
    fn ddp_set_grad_ready_hook(
        tensor: *mut c_void,
        callback: Option<RawCallback>,
        context: *mut c_void,
        index: i64,
        error: *mut c_char,
        error_len: usize,
    ) -> i32;
    fn ddp_set_grad(param: *mut c_void, grad: *mut c_void, error: *mut c_char, error_len: usize) -> i32;
    fn ddp_register_grad_hook(
        tensor: *mut c_void,
        callback: extern "C" fn(*mut c_void),
        context: *mut c_void,
        release: extern "C" fn(*mut c_void),
        error: *mut c_char,
        error_len: usize,
    ) -> i32;
    fn ddp_resize_storage(tensor: *mut c_void, nbytes: i64, error: *mut c_char, error_len: usize) -> i32;
    fn ddp_storage_nbytes(tensor: *mut c_void) -> i64;
}

/// Why a hook or a gradient could not be set.
#[derive(Debug, thiserror::Error)]
pub enum AutogradError {
    #[error("{what}: libtorch says: {message}")]
    Libtorch { what: String, message: String },
    #[error("{0}")]
    Invalid(String),
}

/// Calls a shim entry point with an error buffer, and turns a non-zero
/// status into an error naming `what`.
fn call_shim(
    what: impl FnOnce() -> String,
    call: impl FnOnce(*mut c_char, usize) -> i32,
) -> Result<(), AutogradError> {
    let mut error = [0 as c_char; 1024];
    if call(error.as_mut_ptr(), error.len()) == 0 {
        return Ok(());
    }
    // SAFETY: the shim always writes a NUL-terminated message on failure.
    let message = unsafe { CStr::from_ptr(error.as_ptr()) }.to_string_lossy();
    let message = crate::error_text::cause_in_words(&message);
    Err(AutogradError::Libtorch { what: what(), message })
}

/// What the hooks of one registration call, and the first panic they hit.
struct HookContext {
    callback: Box<dyn Fn(usize) + Send + Sync>,
    panicked: Mutex<Option<String>>,
}

/// Runs on the thread that runs backward. A panic must not unwind into
/// C++: it is caught and kept for [`GradReadyHooks::take_panic`].
extern "C" fn grad_ready(context: *mut c_void, index: i64) {
    // SAFETY: the context outlives every hook that points at it: the guard
    // removes the hooks before it frees the context.
    let context = unsafe { &*(context as *const HookContext) };
    if let Err(panic) = catch_unwind(AssertUnwindSafe(|| (context.callback)(index as usize))) {
        let message = crate::error_text::panic_message(panic.as_ref());
        let mut first = context.panicked.lock().unwrap_or_else(|p| p.into_inner());
        first.get_or_insert(message);
    }
}

/// "Gradient ready" hooks on a list of parameters: after each backward pass
/// accumulates parameter `i`'s gradient, the callback runs with `i` (the
/// gradient is final then). Dropping the guard removes its own hooks, so no
/// callback can outlive what it uses; also while backward runs on another
/// thread: the drop waits for a callback of this guard that is running, and
/// none runs once it has returned. (So a callback must not drop or register
/// hooks itself: it would wait for itself.) Several guards may hook the same
/// parameter (two wrappers on one model): each fires, in registration
/// order, and dropping one leaves the others' hooks in place.
pub struct GradReadyHooks {
    params: Vec<Tensor>,
    /// Owned by this guard (from `Box::into_raw`, freed in `drop` after the
    /// hooks are gone): the hooks hold this address, so it must never move
    /// or be reborrowed mutably while they can fire.
    context: *mut HookContext,
}

// SAFETY: what the raw pointer owns is `Send + Sync` (a `Send + Sync`
// callback and a mutex), and the tensors are `Send`: the guard may move to
// another thread, as it could when the context was a `Box`.
unsafe impl Send for GradReadyHooks {}

impl GradReadyHooks {
    /// Hooks every tensor of `params` (leaves that require grad) with
    /// `callback`, which receives the tensor's index in `params`. Register
    /// before any backward pass through these tensors runs on another
    /// thread: libtorch's slot for the hook has no lock of its own (a drop
    /// needs none: the slot never changes then).
    pub fn register(
        params: &[Tensor],
        callback: impl Fn(usize) + Send + Sync + 'static,
    ) -> Result<Self, AutogradError> {
        let context = HookContext { callback: Box::new(callback), panicked: Mutex::new(None) };
        let mut hooks = GradReadyHooks { params: vec![], context: Box::into_raw(Box::new(context)) };
        for (index, param) in params.iter().enumerate() {
            if !param.requires_grad() || !param.is_leaf() {
                let detail = format!("parameter {index} is not a leaf tensor that requires grad: autograd never accumulates a gradient into it");
                return Err(AutogradError::Invalid(detail)); // `hooks` drops: the earlier ones are removed
            }
            let context = hooks.context as *mut c_void;
            let tensor = param.as_ptr() as *mut c_void;
            call_shim(
                || format!("registering the gradient hook of parameter {index}"),
                // SAFETY: `tensor` is a live at::Tensor (tch's handle); the shim catches exceptions.
                |error, len| unsafe {
                    ddp_set_grad_ready_hook(tensor, Some(grad_ready), context, index as i64, error, len)
                },
            )?;
            hooks.params.push(param.shallow_clone());
        }
        Ok(hooks)
    }

    /// The first panic of a callback since the last call, if any (the hook
    /// itself cannot fail the backward pass that ran it).
    pub fn take_panic(&self) -> Option<String> {
        // SAFETY: the context lives until `drop`.
        let context = unsafe { &*self.context };
        context.panicked.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

impl Drop for GradReadyHooks {
    fn drop(&mut self) {
        let context = self.context as *mut c_void;
        for param in &self.params {
            let tensor = param.as_ptr() as *mut c_void;
            // SAFETY: as in `register`; a null callback removes this guard's
            // entries (those with this context) and no one else's. Removal
            // cannot fail for a tensor that held one; if it did, the next
            // backward would call into freed memory, so stop here.
            let removed = call_shim(String::new, |error, len| unsafe {
                ddp_set_grad_ready_hook(tensor, None, context, 0, error, len)
            });
            if let Err(error) = removed {
                eprintln!("could not remove a gradient hook ({error}); aborting rather than risk a dangling callback");
                std::process::abort();
            }
        }
        // SAFETY: from `Box::into_raw` in `register`; no hook points at it
        // now, and none is running (the shim's removal waited for it).
        drop(unsafe { Box::from_raw(self.context) });
    }
}

/// Makes `grad` the gradient of `param`, without a copy: backward passes
/// then add into `grad`'s memory. Typical use: `grad` is a view of a slot
/// of a flat bucket. Both must have the same shape, dtype and device, and
/// `param` must be a leaf that requires grad. Zero such a gradient in place
/// (`grad.zero_()`): tch's `Optimizer::zero_grad` detaches each gradient in
/// place first, which libtorch refuses for a view (PyTorch's DDP with
/// `gradient_as_bucket_view` meets the same rule).
pub fn set_grad(param: &Tensor, grad: &Tensor) -> Result<(), AutogradError> {
    if !param.requires_grad() || !param.is_leaf() {
        return Err(AutogradError::Invalid("the parameter is not a leaf tensor that requires grad".into()));
    }
    let (p, g) = ((param.size(), param.kind(), param.device()), (grad.size(), grad.kind(), grad.device()));
    if p != g {
        return Err(AutogradError::Invalid(format!(
            "a {:?}{:?} gradient on {:?} cannot belong to a {:?}{:?} parameter on {:?}",
            g.1, g.0, g.2, p.1, p.0, p.2
        )));
    }
    let (param, grad) = (param.as_ptr() as *mut c_void, grad.as_ptr() as *mut c_void);
    // SAFETY: both are live at::Tensor handles; the shim catches exceptions.
    call_shim(|| "setting a gradient".into(), |error, len| unsafe { ddp_set_grad(param, grad, error, len) })
}

/// Sets `param.grad = None`: the gradient's memory goes with its last
/// reference, and the next backward allocates a fresh one.
pub fn clear_grad(param: &Tensor) -> Result<(), AutogradError> {
    let undefined = Tensor::new();
    let (param, grad) = (param.as_ptr() as *mut c_void, undefined.as_ptr() as *mut c_void);
    // SAFETY: both are live at::Tensor handles (one undefined); the shim catches exceptions.
    call_shim(|| "clearing a gradient".into(), |error, len| unsafe { ddp_set_grad(param, grad, error, len) })
}

type GradHook = Box<dyn Fn() + Send + Sync>;

extern "C" fn run_grad_hook(context: *mut c_void) {
    // SAFETY: `context` is the `Box<GradHook>` leaked in `register_grad_hook`,
    // alive until `release_grad_hook` runs, after the last call.
    let hook = unsafe { &*(context as *const GradHook) };
    // A panic must not unwind into C++; the hook reports its own errors.
    if let Err(panic) = catch_unwind(AssertUnwindSafe(hook)) {
        eprintln!("a gradient hook panicked: {}", crate::error_text::panic_message(panic.as_ref()));
    }
}

extern "C" fn release_grad_hook(context: *mut c_void) {
    // SAFETY: from `Box::into_raw` in `register_grad_hook`; libtorch calls
    // this once, when the hook goes with the graph.
    drop(unsafe { Box::from_raw(context as *mut GradHook) });
}

/// Runs `callback` each time a backward pass has computed the gradient of
/// `tensor` (which must require grad), before that gradient flows on into
/// the operations that made `tensor` (PyTorch's `tensor.register_hook`).
/// The hook lives as long as the autograd graph that holds `tensor`. The
/// callback runs on the backward thread and must not panic: report errors
/// some other way (a panic is printed and otherwise ignored).
pub fn register_grad_hook(
    tensor: &Tensor,
    callback: impl Fn() + Send + Sync + 'static,
) -> Result<(), AutogradError> {
    if !tensor.requires_grad() {
        return Err(AutogradError::Invalid(
            "the tensor does not require grad: no backward pass computes its gradient".into(),
        ));
    }
    let boxed: Box<GradHook> = Box::new(Box::new(callback));
    let context = Box::into_raw(boxed) as *mut c_void;
    let tensor = tensor.as_ptr() as *mut c_void;
    // SAFETY: a live at::Tensor; on failure the shim's shared_ptr has
    // already released `context`, or never took it (then it leaks a closure).
    call_shim(
        || "registering a gradient hook on a tensor".into(),
        |error, len| unsafe {
            ddp_register_grad_hook(tensor, run_grad_hook, context, release_grad_hook, error, len)
        },
    )
}

/// Resizes the storage under `tensor` to `nbytes` in place (CPU tensors):
/// 0 frees its memory, and every tensor sharing the storage, autograd's
/// saved ones included, sees the change; the full size allocates fresh,
/// uninitialised memory for the same storage, to be filled again. The
/// tensor keeps its sizes: do not read it while its storage is empty.
pub fn resize_storage(tensor: &Tensor, nbytes: usize) -> Result<(), AutogradError> {
    let t = tensor.as_ptr() as *mut c_void;
    // SAFETY: a live at::Tensor; the shim catches exceptions.
    call_shim(
        || format!("resizing a storage to {nbytes} bytes"),
        |error, len| unsafe { ddp_resize_storage(t, nbytes as i64, error, len) },
    )
}

/// The bytes the storage under `tensor` holds now (0 after
/// [`resize_storage`] to 0, or for an undefined tensor).
pub fn storage_bytes(tensor: &Tensor) -> usize {
    // SAFETY: a live at::Tensor handle; the shim only reads it.
    unsafe { ddp_storage_nbytes(tensor.as_ptr() as *mut c_void) as usize }
}
