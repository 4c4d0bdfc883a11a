// per_token_group_quant_8bit: each group of group_size consecutive values of a row gets its own
// scale s = max(max|x|, eps) / q_type_max and q = clamp(x / s, q_min, q_max) in fp8 e4m3 or int8
// (arithmetic and roundings: quantize_8bit.cuh).
//
// Memory-bound: reads num_tokens * hidden_size inputs, writes as many bytes plus one scale per group.
// A warp takes a tile of kTileChunks = 32 * kItems consecutive 16-byte chunks of one row: step c of
// lane l is chunk c * 32 + l of the tile, so every step is one coalesced 512-byte access of the warp,
// and all kItems loads of a lane are issued before the first reduction. A tile holds whole groups
// (group_size / kVecN chunks, a power of two <= kTileChunks): a group of at most 32 chunks lies in
// one step (lanes_per_group consecutive lanes, a butterfly over them, kItems reductions interleaved);
// a larger one spans kItems / groups-per-tile steps of every lane (first reduced in the lane, then
// over the warp). The quantized bytes are written from the registers, so the input is read once.
// 64-bit offsets; any row stride of the input and of output_q; the scale is written at
// (row * s_row_stride + group * s_group_stride), so row-major and column-major (TMA-aligned) scale
// buffers are the same code. Launched with PDL (waits for the previous kernel before any access).
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, SymbolicSize, SymbolicDevice, kAnySize, data_ptr
#include <sgl_kernel/utils.h>   // For RuntimeCheck, div_ceil

#include <sgl_kernel/utils.cuh>  // For LaunchKernel, SGL_DEVICE, kWarpThreads, fp8_e4m3_t, pdl_wait_primary

#include <algorithm>
#include <bit>
#include <cstdint>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include "quantize_8bit.cuh"  // For quant::Chunk, block_scale, quantize_chunk, chunk_absmax, is_aligned

namespace {

/// Kernel arguments of per_token_group_quant_8bit. Strides in elements of their own tensor.
struct GroupQuantParams {
  const void* input;          // [num_tokens, hidden_size], row stride input_row_stride
  void* output_q;             // [num_tokens, hidden_size] of TOut, row stride q_row_stride
  void* output_s;             // fp32 [num_tokens, num_groups]; ue8m0: int32 [num_tokens, ceil(num_groups / 4)]
  int64_t num_tokens;         // rows
  int64_t num_groups;         // hidden_size / group_size, groups per row
  int64_t row_chunks;         // hidden_size / kVecN, 16-byte chunks per row
  int64_t tiles_per_row;      // ceil(row_chunks / kTileChunks)
  int64_t input_row_stride;   // elements of TIn
  int64_t q_row_stride;       // elements of TOut
  int64_t s_row_stride;       // elements of output_s (fp32, or int32 words for ue8m0)
  int64_t s_group_stride;     // per group (fp32) or per word of 4 groups (ue8m0)
  int32_t log2_group_chunks;  // log2(group_size / kVecN), at most log2(kTileChunks)
  float eps;                  // floor of the group maximum
  float q_min, q_max;         // clamp bounds
  bool scale_ue8m0;           // power-of-two scales stored as exponent bytes
};

/// Launch facts: kThreads per block (a tile per warp); a lane keeps kItems 16-byte chunks of its tile.
struct GroupQuantConfig {
  static constexpr uint32_t kThreads = 128;
  static constexpr int kItems = 4;                     // 64 bytes of input in flight per lane
  static constexpr int64_t kTileChunks = 32 * kItems;  // group_size <= kTileChunks * kVecN
  static constexpr int64_t kMaxBlocks = 1 << 20;       // grid cap; warps loop over the remaining tiles
};

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

/// One warp iteration quantizes one tile (see the file comment). Chunks past the row end (the last
/// tile of a row) are neither read nor written; their lanes still take part in the full-mask
/// shuffles with a maximum of 0, and, the row being whole groups, never share a group with a real
/// chunk. kClamp false: fp8 with bounds that the satfinite conversion implies (quantize_values).
template <typename TIn, typename TOut, bool kAligned, bool kClamp>
__global__ void __launch_bounds__(GroupQuantConfig::kThreads)
    per_token_group_quant_8bit_kernel(const GroupQuantParams p) {
  using namespace device::quant;
  constexpr int kVecN = 16 / sizeof(TIn);
  constexpr int kItems = GroupQuantConfig::kItems;
  constexpr int64_t kWarpsPerBlock = GroupQuantConfig::kThreads / device::kWarpThreads;

  const int32_t lane = threadIdx.x % device::kWarpThreads;
  const int32_t group_chunks = 1 << p.log2_group_chunks;
  const int32_t lanes_per_group = min(group_chunks, device::kWarpThreads);
  const int64_t num_tiles = p.num_tokens * p.tiles_per_row;
  const int64_t num_warps = int64_t{gridDim.x} * kWarpsPerBlock;
  const float type_max = kTypeMax<TOut>;
  device::pdl_wait_primary();  // the input may be the previous kernel's output
  device::pdl_launch_dependents();

  for (int64_t tile = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / device::kWarpThreads; tile < num_tiles;
       tile += num_warps) {
    const int64_t row = tile / p.tiles_per_row;
    const int64_t first = (tile - row * p.tiles_per_row) * GroupQuantConfig::kTileChunks + lane;
    const TIn* src = static_cast<const TIn*>(p.input) + row * p.input_row_stride;
    TOut* dst = static_cast<TOut*>(p.output_q) + row * p.q_row_stride;

    Chunk<TIn, kVecN, kAligned> x[kItems];
#pragma unroll
    for (int c = 0; c < kItems; ++c) {
      if (first + c * device::kWarpThreads < p.row_chunks) x[c].load(src, first + c * device::kWarpThreads);
    }
    float amax[kItems];
#pragma unroll
    for (int c = 0; c < kItems; ++c) {
      amax[c] = first + c * device::kWarpThreads < p.row_chunks ? chunk_absmax(x[c], 0.0f) : 0.0f;
    }
    // Groups longer than a step: steps c .. c + group_chunks / 32 - 1 of a lane are one group.
    if (group_chunks >= 2 * device::kWarpThreads) {
#pragma unroll
      for (int c = 0; c < kItems; c += 2) amax[c] = amax[c + 1] = fmaxf(amax[c], amax[c + 1]);
    }
    if (group_chunks >= 4 * device::kWarpThreads) {
#pragma unroll
      for (int c = 0; c < kItems; c += 4) {
        amax[c] = amax[c + 1] = amax[c + 2] = amax[c + 3] = fmaxf(amax[c], amax[c + 2]);
      }
    }
    for (int mask = lanes_per_group / 2; mask > 0; mask /= 2) {
#pragma unroll
      for (int c = 0; c < kItems; ++c) amax[c] = fmaxf(amax[c], __shfl_xor_sync(0xffffffffu, amax[c], mask));
    }

#pragma unroll
    for (int c = 0; c < kItems; ++c) {
      const int64_t index = first + c * device::kWarpThreads;
      if (index < p.row_chunks) {
        const float scale = block_scale(amax[c], p.eps, type_max, p.scale_ue8m0);
        const float inv_scale = __fdiv_rn(1.0f, scale);
        quantize_chunk<TOut, kClamp>(x[c], inv_scale, p.q_min, p.q_max).store(dst, index);
        if ((index & (group_chunks - 1)) == 0) store_group_scale(p, row, index >> p.log2_group_chunks, scale);
      }
    }
  }
}

template <typename TIn, typename TOut, bool kClamp>
void launch_per_token_group_quant_8bit(const GroupQuantParams& params, bool aligned, DLDevice device) {
  using namespace host;
  constexpr int64_t kWarpsPerBlock = GroupQuantConfig::kThreads / device::kWarpThreads;
  const int64_t blocks = div_ceil(params.num_tokens * params.tiles_per_row, kWarpsPerBlock);
  const auto grid = static_cast<uint32_t>(std::clamp<int64_t>(blocks, 1, GroupQuantConfig::kMaxBlocks));
  const auto kernel = aligned ? per_token_group_quant_8bit_kernel<TIn, TOut, true, kClamp>
                              : per_token_group_quant_8bit_kernel<TIn, TOut, false, kClamp>;
  LaunchKernel(grid, GroupQuantConfig::kThreads, device).enable_pdl(true)(kernel, params);
}

/// Quantizes input [num_tokens, hidden_size] (TIn = fp16_t | bf16_t | fp32_t, last dim contiguous,
/// any row stride) into output_q (fp8 e4m3 or int8, same shape, last dim contiguous, any row stride)
/// and output_s: fp32 [num_tokens, hidden_size / group_size], or with scale_ue8m0 int32
/// [num_tokens, ceil(num_groups / 4)]; any strides that do not make two elements share an address.
/// group_size: a power of two in [16, 32 * 4 * (16 / sizeof(TIn))] dividing hidden_size. All tensors
/// on one CUDA device; output_s must not overlap the others. Empty inputs return without a launch.
/// Throws PanicError (Python RuntimeError) naming the tensor on any mismatch.
template <typename TIn>
void per_token_group_quant_8bit(
    tvm::ffi::TensorView input,
    tvm::ffi::TensorView output_q,
    tvm::ffi::TensorView output_s,
    int64_t group_size,
    double eps,
    double q_min,
    double q_max,
    bool scale_ue8m0) {
  using namespace host;
  constexpr int64_t kVecN = 16 / sizeof(TIn);
  constexpr int64_t kMaxGroupSize = GroupQuantConfig::kTileChunks * kVecN;

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
  RuntimeCheck(
      group_size >= 16 && group_size <= kMaxGroupSize && (group_size & (group_size - 1)) == 0,
      "per_token_group_quant_8bit: group_size must be a power of two in [16, ",
      kMaxGroupSize,
      "], got ",
      group_size);
  RuntimeCheck(
      !scale_ue8m0 || output_q.dtype().code != kDLInt,
      "per_token_group_quant_8bit: output_q dtype: expected float8_e4m3fn (scale_ue8m0 is for fp8), got int8");
  RuntimeCheck(
      hidden_size.unwrap() % group_size == 0,
      "per_token_group_quant_8bit: hidden_size (",
      hidden_size.unwrap(),
      ") must be a multiple of group_size (",
      group_size,
      ")");
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
  const int64_t row_chunks = hidden_size.unwrap() / kVecN;
  const GroupQuantParams params{
      .input = data_ptr<const void>(input),
      .output_q = data_ptr(output_q),
      .output_s = data_ptr(output_s),
      .num_tokens = num_tokens.unwrap(),
      .num_groups = num_groups,
      .row_chunks = row_chunks,
      .tiles_per_row = div_ceil(row_chunks, GroupQuantConfig::kTileChunks),
      .input_row_stride = input_row_stride.unwrap(),
      .q_row_stride = q_row_stride.unwrap(),
      .s_row_stride = output_s.stride(0),
      .s_group_stride = output_s.stride(1),
      .log2_group_chunks = static_cast<int32_t>(std::countr_zero(static_cast<uint64_t>(group_size / kVecN))),
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

  // Launch: fp8 with bounds at or past +-448 needs no clamp (the conversion saturates the same way)
  constexpr double kFp8Max = device::quant::kTypeMax<fp8_e4m3_t>;
  if (output_q.dtype().code == kDLInt) {
    launch_per_token_group_quant_8bit<TIn, int8_t, true>(params, aligned, device);
  } else if (q_min <= -kFp8Max && q_max >= kFp8Max) {
    launch_per_token_group_quant_8bit<TIn, fp8_e4m3_t, false>(params, aligned, device);
  } else {
    launch_per_token_group_quant_8bit<TIn, fp8_e4m3_t, true>(params, aligned, device);
  }
}

}  // namespace
