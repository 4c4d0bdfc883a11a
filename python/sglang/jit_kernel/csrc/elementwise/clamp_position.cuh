// clamp_position: out[i] = max(seq_lens[i] - 1, 0) for int32 / int64 seq_lens of any stride, into a
// new contiguous out. Computed as `x > 0 ? x - 1 : 0`, so the most negative value gives 0 (no
// wrap-around). A launch-latency op (decode batches of a few hundred entries): one grid-stride
// kernel, one element per thread per step.
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, SymbolicSize, SymbolicDType, SymbolicDevice, verify_no_partial_overlap
#include <sgl_kernel/utils.h>  // For div_ceil

#include <sgl_kernel/utils.cuh>  // For LaunchKernel

#include <algorithm>
#include <cstdint>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

namespace {

/// Kernel arguments of clamp_position.
struct ClampPositionParams {
  void* out;             // [n] contiguous, of the index type
  const void* seq_lens;  // [n], seq_lens_stride elements apart
  int64_t seq_lens_stride;
  int64_t n;
};

/// Launch facts of clamp_position.
struct ClampPositionConfig {
  static constexpr uint32_t kThreads = 256;
  static constexpr int64_t kMaxBlocks = 4096;  // past it the threads loop
};

template <typename IndexT>
__global__ void __launch_bounds__(ClampPositionConfig::kThreads) clamp_position_kernel(const ClampPositionParams p) {
  const auto* src = static_cast<const IndexT*>(p.seq_lens);
  auto* dst = static_cast<IndexT*>(p.out);
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < p.n; i += step) {
    const IndexT x = src[i * p.seq_lens_stride];
    dst[i] = x > 0 ? static_cast<IndexT>(x - 1) : IndexT{0};
  }
}

/// clamp_position(out, seq_lens): out [n] contiguous and seq_lens [n] (any stride) of one dtype,
/// int32 or int64, on one CUDA device, disjoint. Throws PanicError (Python RuntimeError) on a
/// mismatch before any launch; nothing is launched for n = 0.
void clamp_position(tvm::ffi::TensorView out, tvm::ffi::TensorView seq_lens) {
  using namespace host;
  using Config = ClampPositionConfig;

  // Validate
  SymbolicSize n{"num_seqs"}, stride{"seq_lens_stride"};
  SymbolicDType dtype;
  dtype.set_options<int32_t, int64_t>();
  SymbolicDevice device_;
  device_.set_options<kDLCUDA>();
  TensorMatcher({n}).with_strides({stride}).with_dtype(dtype).with_device(device_).verify(seq_lens, "seq_lens");
  TensorMatcher({n}).with_dtype(dtype).with_device(device_).verify(out, "out");
  verify_no_partial_overlap(out, "out", seq_lens, "seq_lens", /*allow_same=*/false);

  // Unwrap
  const ClampPositionParams params{out.data_ptr(), seq_lens.data_ptr(), stride.unwrap(), n.unwrap()};
  if (params.n == 0) return;

  // Configure
  const int64_t blocks = std::min(div_ceil(params.n, int64_t{Config::kThreads}), Config::kMaxBlocks);

  // Launch
  const DLDevice device = device_.unwrap();
  if (dtype.is_type<int32_t>()) {
    LaunchKernel(static_cast<uint32_t>(blocks), Config::kThreads, device)(clamp_position_kernel<int32_t>, params);
  } else {
    LaunchKernel(static_cast<uint32_t>(blocks), Config::kThreads, device)(clamp_position_kernel<int64_t>, params);
  }
}

}  // namespace
