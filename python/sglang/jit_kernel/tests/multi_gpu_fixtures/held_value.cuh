// held_value: a tiny CUDA module of test_multi_gpu.py. held_fill(out) writes HELD_VALUE (a -D flag of
// the build, default 1) into every element of an int32 tensor; held_value() returns it from the host.
// Two builds with different -DHELD_VALUE are two artifacts of one module name.
#pragma once

#include <sgl_kernel/utils.cuh>  // For host::LaunchKernel

#include <cstdint>
#include <tvm/ffi/container/tensor.h>

#ifndef HELD_VALUE
#define HELD_VALUE 1
#endif

namespace {

__global__ void held_fill_kernel(int32_t* out, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = HELD_VALUE;
}

/// out[i] = HELD_VALUE for a contiguous int32 CUDA tensor of at most 2^24 elements, on its device's
/// current stream.
void held_fill(tvm::ffi::TensorView out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>((n + 255) / 256);
  host::LaunchKernel(dim3(blocks), dim3(256), out.device())(held_fill_kernel, static_cast<int32_t*>(out.data_ptr()), n);
}

int64_t held_value() { return HELD_VALUE; }

}  // namespace
