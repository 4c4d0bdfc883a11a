// per_token_group_quant_8bit: each group of group_size consecutive values of a row gets its own
// scale s = max(max|x|, eps) / q_type_max and q = clamp(x / s, q_min, q_max) in fp8 e4m3 or int8
// (arithmetic and roundings: quantize_8bit.cuh).
//
// Memory-bound: reads num_tokens * hidden_size inputs, writes as many bytes plus one scale per group.
// A group is handled by kLanes = group_size / kVecN consecutive lanes of a warp (at most 32), each
// holding vecs_per_lane 16-byte input chunks in registers: one read of the input, a shuffle reduction
// of the group's maximum, then the quantized bytes are written from the registers. 64-bit offsets;
// any row stride of the input and of output_q; the scale is written at (row * s_row_stride +
// group * s_group_stride), so row-major and column-major (TMA-aligned) scale buffers are the same code.
#pragma once

#include <sgl_kernel/tensor.h>   // For TensorMatcher, SymbolicSize, SymbolicDevice, kAnySize, data_ptr
#include <sgl_kernel/utils.h>    // For RuntimeCheck, div_ceil
#include <sgl_kernel/utils.cuh>  // For LaunchKernel, SGL_DEVICE, kWarpThreads, fp8_e4m3_t
#include <sgl_kernel/warp.cuh>   // For warp::reduce_max

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include "quantize_8bit.cuh"  // For quant::Chunk, block_scale, quantize_chunk, chunk_absmax, is_aligned

#include <algorithm>
#include <cstdint>

namespace {

/// Kernel arguments of per_token_group_quant_8bit. Strides in elements of their own tensor.
struct GroupQuantParams {
  const void* input;         // [num_tokens, hidden_size], row stride input_row_stride
  void* output_q;            // [num_tokens, hidden_size] of TOut, row stride q_row_stride
  void* output_s;            // fp32 [num_tokens, num_groups]; ue8m0: int32 [num_tokens, ceil(num_groups / 4)]
  int64_t num_tokens;        // rows
  int64_t num_groups;        // hidden_size / group_size, groups per row
  int64_t input_row_stride;  // elements of TIn
  int64_t q_row_stride;      // elements of TOut
  int64_t s_row_stride;      // elements of output_s (fp32, or int32 words for ue8m0)
  int64_t s_group_stride;    // per group (fp32) or per word of 4 groups (ue8m0)
  int32_t group_size;        // power of two, a multiple of the chunk size
  int32_t lanes_per_group;   // min(group_size / kVecN, 32): a power of two
  int32_t vecs_per_lane;     // group_size / (kVecN * lanes_per_group), <= kMaxVecsPerLane
  float eps;                 // floor of the group maximum
  float q_min, q_max;        // clamp bounds
  bool scale_ue8m0;          // power-of-two scales stored as exponent bytes
};

/// Launch facts: kThreads per block; a lane keeps up to kMaxVecsPerLane 16-byte chunks of its group.
struct GroupQuantConfig {
  static constexpr uint32_t kThreads = 256;
  static constexpr int kMaxVecsPerLane = 4;      // group_size <= 32 lanes * 4 chunks * kVecN
  static constexpr int64_t kMaxBlocks = 1 << 20;  // grid cap; warps loop over the remaining groups
};

/// The maximum over each group of `lanes` consecutive lanes (a power of two in [1, 32]).
SGL_DEVICE float group_reduce_max(float value, int32_t lanes) {
  switch (lanes) {
    case 1: return value;
    case 2: return device::warp::reduce_max<float, 2>(value);
    case 4: return device::warp::reduce_max<float, 4>(value);
    case 8: return device::warp::reduce_max<float, 8>(value);
    case 16: return device::warp::reduce_max<float, 16>(value);
    default: return device::warp::reduce_max<float, 32>(value);
  }
}

/// Writes the scale of group `group` of row `row` (one lane per group calls it).
SGL_DEVICE void store_group_scale(const GroupQuantParams& p, int64_t row, int64_t group, float scale) {
  if (!p.scale_ue8m0) {
    static_cast<float*>(p.output_s)[row * p.s_row_stride + group * p.s_group_stride] = scale;
    return;
  }
  // Four exponent bytes per int32 word, group % 4 at byte group % 4 (little-endian); the word's
  // bytes past the last group are written 0 by the last group's lane.
  auto* word = static_cast<uint8_t*>(p.output_s) + 4 * (row * p.s_row_stride + (group / 4) * p.s_group_stride);
  word[group % 4] = device::quant::scale_exponent(scale);
  if (group == p.num_groups - 1) {
    for (int64_t b = group % 4 + 1; b < 4; ++b) word[b] = 0;
  }
}

/// One warp iteration covers 32 / lanes_per_group consecutive groups (of the flattened
/// [num_tokens, num_groups] order); every lane of the warp runs the reduction, lanes of groups past
/// the end with a maximum of 0 and no memory access, so the full-mask shuffles stay legal.
template <typename TIn, typename TOut, bool kAligned>
__global__ void __launch_bounds__(GroupQuantConfig::kThreads)
    per_token_group_quant_8bit_kernel(const GroupQuantParams p) {
  using namespace device::quant;
  constexpr int kVecN = 16 / sizeof(TIn);
  constexpr int kMaxVecs = GroupQuantConfig::kMaxVecsPerLane;
  constexpr int64_t kWarpsPerBlock = GroupQuantConfig::kThreads / device::kWarpThreads;

  const int32_t lane = threadIdx.x % device::kWarpThreads;
  const int32_t lanes = p.lanes_per_group;
  const int32_t lane_in_group = lane % lanes;
  const int64_t groups_per_warp = device::kWarpThreads / lanes;
  const int64_t total_groups = p.num_tokens * p.num_groups;
  const int64_t num_warps = int64_t{gridDim.x} * kWarpsPerBlock;
  const float type_max = kTypeMax<TOut>;

  for (int64_t warp = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / device::kWarpThreads;
       warp * groups_per_warp < total_groups; warp += num_warps) {
    const int64_t flat_group = warp * groups_per_warp + lane / lanes;
    const bool valid = flat_group < total_groups;
    const int64_t row = valid ? flat_group / p.num_groups : 0;
    const int64_t group = flat_group - row * p.num_groups;
    // The group's chunk c of this lane is chunk (c * lanes + lane_in_group) of the group.
    const TIn* src = static_cast<const TIn*>(p.input) + row * p.input_row_stride + group * p.group_size;
    TOut* dst = static_cast<TOut*>(p.output_q) + row * p.q_row_stride + group * p.group_size;

    Chunk<TIn, kVecN, kAligned> x[kMaxVecs];
    float amax = 0.0f;
#pragma unroll
    for (int c = 0; c < kMaxVecs; ++c) {
      if (valid && c < p.vecs_per_lane) {
        x[c].load(src, int64_t{c} * lanes + lane_in_group);
        amax = chunk_absmax(x[c], amax);
      }
    }
    amax = group_reduce_max(amax, lanes);
    if (!valid) continue;

    const float scale = block_scale(amax, p.eps, type_max, p.scale_ue8m0);
    const float inv_scale = __fdiv_rn(1.0f, scale);
#pragma unroll
    for (int c = 0; c < kMaxVecs; ++c) {
      if (c < p.vecs_per_lane) {
        quantize_chunk<TOut>(x[c], inv_scale, p.q_min, p.q_max).store(dst, int64_t{c} * lanes + lane_in_group);
      }
    }
    if (lane_in_group == 0) store_group_scale(p, row, group, scale);
  }
}

template <typename TIn, typename TOut>
void launch_per_token_group_quant_8bit(const GroupQuantParams& params, bool aligned, DLDevice device) {
  using namespace host;
  const int64_t groups_per_block = GroupQuantConfig::kThreads / params.lanes_per_group;
  const int64_t blocks = div_ceil(params.num_tokens * params.num_groups, groups_per_block);
  const auto grid = static_cast<uint32_t>(std::clamp<int64_t>(blocks, 1, GroupQuantConfig::kMaxBlocks));
  const auto kernel = aligned ? per_token_group_quant_8bit_kernel<TIn, TOut, true>
                              : per_token_group_quant_8bit_kernel<TIn, TOut, false>;
  LaunchKernel(grid, GroupQuantConfig::kThreads, device)(kernel, params);
}

/// Quantizes input [num_tokens, hidden_size] (TIn = fp16_t | bf16_t | fp32_t, last dim contiguous,
/// any row stride) into output_q (fp8 e4m3 or int8, same shape, last dim contiguous, any row stride)
/// and output_s: fp32 [num_tokens, hidden_size / group_size], or with scale_ue8m0 int32
/// [num_tokens, ceil(num_groups / 4)]; any strides that do not make two elements share an address.
/// group_size: a power of two in [16, 32 * 4 * (16 / sizeof(TIn))] dividing hidden_size. All tensors
/// on one CUDA device; output_s must not overlap the others. Empty inputs return without a launch.
/// Throws PanicError (Python RuntimeError) naming the tensor on any mismatch.
template <typename TIn>
void per_token_group_quant_8bit(tvm::ffi::TensorView input, tvm::ffi::TensorView output_q,
                                tvm::ffi::TensorView output_s, int64_t group_size, double eps, double q_min,
                                double q_max, bool scale_ue8m0) {
  using namespace host;
  constexpr int64_t kVecN = 16 / sizeof(TIn);
  constexpr int64_t kMaxGroupSize = int64_t{device::kWarpThreads} * GroupQuantConfig::kMaxVecsPerLane * kVecN;

  // Validate
  SymbolicSize num_tokens{"num_tokens"};
  SymbolicSize hidden_size{"hidden_size"};
  SymbolicSize input_row_stride{"input_row_stride"};
  SymbolicSize q_row_stride{"q_row_stride"};
  SymbolicDevice device_;
  device_.set_options<kDLCUDA>();
  TensorMatcher({num_tokens, hidden_size})  //
      .with_strides({input_row_stride, 1})
      .with_dtype<TIn>()
      .with_device<kDLCUDA>(device_)
      .verify(input, "input");
  TensorMatcher({num_tokens, hidden_size})  //
      .with_strides({q_row_stride, 1})
      .with_dtype<fp8_e4m3_t, int8_t>()
      .with_device<kDLCUDA>(device_)
      .verify(output_q, "output_q");
  RuntimeCheck(group_size >= 16 && group_size <= kMaxGroupSize && (group_size & (group_size - 1)) == 0,
               "per_token_group_quant_8bit: group_size must be a power of two in [16, ", kMaxGroupSize, "], got ",
               group_size);
  RuntimeCheck(hidden_size.unwrap() % group_size == 0, "per_token_group_quant_8bit: hidden_size (",
               hidden_size.unwrap(), ") must be a multiple of group_size (", group_size, ")");
  const int64_t num_groups = hidden_size.unwrap() / group_size;
  SymbolicSize scale_cols{"scale_cols"};
  scale_cols.set_value(scale_ue8m0 ? div_ceil(num_groups, int64_t{4}) : num_groups);
  auto scale_matcher = TensorMatcher({num_tokens, scale_cols}).with_strides({kAnySize, kAnySize});
  if (scale_ue8m0) {
    scale_matcher.with_dtype<int32_t>().with_device<kDLCUDA>(device_).verify(output_s, "output_s");
  } else {
    scale_matcher.with_dtype<float>().with_device<kDLCUDA>(device_).verify(output_s, "output_s");
  }
  verify_no_self_overlap(output_q, "output_q");
  verify_no_self_overlap(output_s, "output_s");
  verify_no_partial_overlap(output_q, "output_q", input, "input", /*allow_same=*/false);
  verify_no_partial_overlap(output_s, "output_s", input, "input", /*allow_same=*/false);
  verify_no_partial_overlap(output_s, "output_s", output_q, "output_q", /*allow_same=*/false);
  RuntimeCheck(q_min < q_max, "per_token_group_quant_8bit: fp8_min must be < fp8_max, got ", q_min, " and ", q_max);

  // Unwrap
  const int64_t lanes = std::min<int64_t>(group_size / kVecN, device::kWarpThreads);
  const GroupQuantParams params{
      .input = data_ptr<const void>(input),
      .output_q = data_ptr(output_q),
      .output_s = data_ptr(output_s),
      .num_tokens = num_tokens.unwrap(),
      .num_groups = num_groups,
      .input_row_stride = input_row_stride.unwrap(),
      .q_row_stride = q_row_stride.unwrap(),
      .s_row_stride = output_s.stride(0),
      .s_group_stride = output_s.stride(1),
      .group_size = static_cast<int32_t>(group_size),
      .lanes_per_group = static_cast<int32_t>(lanes),
      .vecs_per_lane = static_cast<int32_t>(group_size / (kVecN * lanes)),
      .eps = static_cast<float>(eps),
      .q_min = static_cast<float>(q_min),
      .q_max = static_cast<float>(q_max),
      .scale_ue8m0 = scale_ue8m0,
  };
  const DLDevice device = device_.unwrap();
  if (params.num_tokens == 0 || num_groups == 0) return;

  // Configure: one 16-byte access per chunk when every row of input and output_q allows it
  const bool aligned = quant::is_aligned(params.input, 16) &&
                       quant::is_aligned(params.input_row_stride * int64_t{sizeof(TIn)}, 16) &&
                       quant::is_aligned(params.output_q, kVecN) && quant::is_aligned(params.q_row_stride, kVecN);

  // Launch
  if (output_q.dtype().code == kDLInt) {
    launch_per_token_group_quant_8bit<TIn, int8_t>(params, aligned, device);
  } else {
    launch_per_token_group_quant_8bit<TIn, fp8_e4m3_t>(params, aligned, device);
  }
}

}  // namespace
