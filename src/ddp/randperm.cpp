// PyTorch's shuffle for the DistributedSampler
// (src/ddp/sampler.rs wraps it): the numbers 0..n in the order that
//     g = torch.Generator(); g.manual_seed(seed); torch.randperm(n, generator=g)
// gives, drawn from a generator of its own, so the global generator (the one
// torch.manual_seed and tch::manual_seed set, which draws the initial weights)
// is never advanced. Compiled by build.rs with the cc crate; tested by
// `cargo test --features solutions,mpi,nccl --test torch_sampler`.
//
// Rule: the entry point catches every C++ exception and returns non-zero
// with the message in `error`; nothing unwinds into Rust.

#include <cstdint>
#include <cstring>
#include <exception>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/randperm.h>

extern "C" {

// Writes randperm(n) seeded with `seed` into out[0..n). Returns 0, or 1
// with a NUL-terminated message in `error`.
int ddp_randperm(int64_t n, uint64_t seed, int64_t *out, char *error, size_t error_len) {
  try {
    // A fresh CPU generator seeded as torch.Generator().manual_seed(seed) is
    // (a Mersenne Twister on `seed`), owned by this call alone.
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
    at::Tensor order = at::randperm(n, generator, at::kLong).contiguous();  // [n], CPU, int64
    std::memcpy(out, order.data_ptr<int64_t>(), static_cast<size_t>(n) * sizeof(int64_t));
    return 0;
  } catch (const std::exception &e) {
    if (error != nullptr && error_len > 0) {
      std::strncpy(error, e.what(), error_len - 1);
      error[error_len - 1] = '\0';
    }
    return 1;
  }
}

}  // extern "C"
