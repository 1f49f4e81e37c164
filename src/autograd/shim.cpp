// src/autograd/shim.cpp: the two things of libtorch's autograd that the tch
// crate does not expose, for Rust (src/autograd/mod.rs wraps them safely):
//   1. a hook that runs when a parameter's gradient has been accumulated in
//      a backward pass (PyTorch's Tensor.register_post_accumulate_grad_hook),
//      which overlapping DDP uses to start a bucket's all-reduce early;
//   2. installing a tensor as a parameter's .grad (`param.grad = view`).
// Compiled by build.rs with the cc crate; tested by `cargo test --test autograd`.
//
// Rules: every entry point catches C++ exceptions and returns non-zero with
// the message in `error`; the Rust callback never unwinds (Rust catches its
// panics before returning here).

#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

extern "C" {
// Called with the context and index given at registration.
typedef void (*ddp_grad_ready_fn)(void *context, int64_t index);
}

namespace {

// The hook object autograd owns: it calls back into Rust.
struct RustHook : torch::autograd::PostAccumulateGradHook {
  ddp_grad_ready_fn callback;
  void *context;
  int64_t index;
  RustHook(ddp_grad_ready_fn callback, void *context, int64_t index)
      : callback(callback), context(context), index(index) {}
  void operator()(const torch::autograd::Variable & /*tensor*/) override { callback(context, index); }
};

int fail(const char *what, char *error, size_t error_len) {
  if (error != nullptr && error_len > 0) {
    std::strncpy(error, what, error_len - 1);
    error[error_len - 1] = '\0';
  }
  return 1;
}

}  // namespace

extern "C" {

// Registers (callback, context, index) to run after `tensor`'s gradient is
// accumulated; replaces an earlier registration. `tensor` is the at::Tensor*
// of a leaf that requires grad. A null callback removes the hook.
int ddp_set_grad_ready_hook(void *tensor, ddp_grad_ready_fn callback, void *context, int64_t index,
                            char *error, size_t error_len) {
  try {
    auto &leaf = *static_cast<at::Tensor *>(tensor);
    if (callback == nullptr) {
      torch::autograd::impl::set_post_acc_grad_hooks(leaf, nullptr);
    } else {
      torch::autograd::impl::set_post_acc_grad_hooks(leaf, std::make_unique<RustHook>(callback, context, index));
    }
    return 0;
  } catch (const std::exception &e) {
    return fail(e.what(), error, error_len);
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
  }
}

}  // extern "C"
