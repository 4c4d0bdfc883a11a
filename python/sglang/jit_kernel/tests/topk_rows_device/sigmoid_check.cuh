// Exhaustive device checks of topk_rows.cuh's branch-free sigmoid (test_moe_topk_sigmoid.py):
// reciprocal_in_range(d) against the division 1.0f / d for every float d in [1, 2^125], and
// sigmoid_run against sigmoid for every float v (NaN read as -inf, as the kernels load it), bit for
// bit. Built through load_jit; `sigmoid_check(counts)` writes the two mismatch counts.
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, SymbolicDevice, data_ptr

#include <sgl_kernel/utils.cuh>  // For LaunchKernel

#include <cstdint>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include "../../csrc/moe/topk_rows.cuh"  // For moe_routing::reciprocal_in_range, sigmoid_run, sigmoid

namespace {

constexpr uint32_t kOne = 0x3F800000u;      // 1.0f
constexpr uint32_t kLimit = 0x7E000000u;    // 2^125
constexpr uint64_t kPatterns = 1ull << 32;  // every float bit pattern
constexpr uint32_t kRun = 4;                // values per sigmoid_run

__global__ void sigmoid_check_kernel(unsigned long long* counts) {
  const uint64_t start = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const uint64_t step = uint64_t{gridDim.x} * blockDim.x;
  unsigned long long reciprocal_bad = 0, sigmoid_bad = 0;
  for (uint64_t i = start; i <= kLimit - kOne; i += step) {
    const float d = __uint_as_float(kOne + static_cast<uint32_t>(i));
    reciprocal_bad += __float_as_uint(moe_routing::reciprocal_in_range(d)) != __float_as_uint(1.0f / d);
  }
  for (uint64_t i = start; i < kPatterns / kRun; i += step) {
    float v[kRun], sig[kRun];
#pragma unroll
    for (uint32_t s = 0; s < kRun; ++s) {
      v[s] = __uint_as_float(static_cast<uint32_t>(i * kRun + s));
      if (v[s] != v[s]) v[s] = -INFINITY;
    }
    moe_routing::sigmoid_run<kRun>(v, sig);
#pragma unroll
    for (uint32_t s = 0; s < kRun; ++s) {
      sigmoid_bad += __float_as_uint(sig[s]) != __float_as_uint(moe_routing::sigmoid(v[s]));
    }
  }
  atomicAdd(&counts[0], reciprocal_bad);
  atomicAdd(&counts[1], sigmoid_bad);
}

/// counts: int64 [2] on a CUDA device, zeroed by the caller; gets (reciprocal mismatches, sigmoid
/// mismatches).
void sigmoid_check(tvm::ffi::TensorView counts) {
  using namespace host;
  SymbolicDevice device;
  device.set_options<kDLCUDA>();
  TensorMatcher({2}).with_dtype<int64_t>().with_device<kDLCUDA>(device).verify(counts, "counts");
  LaunchKernel(132 * 16, 256, device.unwrap())(sigmoid_check_kernel, data_ptr<unsigned long long>(counts));
}

}  // namespace
