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
// That is variant 0; the default launches the 2-D kernel (per_token_group_quant_8bit_tile_kernel:
// 32-bit index arithmetic before the PDL wait, no division, two adjacent chunks per lane so that
// bf16 / fp16 rows store 16 fp8 bytes at once); see dispatch_per_token_group_quant_8bit.
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, SymbolicSize, SymbolicDevice, kAnySize, data_ptr
#include <sgl_kernel/utils.h>   // For RuntimeCheck, div_ceil

#include <sgl_kernel/runtime.cuh>  // For runtime::get_sm_count
#include <sgl_kernel/utils.cuh>    // For LaunchKernel, SGL_DEVICE, kWarpThreads, fp8_e4m3_t, pdl_wait_primary

#include <algorithm>
#include <bit>
#include <cstdint>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <type_traits>

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
  static constexpr uint32_t kTileMaxThreads = 256;     // 2-D kernel: a row's tiles in one block
  static constexpr int64_t kMaxRowBlocks = 65535;      // gridDim.y cap; rows past it are looped over
  static constexpr int64_t kSmallTokens = 256;         // variant 1: Shape<1, 2> up to here
  static constexpr int kChunkMinBlocks = 8;            // chunk kernel: <= 32 registers (9 blocks of 224)
  static constexpr int kChunkMinBlocksFp32 = 6;        // fp32 input: <= 40 (at 32 it spilled its chunk)
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

/// Tile geometry of the 2-D kernel (variants 2..4): a lane keeps kItems steps of kPack adjacent
/// 16-byte chunks (kPack * 16 bytes of input per step, kPack * kVecN output bytes stored at once).
template <int kItems_, int kPack_>
struct TileShape {
  static constexpr int kItems = kItems_;
  static constexpr int kPack = kPack_;
  static constexpr int kStepChunks = device::kWarpThreads * kPack;  // chunks of one step of a warp
  static constexpr int kTileChunks = kStepChunks * kItems;          // chunks of one warp's tile
};

/// The 2-D kernel (variants 2..4): block (32 * warps_x, rows_y) threads; warp (threadIdx.x / 32) of
/// block column blockIdx.x takes tile blockIdx.x * warps_x + warp of row blockIdx.y * rows_y +
/// threadIdx.y (rows past gridDim.y * rows_y looped over). The index arithmetic is 32-bit within a
/// row and runs before the PDL wait; lanes of tiles past the row end exit (no shuffle partner is
/// lost: a warp is one tile). Step c of lane l holds chunks (c * 32 + l) * kPack .. + kPack - 1 of
/// the tile, so each step of a warp is kPack coalesced 16-byte loads and, for kPack * kVecN = 16
/// (bf16 / fp16 with kPack 2), one 16-byte store of fp8 bytes per lane. A group of group_chunks
/// chunks (>= kPack) is group_chunks / kPack consecutive lanes of a step, or, larger than a step,
/// group_chunks / kStepChunks consecutive steps of every lane.
/// Tuning knobs of the tuned 2-D kernel beyond the tile shape (the opt-in variants 8 and 9).
/// - kMinBlocks: __launch_bounds__'s blocks per SM at kTileMaxThreads threads (caps the registers:
///   5 gives <= 48, so 6 blocks of 224 threads fit an SM instead of 4 at 72 registers; 6 (<= 40)
///   spills ~100 bytes).
/// - kPrefetch: a block loops over rows (grid.y a few per SM) and issues the loads of its next row
///   before it quantizes the current one, so a lane keeps up to two tiles of loads in flight and
///   the block's launch and reduction gaps overlap the memory traffic.
/// Both also take the reciprocal as __frcp_rn(s): the IEEE reciprocal, the same value as
/// __fdiv_rn(1, s) without the division's slow-path test.
template <int kMinBlocks_, bool kPrefetch_>
struct TileTuning {
  static constexpr int kMinBlocks = kMinBlocks_;
  static constexpr bool kPrefetch = kPrefetch_;
  static constexpr bool kFastRcp = kMinBlocks_ > 1 || kPrefetch_;
};

/// Loads the tile of lane `first` of a row (chunks past row_chunks are not read).
template <typename Shape, typename InT, typename TIn>
SGL_DEVICE void load_group_tile(
    InT (&x)[Shape::kItems][Shape::kPack], const TIn* src, int32_t first, int32_t row_chunks) {
#pragma unroll
  for (int c = 0; c < Shape::kItems; ++c) {
    const int32_t index = first + c * Shape::kStepChunks;  // whole kPack runs: row_chunks is whole groups
#pragma unroll
    for (int j = 0; j < Shape::kPack; ++j) {
      if (index < row_chunks) x[c][j].load(src, index + j);
    }
  }
}

/// Reduces, quantizes and stores the loaded tile of lane `first` of row `row` (see the kernel).
template <typename TIn, typename TOut, bool kAligned, bool kClamp, bool kFastRcp, typename Shape>
SGL_DEVICE void quantize_group_tile(
    const GroupQuantParams& p,
    const device::quant::Chunk<TIn, 16 / sizeof(TIn), kAligned> (&x)[Shape::kItems][Shape::kPack],
    TOut* dst,
    int64_t row,
    int32_t first,
    int32_t row_chunks,
    int32_t group_chunks,
    int32_t lanes_per_group) {
  using namespace device::quant;
  constexpr int kItems = Shape::kItems;
  constexpr int kPack = Shape::kPack;
  constexpr int kVecN = 16 / sizeof(TIn);
  const float type_max = kTypeMax<TOut>;
  float amax[kItems];
#pragma unroll
  for (int c = 0; c < kItems; ++c) {
    amax[c] = 0.0f;
    if (first + c * Shape::kStepChunks < row_chunks) {
#pragma unroll
      for (int j = 0; j < kPack; ++j) amax[c] = chunk_absmax(x[c][j], amax[c]);
    }
  }
  // Groups longer than a step: steps c .. c + span - 1 of a lane are one group.
#pragma unroll
  for (int span = 2; span <= kItems; span *= 2) {
    if (group_chunks >= span * Shape::kStepChunks) {
#pragma unroll
      for (int c = 0; c < kItems; c += span) {
        const float m = fmaxf(amax[c], amax[c + span / 2]);
#pragma unroll
        for (int i = 0; i < span; ++i) amax[c + i] = m;
      }
    }
  }
  for (int mask = lanes_per_group / 2; mask > 0; mask /= 2) {
#pragma unroll
    for (int c = 0; c < kItems; ++c) amax[c] = fmaxf(amax[c], __shfl_xor_sync(0xffffffffu, amax[c], mask));
  }
#pragma unroll
  for (int c = 0; c < kItems; ++c) {
    const int32_t index = first + c * Shape::kStepChunks;
    if (index < row_chunks) {
      const float scale = block_scale(amax[c], p.eps, type_max, p.scale_ue8m0);
      const float inv_scale = kFastRcp ? __frcp_rn(scale) : __fdiv_rn(1.0f, scale);
      float f[kVecN * kPack];
#pragma unroll
      for (int j = 0; j < kPack; ++j) {
        float part[kVecN];
        chunk_to_float(x[c][j], part);
#pragma unroll
        for (int i = 0; i < kVecN; ++i) f[j * kVecN + i] = part[i];
      }
      // kPack * kVecN output bytes in one store (the launcher checked that output_q allows it)
      quantize_values<TOut, kClamp, kVecN * kPack, kAligned>(f, inv_scale, p.q_min, p.q_max).store(dst, index / kPack);
      if ((index & (group_chunks - 1)) == 0) store_group_scale(p, row, index >> p.log2_group_chunks, scale);
    }
  }
}

/// The 2-D kernel (variants 2..4): block (32 * warps_x, rows_y) threads; warp (threadIdx.x / 32) of
/// block column blockIdx.x takes tile blockIdx.x * warps_x + warp of row blockIdx.y * rows_y +
/// threadIdx.y (rows past gridDim.y * rows_y looped over). The index arithmetic is 32-bit within a
/// row and runs before the PDL wait; lanes of tiles past the row end exit (no shuffle partner is
/// lost: a warp is one tile). Step c of lane l holds chunks (c * 32 + l) * kPack .. + kPack - 1 of
/// the tile, so each step of a warp is kPack coalesced 16-byte loads and, for kPack * kVecN = 16
/// (bf16 / fp16 with kPack 2), one 16-byte store of fp8 bytes per lane. A group of group_chunks
/// chunks (>= kPack) is group_chunks / kPack consecutive lanes of a step, or, larger than a step,
/// group_chunks / kStepChunks consecutive steps of every lane.
template <typename TIn, typename TOut, bool kAligned, bool kClamp, typename Shape>
__global__ void __launch_bounds__(GroupQuantConfig::kTileMaxThreads)
    per_token_group_quant_8bit_tile_kernel(const GroupQuantParams p) {
  using namespace device::quant;
  constexpr int kVecN = 16 / sizeof(TIn);
  constexpr int kItems = Shape::kItems;
  constexpr int kPack = Shape::kPack;
  using in_t = Chunk<TIn, kVecN, kAligned>;

  const int32_t lane = threadIdx.x % device::kWarpThreads;
  const int32_t tile = blockIdx.x * (blockDim.x / device::kWarpThreads) + threadIdx.x / device::kWarpThreads;
  const int32_t row_chunks = static_cast<int32_t>(p.row_chunks);
  const int32_t first = tile * Shape::kTileChunks + lane * kPack;  // chunk of step 0 in the row
  if (tile >= static_cast<int32_t>(p.tiles_per_row)) return;       // whole warps: no shuffle partner lost
  const int32_t group_chunks = 1 << p.log2_group_chunks;
  const int32_t lanes_per_group = min(group_chunks / kPack, device::kWarpThreads);
  const float type_max = kTypeMax<TOut>;
  int64_t row = int64_t{blockIdx.y} * blockDim.y + threadIdx.y;
  const int64_t row_step = int64_t{gridDim.y} * blockDim.y;
  device::pdl_wait_primary();  // the input may be the previous kernel's output
  device::pdl_launch_dependents();

  for (; row < p.num_tokens; row += row_step) {
    const TIn* src = static_cast<const TIn*>(p.input) + row * p.input_row_stride;
    TOut* dst = static_cast<TOut*>(p.output_q) + row * p.q_row_stride;
    in_t x[kItems][kPack];
#pragma unroll
    for (int c = 0; c < kItems; ++c) {
      const int32_t index = first + c * Shape::kStepChunks;  // whole kPack runs: row_chunks is whole groups
#pragma unroll
      for (int j = 0; j < kPack; ++j) {
        if (index < row_chunks) x[c][j].load(src, index + j);
      }
    }
    float amax[kItems];
#pragma unroll
    for (int c = 0; c < kItems; ++c) {
      amax[c] = 0.0f;
      if (first + c * Shape::kStepChunks < row_chunks) {
#pragma unroll
        for (int j = 0; j < kPack; ++j) amax[c] = chunk_absmax(x[c][j], amax[c]);
      }
    }
    // Groups longer than a step: steps c .. c + span - 1 of a lane are one group.
#pragma unroll
    for (int span = 2; span <= kItems; span *= 2) {
      if (group_chunks >= span * Shape::kStepChunks) {
#pragma unroll
        for (int c = 0; c < kItems; c += span) {
          const float m = fmaxf(amax[c], amax[c + span / 2]);
#pragma unroll
          for (int i = 0; i < span; ++i) amax[c + i] = m;
        }
      }
    }
    for (int mask = lanes_per_group / 2; mask > 0; mask /= 2) {
#pragma unroll
      for (int c = 0; c < kItems; ++c) amax[c] = fmaxf(amax[c], __shfl_xor_sync(0xffffffffu, amax[c], mask));
    }
#pragma unroll
    for (int c = 0; c < kItems; ++c) {
      const int32_t index = first + c * Shape::kStepChunks;
      if (index < row_chunks) {
        const float scale = block_scale(amax[c], p.eps, type_max, p.scale_ue8m0);
        const float inv_scale = __fdiv_rn(1.0f, scale);
        float f[kVecN * kPack];
#pragma unroll
        for (int j = 0; j < kPack; ++j) {
          float part[kVecN];
          chunk_to_float(x[c][j], part);
#pragma unroll
          for (int i = 0; i < kVecN; ++i) f[j * kVecN + i] = part[i];
        }
        // kPack * kVecN output bytes in one store (the launcher checked that output_q allows it)
        quantize_values<TOut, kClamp, kVecN * kPack, kAligned>(f, inv_scale, p.q_min, p.q_max)
            .store(dst, index / kPack);
        if ((index & (group_chunks - 1)) == 0) store_group_scale(p, row, index >> p.log2_group_chunks, scale);
      }
    }
  }
}

/// The tuned 2-D kernel (opt-in variants 8, 9): the tile kernel below (same tiles, same arithmetic,
/// same bytes) with a TileTuning; kept apart so that the default kernels' code stays as measured.
/// Fold it into per_token_group_quant_8bit_tile_kernel when a tuning becomes a default. Block (32 * warps_x, rows_y) threads; warp (threadIdx.x / 32) of
/// block column blockIdx.x takes tile blockIdx.x * warps_x + warp of row blockIdx.y * rows_y +
/// threadIdx.y (rows past gridDim.y * rows_y looped over). The index arithmetic is 32-bit within a
/// row and runs before the PDL wait; lanes of tiles past the row end exit (no shuffle partner is
/// lost: a warp is one tile). Step c of lane l holds chunks (c * 32 + l) * kPack .. + kPack - 1 of
/// the tile, so each step of a warp is kPack coalesced 16-byte loads and, for kPack * kVecN = 16
/// (bf16 / fp16 with kPack 2), one 16-byte store of fp8 bytes per lane. A group of group_chunks
/// chunks (>= kPack) is group_chunks / kPack consecutive lanes of a step, or, larger than a step,
/// group_chunks / kStepChunks consecutive steps of every lane. Tuning: see TileTuning.
template <typename TIn, typename TOut, bool kAligned, bool kClamp, typename Shape, typename Tuning>
__global__ void __launch_bounds__(GroupQuantConfig::kTileMaxThreads, Tuning::kMinBlocks)
    per_token_group_quant_8bit_tuned_kernel(const GroupQuantParams p) {
  constexpr int kVecN = 16 / sizeof(TIn);
  using in_t = device::quant::Chunk<TIn, kVecN, kAligned>;

  const int32_t lane = threadIdx.x % device::kWarpThreads;
  const int32_t tile = blockIdx.x * (blockDim.x / device::kWarpThreads) + threadIdx.x / device::kWarpThreads;
  const int32_t row_chunks = static_cast<int32_t>(p.row_chunks);
  const int32_t first = tile * Shape::kTileChunks + lane * Shape::kPack;  // chunk of step 0 in the row
  if (tile >= static_cast<int32_t>(p.tiles_per_row)) return;              // whole warps: no shuffle partner lost
  const int32_t group_chunks = 1 << p.log2_group_chunks;
  const int32_t lanes_per_group = min(group_chunks / Shape::kPack, device::kWarpThreads);
  int64_t row = int64_t{blockIdx.y} * blockDim.y + threadIdx.y;
  const int64_t row_step = int64_t{gridDim.y} * blockDim.y;
  device::pdl_wait_primary();  // the input may be the previous kernel's output
  device::pdl_launch_dependents();

  const auto src_of = [&](int64_t r) { return static_cast<const TIn*>(p.input) + r * p.input_row_stride; };
  const auto dst_of = [&](int64_t r) { return static_cast<TOut*>(p.output_q) + r * p.q_row_stride; };
  if constexpr (Tuning::kPrefetch) {
    if (row >= p.num_tokens) return;
    in_t next[Shape::kItems][Shape::kPack];
    load_group_tile<Shape>(next, src_of(row), first, row_chunks);
    for (; row < p.num_tokens; row += row_step) {
      in_t x[Shape::kItems][Shape::kPack];
#pragma unroll
      for (int c = 0; c < Shape::kItems; ++c) {
#pragma unroll
        for (int j = 0; j < Shape::kPack; ++j) x[c][j] = next[c][j];
      }
      // The next row's loads go out before this row's reduction (its lanes wait on nothing here).
      if (row + row_step < p.num_tokens) load_group_tile<Shape>(next, src_of(row + row_step), first, row_chunks);
      quantize_group_tile<TIn, TOut, kAligned, kClamp, Tuning::kFastRcp, Shape>(
          p, x, dst_of(row), row, first, row_chunks, group_chunks, lanes_per_group);
    }
  } else {
    for (; row < p.num_tokens; row += row_step) {
      in_t x[Shape::kItems][Shape::kPack];
      load_group_tile<Shape>(x, src_of(row), first, row_chunks);
      quantize_group_tile<TIn, TOut, kAligned, kClamp, Tuning::kFastRcp, Shape>(
          p, x, dst_of(row), row, first, row_chunks, group_chunks, lanes_per_group);
    }
  }
}

/// The full-sector kernel (the default above 256 rows; variant 10 at every size): the 2-D kernel's grid and rows with TileShape<kSlots, 1>
/// tiles (kSlots coalesced steps of one chunk per lane), a cheaper group maximum, one scale per lane.
///
/// Why (SASS of the default, bf16 -> fp8 at [T, 7168] g128): variant 3 loads its pair of adjacent
/// chunks as two LDG.E.128 at +0 and +0x10 of one lane address, and lanes are 32 bytes apart, so
/// each warp load touches 32 sectors (1 KiB) and uses half of each: 2x the sector requests and
/// L1 wavefronts per byte, and, the second load arriving while the first's sectors are still in
/// flight, up to 2x the L2 -> SM traffic (the pattern that doubled it in a sibling op). That is
/// the L2-resident case's ceiling (T = 2048: 10.28 us against 8.99 for a 16-lanes-per-group
/// kernel) and costs a few % from DRAM (T = 16384: 95.2 %). Variant 4 (TileShape<4, 1>) has
/// full-sector loads but pays for them elsewhere: 4 butterflies of 4 levels (16 SHFL), 4 scales
/// and 4 reciprocals (8 IEEE divisions) per lane, 80 registers (3 blocks of 224 threads per SM
/// against 4 at v3's 72), and 4 scale stores of 8 bytes per warp and tile.
///
/// Here slot k of lane l is chunk k * 32 + l of the tile: every load is 512 contiguous bytes (16
/// full sectors) and every fp8 store 32 * kVecN contiguous bytes (full sectors; 8 bytes per lane
/// for bf16 / fp16, so output_q needs only `aligned`). The kSlots maxima of a lane belong to
/// kSlots different groups (slot k of lanes l and l ^ m, m < lanes_per_group, is one group), so
/// the butterfly is a reduce-scatter: at each of its first log2(kSlots) levels a lane keeps half
/// of its values (the upper half when its lane bit of the level is set) and receives the partner's
/// copy of that half: 2 + 1 SHFL for kSlots 4 instead of 4 + 4, then 1 SHFL per remaining level
/// (16 lanes per group: 5 SHFL, 4 dependent levels). The lane then holds the whole maximum of one
/// slot, computes that slot's scale and reciprocal once (2 divisions instead of 8), and an
/// all-gather (1 + 2 SHFL) returns the kSlots reciprocals to every lane. The lanes whose bits
/// below the last scatter level are 0 each hold a distinct group of the tile, so one store
/// instruction writes all of the tile's scales (8 fp32 = one 32-byte sector at g128, where v3
/// writes two half sectors). The maximum is exact in any order (fmaxf of |x| with NaN ignored),
/// so the bits are the default's.
/// ptxas (sm_90, bf16 -> fp8 unclamped): 48 registers with 4 slots (v3: 72), so 6 blocks of 224
/// threads per SM instead of 4: up to 86 KB of loads in flight per SM against 57 KB.
/// Prediction, [T, 7168] bf16 g128 on the H200 (v1 today: 1.34 / 10.28 / 88.59 us): T = 64
/// ~1.33 us (latency-bound: launch plus one load round trip; 2 slots, 5 dependent SHFL levels
/// against v2's 3, so no gain expected); T = 2048 one input ~9.3 us (L2-resident: half the sector
/// requests per byte); T = 16384 ~86 us (~98 % of the copy roof).
/// Requires group_chunks >= kSlots (the scatter levels lie inside a group) and <= kSlots * 32
/// (a tile holds whole groups); the dispatcher falls back to the default's choice otherwise.
template <typename TIn, typename TOut, bool kAligned, bool kClamp, int kSlots>
__global__ void __launch_bounds__(GroupQuantConfig::kTileMaxThreads)
    per_token_group_quant_8bit_sector_kernel(const GroupQuantParams p) {
  using namespace device::quant;
  using Shape = TileShape<kSlots, 1>;
  constexpr int kVecN = 16 / sizeof(TIn);
  constexpr int kLevels = std::countr_zero(static_cast<unsigned>(kSlots));  // scatter levels
  static_assert(kSlots == 2 || kSlots == 4, "per_token_group_quant_8bit_sector_kernel: 2 or 4 slots");

  const int32_t lane = threadIdx.x % device::kWarpThreads;
  const int32_t tile = blockIdx.x * (blockDim.x / device::kWarpThreads) + threadIdx.x / device::kWarpThreads;
  const int32_t row_chunks = static_cast<int32_t>(p.row_chunks);
  const int32_t first = tile * Shape::kTileChunks + lane;                   // chunk of slot 0 in the row
  if (tile >= static_cast<int32_t>(p.tiles_per_row)) return;                // whole warps: no shuffle partner lost
  const int32_t group_chunks = 1 << p.log2_group_chunks;                    // kSlots .. kSlots * 32
  const int32_t lanes_per_group = min(group_chunks, device::kWarpThreads);  // >= kSlots
  // Scatter level r exchanges with lane ^ (lanes_per_group >> (r + 1)); `upper` bit r: this lane
  // keeps the upper half at level r. It ends with the maximum of slot `mine`.
  int32_t upper = 0, mine = 0;
#pragma unroll
  for (int r = 0; r < kLevels; ++r) {
    const bool up = (lane & (lanes_per_group >> (r + 1))) != 0;
    upper |= int32_t{up} << r;
    mine += up ? (kSlots >> (r + 1)) : 0;
  }
  const int32_t last_mask = lanes_per_group >> kLevels;  // the first plain butterfly level is last_mask / 2
  // The group of slot `mine` (its first chunk in the row) and whether this lane writes its scale:
  // the lowest such lane of the group, and for a group spanning slots only its first slot.
  const int32_t group_first = tile * Shape::kTileChunks + mine * device::kWarpThreads + (lane & -lanes_per_group);
  const bool writes_scale =
      (lane & (last_mask - 1)) == 0 && (group_first & (group_chunks - 1)) == 0 && group_first < row_chunks;
  const float type_max = kTypeMax<TOut>;
  int64_t row = int64_t{blockIdx.y} * blockDim.y + threadIdx.y;
  const int64_t row_step = int64_t{gridDim.y} * blockDim.y;
  device::pdl_wait_primary();  // the input may be the previous kernel's output
  device::pdl_launch_dependents();

  for (; row < p.num_tokens; row += row_step) {
    const TIn* src = static_cast<const TIn*>(p.input) + row * p.input_row_stride;
    TOut* dst = static_cast<TOut*>(p.output_q) + row * p.q_row_stride;
    Chunk<TIn, kVecN, kAligned> x[kSlots];
#pragma unroll
    for (int k = 0; k < kSlots; ++k) {
      if (first + k * device::kWarpThreads < row_chunks) x[k].load(src, first + k * device::kWarpThreads);
    }
    float v[kSlots];
#pragma unroll
    for (int k = 0; k < kSlots; ++k) {
      v[k] = first + k * device::kWarpThreads < row_chunks ? chunk_absmax(x[k], 0.0f) : 0.0f;
    }
    // Groups longer than a slot: slots k .. k + span - 1 of a lane are one group.
#pragma unroll
    for (int span = 2; span <= kSlots; span *= 2) {
      if (group_chunks >= span * device::kWarpThreads) {
#pragma unroll
        for (int k = 0; k < kSlots; k += span) {
          const float m = fmaxf(v[k], v[k + span / 2]);
#pragma unroll
          for (int i = 0; i < span; ++i) v[k + i] = m;
        }
      }
    }
    // Reduce-scatter: level r halves the values of a lane (n -> n / 2), v[0 .. n / 2) afterwards.
#pragma unroll
    for (int r = 0; r < kLevels; ++r) {
      const int n = kSlots >> r;
      const bool up = (upper >> r) & 1;
#pragma unroll
      for (int i = 0; i < n / 2; ++i) {
        const float keep = up ? v[i + n / 2] : v[i];
        const float send = up ? v[i] : v[i + n / 2];
        v[i] = fmaxf(keep, __shfl_xor_sync(0xffffffffu, send, lanes_per_group >> (r + 1)));
      }
    }
    float amax = v[0];
    for (int mask = last_mask / 2; mask > 0; mask /= 2) {
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, mask));
    }
    const float scale = block_scale(amax, p.eps, type_max, p.scale_ue8m0);
    // All-gather of the reciprocals, the scatter's levels in reverse: inv[0 .. 2n) after level r.
    float inv[kSlots];
    inv[0] = __fdiv_rn(1.0f, scale);
#pragma unroll
    for (int r = kLevels - 1; r >= 0; --r) {
      const int n = kSlots >> (r + 1);
      const bool up = (upper >> r) & 1;
      float other[kSlots / 2];
#pragma unroll
      for (int i = 0; i < n; ++i) other[i] = __shfl_xor_sync(0xffffffffu, inv[i], lanes_per_group >> (r + 1));
#pragma unroll
      for (int i = 0; i < n; ++i) {
        const float own = inv[i];
        inv[i] = up ? other[i] : own;
        inv[i + n] = up ? own : other[i];
      }
    }
#pragma unroll
    for (int k = 0; k < kSlots; ++k) {
      const int32_t index = first + k * device::kWarpThreads;
      if (index < row_chunks) quantize_chunk<TOut, kClamp>(x[k], inv[k], p.q_min, p.q_max).store(dst, index);
    }
    if (writes_scale) store_group_scale(p, row, group_first >> p.log2_group_chunks, scale);
  }
}

/// Largest |f[i]| of kN (a power of two) fp32 values, floored at +0: a balanced tree of fmaxf
/// (depth log2(kN) instead of chunk_absmax's kN dependent steps). fmaxf is exact and ignores NaN,
/// so the value is chunk_absmax(chunk, 0.0f)'s for any input (all-NaN: the floor's +0).
template <int kN>
SGL_DEVICE float tree_absmax(const float (&f)[kN]) {
  float m[kN];
#pragma unroll
  for (int i = 0; i < kN; ++i) m[i] = fabsf(f[i]);
#pragma unroll
  for (int width = kN / 2; width > 0; width /= 2) {
#pragma unroll
    for (int i = 0; i < width; ++i) m[i] = fmaxf(m[i], m[i + width]);
  }
  return fmaxf(m[0], 0.0f);
}

/// The one-chunk-per-lane kernel (opt-in variant 11; design, chain and occupancy:
/// docs/perf_notes.md, "Group quant at 64 and 2048 tokens"). Block (32 * warps_x, rows_y): lane
/// threadIdx.x of block column blockIdx.x holds chunk blockIdx.x * blockDim.x + threadIdx.x of row
/// blockIdx.y * rows_y + threadIdx.y (rows past gridDim.y * rows_y looped over), so a warp load is
/// 512 contiguous bytes (16 full sectors) and its fp8 store 32 * kVecN contiguous bytes. A group is
/// group_chunks (2..32, a power of two) consecutive lanes: the lane's values are reduced as a tree,
/// the group by a butterfly of log2(group_chunks) levels (4 at g128 bf16, unrolled), and every lane
/// computes the scale and the reciprocal (__frcp_rn: the IEEE value of __fdiv_rn(1, s)) itself, so
/// nothing waits on a second exchange; the group's first lane stores the scale. Against the 2-D
/// tiles (v2, the default up to 256 rows) a lane has half the values, no paired half-sector loads,
/// a maximum 4 deep instead of 16, an unrolled butterfly, and 8 SASS instructions between the PDL
/// wait and the load instead of 63. __launch_bounds__ caps the registers at 32: 9 blocks of 224
/// threads (63 warps, one 16-byte load each) per SM (fp32 inputs: 40, 7 blocks). The grid spreads
/// decode-sized calls over the SMs (launch_group_quant_chunks). The bytes are the default's: the
/// same block_scale and quantize_values on the same group maximum (exact in any order).
/// Aligned rows only, groups of at most 32 chunks, rows and strides below 2^31 (the dispatcher
/// checks); lanes past the row end (whole groups: row_chunks is whole groups) read the row's last
/// chunk, take part in the shuffles with a maximum of 0 and write nothing; warps wholly past it
/// exit before the wait.
template <typename TIn, typename TOut, bool kClamp>
__global__ void __launch_bounds__(
    GroupQuantConfig::kTileMaxThreads,
    sizeof(TIn) == 4 ? GroupQuantConfig::kChunkMinBlocksFp32 : GroupQuantConfig::kChunkMinBlocks)
    per_token_group_quant_8bit_chunk_kernel(const GroupQuantParams p) {
  using namespace device::quant;
  constexpr int kVecN = 16 / sizeof(TIn);

  const int32_t index = blockIdx.x * blockDim.x + threadIdx.x;  // chunk of this lane in its row
  const int32_t row_chunks = static_cast<int32_t>(p.row_chunks);
  // Rows and strides are below 2^31 (the dispatcher checks): each offset is one
  // 32 x 32 -> 64-bit multiply-add (IMAD.WIDE.U32), not the three of a 64-bit product.
  const uint32_t num_tokens = static_cast<uint32_t>(p.num_tokens);
  uint32_t row = blockIdx.y * blockDim.y + threadIdx.y;
  const int32_t warp_first = index - static_cast<int32_t>(threadIdx.x % device::kWarpThreads);
  if (warp_first >= row_chunks || row >= num_tokens) return;  // whole warps: no shuffle partner lost
  const uint32_t row_step = gridDim.y * blockDim.y;
  const int32_t group_chunks = 1 << p.log2_group_chunks;  // 2 .. 32 lanes
  const bool in_row = index < row_chunks;
  const bool writes_scale = in_row && (index & (group_chunks - 1)) == 0;
  const uint32_t group = static_cast<uint32_t>(index) >> p.log2_group_chunks;
  const float type_max = kTypeMax<TOut>;
  // Lanes past the row end read the row's last chunk (and ignore it): the load needs no branch.
  const uint32_t read_offset = static_cast<uint32_t>(min(index, row_chunks - 1)) * kVecN;
  const auto src_of = [&](uint32_t r) {
    return static_cast<const TIn*>(p.input) + (uint64_t{r} * static_cast<uint32_t>(p.input_row_stride) + read_offset);
  };
  const auto quantize_row = [&](uint32_t r, const TIn* src) {
    Chunk<TIn, kVecN, true> x;
    x.load(src, 0);  // unconditional (no branch for the address arithmetic to sink into)
    float f[kVecN];
    chunk_to_float(x, f);
    float amax = in_row ? tree_absmax(f) : 0.0f;
    // group_chunks is the same in every lane: the whole warp shuffles or none of it. 16 lanes (g128
    // of 16-bit inputs, g64 of fp32) are unrolled: no test between the dependent levels.
    if (group_chunks == 16) {
#pragma unroll
      for (int mask = 1; mask < 16; mask *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, mask));
    } else {
      for (int mask = 1; mask < group_chunks; mask *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, mask));
    }
    const float scale = block_scale(amax, p.eps, type_max, p.scale_ue8m0);
    if (in_row) {
      TOut* dst = static_cast<TOut*>(p.output_q) +
                  (uint64_t{r} * static_cast<uint32_t>(p.q_row_stride) + static_cast<uint32_t>(index) * kVecN);
      quantize_values<TOut, kClamp, kVecN, true>(f, __frcp_rn(scale), p.q_min, p.q_max).store(dst, 0);
      if (writes_scale) {
        if (p.scale_ue8m0) {
          store_group_scale(p, r, group, scale);
        } else {
          static_cast<float*>(p.output_s)
              [uint64_t{r} * static_cast<uint32_t>(p.s_row_stride) +
               uint64_t{group} * static_cast<uint32_t>(p.s_group_stride)] = scale;
        }
      }
    }
  };
  // The first row outside the loop, its address formed before the wait (a launch with PDL runs this
  // part while the previous kernel finishes); in a loop, the compiler put the loop-invariant
  // scale-address arithmetic and the row's address between the wait and the load.
  const TIn* src = src_of(row);
  device::pdl_wait_primary();  // the input may be the previous kernel's output
  device::pdl_launch_dependents();
  quantize_row(row, src);
  for (row += row_step; row < num_tokens; row += row_step) quantize_row(row, src_of(row));
}

/// The chunk kernel's grid: a row's ceil(row_chunks / 32) warps in blocks of at most 8 warps
/// (warps_x balanced over the blocks of a row: 7 at hidden 7168 bf16), rows of fewer warps packed
/// rows_y to a block. A grid of fewer blocks than SMs (decode) takes narrower blocks of one row,
/// so that a call's loads come from more SMs (one token at hidden 7168 bf16: 28 one-warp blocks).
template <typename TIn, typename TOut, bool kClamp>
void launch_group_quant_chunks(const GroupQuantParams& params, DLDevice device) {
  using namespace host;
  const int64_t max_warps = GroupQuantConfig::kTileMaxThreads / device::kWarpThreads;
  const int64_t row_warps = div_ceil(params.row_chunks, int64_t{device::kWarpThreads});
  int64_t warps_x = std::min(row_warps, max_warps);
  int64_t rows_y = std::max<int64_t>(1, max_warps / warps_x);
  const int64_t sms = runtime::get_sm_count(device.device_id);
  if (div_ceil(row_warps, warps_x) * div_ceil(params.num_tokens, rows_y) < sms) {
    warps_x = std::clamp<int64_t>(row_warps * params.num_tokens / sms, 1, warps_x);
    rows_y = 1;
  }
  warps_x = div_ceil(row_warps, div_ceil(row_warps, warps_x));  // the same warps in every block of a row
  const dim3 block(static_cast<uint32_t>(warps_x * device::kWarpThreads), static_cast<uint32_t>(rows_y));
  const int64_t grid_x = div_ceil(row_warps, warps_x);
  const int64_t grid_y = std::min(div_ceil(params.num_tokens, rows_y), GroupQuantConfig::kMaxRowBlocks);
  const dim3 grid(static_cast<uint32_t>(grid_x), static_cast<uint32_t>(grid_y));
  const auto kernel = per_token_group_quant_8bit_chunk_kernel<TIn, TOut, kClamp>;
  LaunchKernel(grid, block, device).enable_pdl(true)(kernel, params);
}

/// The full-sector kernel with kSlots slots: the grid of launch_group_quant_tiles for TileShape<kSlots,
/// 1> (the same tiles per row, warps_x and rows_y). Aligned rows only (the dispatcher checks).
template <typename TIn, typename TOut, bool kClamp, int kSlots>
void launch_group_quant_sectors(GroupQuantParams params, DLDevice device) {
  using namespace host;
  using Shape = TileShape<kSlots, 1>;
  params.tiles_per_row = div_ceil(params.row_chunks, int64_t{Shape::kTileChunks});
  const int64_t max_warps = GroupQuantConfig::kTileMaxThreads / device::kWarpThreads;
  const int64_t warps_x = params.tiles_per_row <= max_warps ? params.tiles_per_row : 4;
  const int64_t rows_y = std::max<int64_t>(1, 4 / warps_x);
  const dim3 block(static_cast<uint32_t>(warps_x * device::kWarpThreads), static_cast<uint32_t>(rows_y));
  const int64_t grid_x = div_ceil(params.tiles_per_row, warps_x);
  const int64_t grid_y = std::min(div_ceil(params.num_tokens, rows_y), GroupQuantConfig::kMaxRowBlocks);
  const dim3 grid(static_cast<uint32_t>(grid_x), static_cast<uint32_t>(grid_y));
  const auto kernel = per_token_group_quant_8bit_sector_kernel<TIn, TOut, true, kClamp, kSlots>;
  LaunchKernel(grid, block, device).enable_pdl(true)(kernel, params);
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

/// The 2-D kernel with tile Shape: a block holds warps_x tiles of each of rows_y rows (all of a
/// row's tiles when there are at most 8, so no warp idles), grid (row tiles / warps_x, rows / rows_y).
/// Tuning (void: the tile kernel; else the tuned kernel): with kPrefetch, grid.y at most
/// Tuning::kMinBlocks blocks per SM (over the grid's columns), each looping over its rows. A tuned kernel is instantiated for aligned access only (the callers
/// reach it only with pair_aligned, which implies aligned).
template <typename TIn, typename TOut, bool kClamp, typename Shape, typename Tuning = void>
void launch_group_quant_tiles(GroupQuantParams params, bool aligned, DLDevice device) {
  using namespace host;
  params.tiles_per_row = div_ceil(params.row_chunks, int64_t{Shape::kTileChunks});
  const int64_t max_warps = GroupQuantConfig::kTileMaxThreads / device::kWarpThreads;
  const int64_t warps_x = params.tiles_per_row <= max_warps ? params.tiles_per_row : 4;
  const int64_t rows_y = std::max<int64_t>(1, 4 / warps_x);
  const dim3 block(static_cast<uint32_t>(warps_x * device::kWarpThreads), static_cast<uint32_t>(rows_y));
  const int64_t grid_x = div_ceil(params.tiles_per_row, warps_x);
  int64_t grid_y = std::min(div_ceil(params.num_tokens, rows_y), GroupQuantConfig::kMaxRowBlocks);
  if constexpr (!std::is_void_v<Tuning>) {
    if constexpr (Tuning::kPrefetch) {
      const int64_t resident = int64_t{runtime::get_sm_count(device.device_id)} * Tuning::kMinBlocks;
      grid_y = std::min(grid_y, std::max<int64_t>(1, resident / grid_x));
    }
  }
  const dim3 grid(static_cast<uint32_t>(grid_x), static_cast<uint32_t>(grid_y));
  if constexpr (std::is_void_v<Tuning>) {
    const auto kernel = aligned ? per_token_group_quant_8bit_tile_kernel<TIn, TOut, true, kClamp, Shape>
                                : per_token_group_quant_8bit_tile_kernel<TIn, TOut, false, kClamp, Shape>;
    LaunchKernel(grid, block, device).enable_pdl(true)(kernel, params);
  } else {
    RuntimeCheck(aligned, "per_token_group_quant_8bit: a tuned tile kernel needs aligned rows");
    const auto kernel = per_token_group_quant_8bit_tuned_kernel<TIn, TOut, true, kClamp, Shape, Tuning>;
    LaunchKernel(grid, block, device).enable_pdl(true)(kernel, params);
  }
}

/// Kernel variants (the `variant` argument; 1 is the default, the others are kept for A/B runs):
/// 0 the 1-D kernel (64-bit tile division, kItems = 4, 8-byte fp8 stores); 1 = 2 up to kSmallTokens
/// rows, else the full-sector kernel (below; 3 where it cannot hold the group or rows are unaligned); 2 the 2-D kernel with tiles of 1 step x 2 chunks per lane; 3 of 2 steps x 2
/// chunks; 4 of 4 steps x 1 chunk. A 2-D shape whose tile is shorter than a group, whose pair of
/// chunks is longer than a group, or whose paired output stores output_q does not align, takes
/// Shape<4, 1>; rows of 2^30 chunks or more take variant 0 (its offsets are 64-bit).
/// Opt-in (A/B rows; 5..7 are refused): 8 is 3 with TileTuning<5, false> (registers capped at 48:
/// 6 blocks of 224 threads per SM at hidden 7168 instead of 4); 9 is 3 with TileTuning<3, true>
/// (rows looped over by 3 blocks per SM, <= 80 registers, the next row's loads issued before the
/// current row is reduced: up to 6 rows of loads in flight per SM). Where 3 would fall back to Shape<4, 1>, 8 and 9 take that same untuned fallback.
/// 10 is 1 with the full-sector kernel (per_token_group_quant_8bit_sector_kernel: coalesced 512-byte
/// loads, a reduce-scatter group maximum, one scale per lane) at every size; unaligned rows and groups
/// it cannot hold take the 2-D tiles. 11 is the one-chunk-per-lane kernel
/// (per_token_group_quant_8bit_chunk_kernel: 16 lanes per g128 bf16 group, one 16-byte load each,
/// <= 32 registers) at every size, for decode and L2-resident sizes; unaligned rows, groups longer
/// than 32 chunks and rows or strides of 2^31 or more take the default's choice. The default, 1,
/// takes the full-sector kernel above
/// kSmallTokens rows (4 slots), and variant 2 up to there; variant 3 is the default above kSmallTokens
/// before that.
template <typename TIn, typename TOut, bool kClamp>
void dispatch_per_token_group_quant_8bit(
    const GroupQuantParams& params, bool aligned, bool pair_aligned, int64_t variant, DLDevice device) {
  using Small = TileShape<1, 2>;
  using Large = TileShape<2, 2>;
  using Single = TileShape<4, 1>;
  const int64_t group_chunks = int64_t{1} << params.log2_group_chunks;
  if (variant == 0 || params.row_chunks >= (int64_t{1} << 30)) {
    launch_per_token_group_quant_8bit<TIn, TOut, kClamp>(params, aligned, device);
    return;
  }
  if (variant == 11) {
    // The chunk kernel where it holds (aligned rows, a group within a warp's 32 chunks, rows and
    // strides below 2^31), else the default's choice
    const auto below_2_31 = [](int64_t v) { return v >= 0 && v < (int64_t{1} << 31); };
    const bool offsets_32 = below_2_31(params.num_tokens) && below_2_31(params.input_row_stride) &&
                            below_2_31(params.q_row_stride) && below_2_31(params.s_row_stride) &&
                            below_2_31(params.s_group_stride);
    if (aligned && group_chunks <= device::kWarpThreads && offsets_32) {
      launch_group_quant_chunks<TIn, TOut, kClamp>(params, device);
      return;
    }
    variant = 1;
  }
  const bool small = params.num_tokens <= GroupQuantConfig::kSmallTokens;
  if (variant == 10 || (variant == 1 && !small)) {
    // Full-sector tiles: 2 slots (v2's 64-chunk tiles) up to kSmallTokens rows (variant 10 only),
    // else 4 (v3's 128-chunk tiles; the default's choice there since probe_targets on the H200,
    // 2026-12-01, fifth session: [2048, 7168] g128 bf16 12.17 / 9.52 us cold / one input against
    // 12.54 / 10.15 for v3, [16384, 7168] 84.38 us, 99.4 % of copy, against 87.93; at 1 token the
    // 2-slot tiles lost, 1.08 against v2's 0.95). A group they cannot hold, or unaligned rows, take
    // v1's 2-D tiles.
    const int64_t slots = small ? 2 : 4;
    if (aligned && group_chunks >= slots && group_chunks <= slots * device::kWarpThreads) {
      if (small) {
        launch_group_quant_sectors<TIn, TOut, kClamp, 2>(params, device);
      } else {
        launch_group_quant_sectors<TIn, TOut, kClamp, 4>(params, device);
      }
      return;
    }
    variant = 1;
  }
  if (variant == 1) variant = small ? 2 : 3;
  const bool pairs_ok = pair_aligned && group_chunks >= 2;
  const bool large_ok = pairs_ok && group_chunks <= Large::kTileChunks;
  if (variant == 2 && pairs_ok && group_chunks <= Small::kTileChunks) {
    launch_group_quant_tiles<TIn, TOut, kClamp, Small>(params, aligned, device);
  } else if (variant == 3 && large_ok) {
    launch_group_quant_tiles<TIn, TOut, kClamp, Large>(params, aligned, device);
  } else if (variant == 8 && large_ok) {
    launch_group_quant_tiles<TIn, TOut, kClamp, Large, TileTuning<5, false>>(params, aligned, device);
  } else if (variant == 9 && large_ok) {
    launch_group_quant_tiles<TIn, TOut, kClamp, Large, TileTuning<3, true>>(params, aligned, device);
  } else {
    launch_group_quant_tiles<TIn, TOut, kClamp, Single>(params, aligned, device);
  }
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
    bool scale_ue8m0,
    int64_t variant) {
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
  RuntimeCheck(
      (variant >= 0 && variant <= 4) || (variant >= 8 && variant <= 11),
      "per_token_group_quant_8bit: variant must be in [0, 4] or [8, 11], got ",
      variant);

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
  // Two chunks' output bytes (2 * kVecN) in one store: output_q and its row stride aligned to them
  const bool pair_aligned =
      aligned && quant::is_aligned(params.output_q, 2 * kVecN) && quant::is_aligned(params.q_row_stride, 2 * kVecN);

  // Launch: fp8 with bounds at or past +-448 needs no clamp (the conversion saturates the same way)
  constexpr double kFp8Max = device::quant::kTypeMax<fp8_e4m3_t>;
  if (output_q.dtype().code == kDLInt) {
    dispatch_per_token_group_quant_8bit<TIn, int8_t, true>(params, aligned, pair_aligned, variant, device);
  } else if (q_min <= -kFp8Max && q_max >= kFp8Max) {
    dispatch_per_token_group_quant_8bit<TIn, fp8_e4m3_t, false>(params, aligned, pair_aligned, variant, device);
  } else {
    dispatch_per_token_group_quant_8bit<TIn, fp8_e4m3_t, true>(params, aligned, pair_aligned, variant, device);
  }
}

}  // namespace
