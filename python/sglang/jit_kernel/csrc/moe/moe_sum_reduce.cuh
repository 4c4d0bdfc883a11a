// moe_sum_reduce: output[t, h] = routed_scaling_factor * sum_k input[t, k, h], the sum in fp32 in
// order k = 0, 1, ..., the product rounded once to the dtype.
//
// Memory-bound: reads num_tokens * topk * hidden_size elements, writes num_tokens * hidden_size.
// A thread owns one 16-byte column chunk of one token and loads its topk chunks before adding them
// (topk independent LDG.128 in flight); rows whose strides or pointers are not 16-byte aligned take
// the one-element chunk. 64-bit offsets, any token and k strides.
#pragma once

// For TensorMatcher, SymbolicSize, SymbolicDevice, data_ptr, verify_no_partial_overlap,
// verify_no_self_overlap
#include <sgl_kernel/tensor.h>
#include <sgl_kernel/utils.h>  // For div_ceil

#include <sgl_kernel/utils.cuh>  // For LaunchKernel, fp16_t, bf16_t, fp32_t
#include <sgl_kernel/vec.cuh>    // For AlignedVector

#include <algorithm>
#include <cstdint>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

namespace {

/// Kernel arguments of moe_sum_reduce. Strides in elements.
template <typename T>
struct SumReduceParams {
  const T* input;  // [num_tokens, topk, hidden_size], strides (token_stride, k_stride, 1)
  T* output;       // [num_tokens, hidden_size], strides (out_stride, 1)
  int64_t num_tokens;
  int64_t topk;
  int64_t hidden_size;
  int64_t token_stride;
  int64_t k_stride;
  int64_t out_stride;
  float scale;  // routed_scaling_factor
};

/// Launch facts: kThreads per block; the grid covers every chunk up to kMaxBlocks, then loops.
struct SumReduceConfig {
  static constexpr uint32_t kThreads = 256;
  static constexpr int64_t kMaxBlocks = 1 << 20;
  static constexpr int kMaxUnrolledK = 8;  // loads issued together; larger topk loops in groups of 8
};

template <typename T, int kVecN>
__global__ void __launch_bounds__(SumReduceConfig::kThreads) moe_sum_reduce_kernel(const SumReduceParams<T> p) {
  using vec_t = device::AlignedVector<T, kVecN>;
  constexpr int kGroup = SumReduceConfig::kMaxUnrolledK;
  const int64_t chunks_per_row = p.hidden_size / kVecN;
  const int64_t total = p.num_tokens * chunks_per_row;
  for (int64_t item = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; item < total;
       item += int64_t{gridDim.x} * blockDim.x) {
    const int64_t token = item / chunks_per_row;
    const int64_t column = (item - token * chunks_per_row) * kVecN;
    const T* src = p.input + token * p.token_stride + column;
    float acc[kVecN] = {};
    for (int64_t k0 = 0; k0 < p.topk; k0 += kGroup) {
      vec_t v[kGroup];
#pragma unroll
      for (int u = 0; u < kGroup; ++u) {
        if (k0 + u < p.topk) v[u].load(src + (k0 + u) * p.k_stride, 0);
      }
#pragma unroll
      for (int u = 0; u < kGroup; ++u) {
        if (k0 + u < p.topk) {
#pragma unroll
          for (int i = 0; i < kVecN; ++i) acc[i] += static_cast<float>(v[u][i]);
        }
      }
    }
    vec_t out;
#pragma unroll
    for (int i = 0; i < kVecN; ++i) out[i] = static_cast<T>(acc[i] * p.scale);
    out.store(p.output + token * p.out_stride + column, 0);
  }
}

/// output = routed_scaling_factor * input.sum(dim=1). input [num_tokens, topk, hidden_size] and
/// output [num_tokens, hidden_size] of T (fp16_t | bf16_t | fp32_t), last dims contiguous, any other
/// strides, on one CUDA device, not overlapping. Empty inputs return without a launch (topk == 0
/// writes zeros). Throws PanicError (Python RuntimeError) naming the tensor on a mismatch.
template <typename T>
void moe_sum_reduce(tvm::ffi::TensorView input, tvm::ffi::TensorView output, double routed_scaling_factor) {
  using namespace host;
  constexpr int64_t kVecN = 16 / sizeof(T);

  // Validate
  SymbolicSize num_tokens{"num_tokens"};
  SymbolicSize topk{"topk"};
  SymbolicSize hidden_size{"hidden_size"};
  SymbolicSize token_stride{"token_stride"};
  SymbolicSize k_stride{"k_stride"};
  SymbolicSize out_stride{"out_stride"};
  SymbolicDevice device_;
  device_.set_options<kDLCUDA>();
  TensorMatcher({num_tokens, topk, hidden_size})  //
      .with_strides({token_stride, k_stride, 1})
      .with_dtype<T>()
      .with_device<kDLCUDA>(device_)
      .verify(input, "input");
  TensorMatcher({num_tokens, hidden_size})  //
      .with_strides({out_stride, 1})
      .with_dtype<T>()
      .with_device<kDLCUDA>(device_)
      .verify(output, "output");
  verify_no_self_overlap(output, "output");
  verify_no_partial_overlap(output, "output", input, "input", /*allow_same=*/false);

  // Unwrap
  const SumReduceParams<T> params{
      .input = data_ptr<const T>(input),
      .output = data_ptr<T>(output),
      .num_tokens = num_tokens.unwrap(),
      .topk = topk.unwrap(),
      .hidden_size = hidden_size.unwrap(),
      .token_stride = token_stride.unwrap(),
      .k_stride = k_stride.unwrap(),
      .out_stride = out_stride.unwrap(),
      .scale = static_cast<float>(routed_scaling_factor),
  };
  const DLDevice device = device_.unwrap();
  if (params.num_tokens == 0 || params.hidden_size == 0) return;

  // Configure: 16-byte chunks when every row start is 16-byte aligned
  const auto aligned16 = [](int64_t v) { return v % 16 == 0; };
  const auto addr = [](const void* ptr) { return static_cast<int64_t>(reinterpret_cast<std::uintptr_t>(ptr)); };
  const int64_t elt = sizeof(T);
  const bool vectorized = params.hidden_size % kVecN == 0 && aligned16(addr(params.input)) &&
                          aligned16(addr(params.output)) && aligned16(params.token_stride * elt) &&
                          aligned16(params.k_stride * elt) && aligned16(params.out_stride * elt);
  const int64_t vec = vectorized ? kVecN : 1;
  const int64_t chunks = params.num_tokens * (params.hidden_size / vec);
  const auto grid = static_cast<uint32_t>(
      std::clamp<int64_t>(div_ceil(chunks, int64_t{SumReduceConfig::kThreads}), 1, SumReduceConfig::kMaxBlocks));

  // Launch
  const auto kernel = vectorized ? moe_sum_reduce_kernel<T, kVecN> : moe_sum_reduce_kernel<T, 1>;
  LaunchKernel(grid, SumReduceConfig::kThreads, device)(kernel, params);
}

}  // namespace
