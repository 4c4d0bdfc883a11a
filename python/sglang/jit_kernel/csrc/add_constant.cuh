// add_constant: dst[i] = src[i] + kConstant for int32 tensors, kConstant a compile-time constant.
//
// The minimal reference kernel of the JIT system: one TensorMatcher, one LaunchKernel, one
// __global__, and a template knob that shows how a compile-time value enters the build marker.
#pragma once

#include <sgl_kernel/tensor.h>   // For TensorMatcher, SymbolicSize, SymbolicDevice
#include <sgl_kernel/utils.h>    // For div_ceil
#include <sgl_kernel/utils.cuh>  // For LaunchKernel

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include <algorithm>
#include <cstdint>

namespace {

/// Kernel arguments of add_constant.
struct AddConstantParams {
  int32_t* dst;          // [num_elements]
  const int32_t* src;    // [num_elements]
  int64_t num_elements;  // may exceed 2^32
};

/// Launch facts of add_constant.
struct AddConstantConfig {
  static constexpr uint32_t kThreads = 256;
  static constexpr int64_t kMaxBlocks = 1 << 20;  // grid cap; the grid-stride loop covers the rest
};

template <int32_t kConstant>
__global__ void add_constant_kernel(const AddConstantParams params) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < params.num_elements; i += stride) {
    // Two's-complement wraparound without signed-overflow UB: add as uint32, reinterpret.
    params.dst[i] = static_cast<int32_t>(static_cast<uint32_t>(params.src[i]) + static_cast<uint32_t>(kConstant));
  }
}

/// dst = src + kConstant. dst, src: contiguous 1-D int32 CUDA tensors of one length, on one device;
/// dst may be src. Empty tensors return without a launch. Throws PanicError (Python RuntimeError).
template <int32_t kConstant>
void add_constant(tvm::ffi::TensorView dst, tvm::ffi::TensorView src) {
  using namespace host;

  // Validate
  SymbolicSize num_elements{"num_elements"};
  SymbolicDevice device_;
  device_.set_options<kDLCUDA>();
  TensorMatcher({num_elements})  //
      .with_dtype<int32_t>()
      .with_device<kDLCUDA>(device_)
      .verify(dst, "out")
      .verify(src, "src");
  verify_no_partial_overlap(dst, "out", src, "src", /*allow_same=*/true);

  // Unwrap
  const AddConstantParams params{
      .dst = static_cast<int32_t*>(dst.data_ptr()),
      .src = static_cast<const int32_t*>(src.data_ptr()),
      .num_elements = num_elements.unwrap(),
  };
  if (params.num_elements == 0) return;

  // Configure
  const int64_t blocks = std::min(div_ceil(params.num_elements, int64_t{AddConstantConfig::kThreads}),
                                  AddConstantConfig::kMaxBlocks);

  // Launch
  LaunchKernel(static_cast<uint32_t>(blocks), AddConstantConfig::kThreads, device_.unwrap())(
      add_constant_kernel<kConstant>, params);
}

}  // namespace
