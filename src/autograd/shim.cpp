// The two things of libtorch's autograd that the tch
// crate does not expose, for Rust (src/autograd/mod.rs wraps them safely):
//   1. a hook that runs when a parameter's gradient has been accumulated in
//      a backward pass (PyTorch's Tensor.register_post_accumulate_grad_hook),
//      which overlapping DDP uses to start a bucket's all-reduce early;
//   2. installing a tensor as a parameter's .grad (`param.grad = view`);
//   3. a hook on the gradient of any tensor (Tensor.register_hook), which
//      FSDP uses to gather a unit's parameters before its backward;
//   4. resizing a tensor's storage in place (FSDP2's
//      `untyped_storage().resize_(0)`), which frees a full parameter's memory
//      while autograd still holds references to it, and later re-allocates
//      the same storage to be filled again.
// Compiled by build.rs with the cc crate; tested by `cargo test --test autograd`.
//
// Rules: every entry point catches every C++ exception and returns non-zero
// with the message in `error`; the Rust callback never unwinds (Rust catches its
// panics before returning here).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/native/Resize.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

extern "C" {
// Called with the context and index given at registration.
typedef void (*ddp_grad_ready_fn)(void *context, int64_t index);
// Called with the context given to ddp_register_grad_hook; the second frees it.
typedef void (*ddp_hook_fn)(void *context);
}

namespace {

// The one hook object autograd keeps per parameter: libtorch holds a single
// post-accumulate hook in each leaf, so every Rust registration on that leaf
// is an entry of this list, and each guard removes only its own entry (two
// wrappers on one model must not clobber each other's hooks).
//
// A guard may be dropped on one thread while backward runs the hooks on
// another. So the entries are read and changed under `mutex` only: a removal
// waits for a callback of this leaf that is running, and no callback starts
// on an entry once its removal has returned (Rust then frees the entry's
// context). And the object is never taken out of the leaf once made: autograd
// may hold a pointer to it in the middle of a backward pass; with no entry
// left it calls nothing, and it goes with the leaf.
struct RustHooks : torch::autograd::PostAccumulateGradHook {
  struct Entry {
    ddp_grad_ready_fn callback;
    void *context;
    int64_t index;
  };
  std::mutex mutex;
  std::vector<Entry> entries;
  void operator()(const torch::autograd::Variable & /*tensor*/) override {
    // The callbacks only mark gradients ready; none adds or removes a hook
    // (that would wait for this lock forever).
    std::lock_guard<std::mutex> lock(mutex);
    for (const Entry &entry : entries) entry.callback(entry.context, entry.index);
  }
};

int fail(const char *what, char *error, size_t error_len) {
  if (error != nullptr && error_len > 0) {
    std::strncpy(error, what, error_len - 1);
    error[error_len - 1] = '\0';
  }
  return 1;
}

// The leaf's list of Rust hooks, or null when it has none. Throws when the
// leaf holds a hook that is not ours (a Python hook, say): replacing it would
// silently drop it.
RustHooks *rust_hooks(const at::Tensor &leaf) {
  auto &slot = torch::autograd::impl::post_acc_grad_hooks(leaf);
  if (!slot) return nullptr;
  auto *ours = dynamic_cast<RustHooks *>(slot.get());
  if (ours == nullptr) {
    throw std::runtime_error("the parameter already holds a post-accumulate-grad hook that this workbook did not set");
  }
  return ours;
}

}  // namespace

extern "C" {

// Adds (callback, context, index) to the hooks that run after `tensor`'s
// gradient is accumulated. `tensor` is the at::Tensor* of a leaf that requires
// grad. A null callback removes every entry of `context` from this leaf,
// after any callback of this leaf running on another thread has returned;
// entries of other contexts stay.
int ddp_set_grad_ready_hook(void *tensor, ddp_grad_ready_fn callback, void *context, int64_t index,
                            char *error, size_t error_len) {
  try {
    auto &leaf = *static_cast<at::Tensor *>(tensor);
    RustHooks *hooks = rust_hooks(leaf);
    if (callback == nullptr) {
      if (hooks == nullptr) return 0;
      std::lock_guard<std::mutex> lock(hooks->mutex);  // waits for a running callback
      auto &entries = hooks->entries;
      entries.erase(std::remove_if(entries.begin(), entries.end(),
                                   [context](const RustHooks::Entry &e) { return e.context == context; }),
                    entries.end());
      return 0;  // the (maybe empty) object stays: see RustHooks
    }
    if (hooks == nullptr) {
      auto fresh = std::make_unique<RustHooks>();
      hooks = fresh.get();
      torch::autograd::impl::set_post_acc_grad_hooks(leaf, std::move(fresh));
    }
    std::lock_guard<std::mutex> lock(hooks->mutex);
    hooks->entries.push_back({callback, context, index});
    return 0;
  } catch (const std::exception &e) {
    return fail(e.what(), error, error_len);
  } catch (...) {
    return fail("an unknown C++ exception", error, error_len);
  }
}

// Makes `grad` the gradient of `param` (no copy: later backward passes
// accumulate into `grad`'s memory). Both are at::Tensor*.
int ddp_set_grad(void *param, void *grad, char *error, size_t error_len) {
  try {
    static_cast<at::Tensor *>(param)->mutable_grad() = *static_cast<at::Tensor *>(grad);
    return 0;
  } catch (const std::exception &e) {
    return fail(e.what(), error, error_len);
  } catch (...) {
    return fail("an unknown C++ exception", error, error_len);
  }
}

// Registers `callback(context)` to run when the gradient of `tensor` (an
// at::Tensor* that requires grad) has been computed in a backward pass,
// before autograd passes it on to the operations that made `tensor`. The
// hook lives as long as the graph does; when it goes, `release(context)`
// runs once (Rust frees its closure there).
int ddp_register_grad_hook(void *tensor, ddp_hook_fn callback, void *context, ddp_hook_fn release,
                           char *error, size_t error_len) {
  try {
    std::shared_ptr<void> owned(context, release);
    auto &t = *static_cast<at::Tensor *>(tensor);
    t.register_hook([callback, owned](const at::Tensor & /*grad*/) { callback(owned.get()); });
    return 0;
  } catch (const std::exception &e) {
    return fail(e.what(), error, error_len);
  } catch (...) {
    return fail("an unknown C++ exception", error, error_len);
  }
}

// Resizes the storage of `tensor` (an at::Tensor* on the CPU) to `nbytes`
// in place: 0 frees its memory, while every tensor that shares the storage
// (autograd's saved references included) keeps pointing at it; a later
// resize to the full size allocates fresh memory for the same storage. The
// tensor's sizes do not change. CUDA would need at::native::resize_bytes_cuda
// (ATen/native/cuda/Resize.h, through the caching allocator), which this
// CPU-only shim does not link.
int ddp_resize_storage(void *tensor, int64_t nbytes, char *error, size_t error_len) {
  try {
    auto &t = *static_cast<at::Tensor *>(tensor);
    if (!t.device().is_cpu()) {
      throw std::runtime_error("resizing a storage in place is implemented for CPU tensors only");
    }
    at::native::resize_bytes_cpu(t.storage().unsafeGetStorageImpl(), static_cast<size_t>(nbytes));
    return 0;
  } catch (const std::exception &e) {
    return fail(e.what(), error, error_len);
  } catch (...) {
    return fail("an unknown C++ exception", error, error_len);
  }
}

// The bytes the storage of `tensor` holds now (0 once resized away).
int64_t ddp_storage_nbytes(void *tensor) {
  auto &t = *static_cast<at::Tensor *>(tensor);
  return t.defined() && t.has_storage() ? static_cast<int64_t>(t.storage().nbytes()) : 0;
}

}  // extern "C"
