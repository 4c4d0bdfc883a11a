// per_token_group_quant_8bit: each group of group_size consecutive values of a row gets its own
// scale s = clamp(max(max|x|, eps) / q_type_max, FLT_MIN, FLT_MAX) and q = clamp(x * (1 / s), q_min,
// q_max) in fp8 e4m3 or int8
// (arithmetic and roundings: quantize_8bit.cuh).
//
// Memory-bound: reads num_tokens * hidden_size inputs, writes as many bytes plus one scale per group.
// Every kernel reads its input once into registers, reduces each group's maximum with warp
// shuffles, and writes the quantized bytes from the registers. dispatch_per_token_group_quant_8bit
// picks one by size and alignment:
//   - up to kSmallTokens rows: the 2-D tile kernel with one step of two adjacent chunks per lane
//     (bf16 / fp16 rows store 16 fp8 bytes at once);
//   - above: the full-sector kernel (every warp load 512 contiguous bytes, a reduce-scatter group
//     maximum, one scale per lane), or the 2-D tile kernel with two steps of two chunks where the
//     sector kernel cannot hold the group;
//   - unaligned rows, or groups no paired tile holds: the 2-D tile kernel with four steps of one
//     chunk (element-wise accesses when unaligned);
//   - rows of 2^30 chunks or more: the 1-D kernel (64-bit tile offsets).
// Any row stride of the input and of output_q; the scale is written at
// (row * s_row_stride + group * s_group_stride), so row-major and column-major (TMA-aligned) scale
// buffers are the same code. Launched with PDL (each kernel waits for the previous one before any
// access).
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, SymbolicSize, SymbolicDevice, kAnySize, data_ptr
#include <sgl_kernel/utils.h>   // For RuntimeCheck, div_ceil

#include <sgl_kernel/utils.cuh>  // For LaunchKernel, SGL_DEVICE, kWarpThreads, fp8_e4m3_t, pdl_wait_primary

#include <algorithm>
#include <bit>
#include <cstdint>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <type_traits>

#include "quantize_8bit.cuh"  // For quant::Chunk, block_scale, quantize_chunk, chunk_absmax, is_aligned, store_row_group_scale

namespace {

/// Kernel arguments of per_token_group_quant_8bit. Strides in elements of their own tensor.
struct GroupQuantParams {
  const void* input;          // [num_tokens, hidden_size], row stride input_row_stride
  void* output_q;             // [num_tokens, hidden_size] of TOut, row stride q_row_stride
  void* output_s;             // fp32 [num_tokens, num_groups]; ue8m0: int32 [num_tokens, ceil(num_groups / 4)]
  int64_t num_tokens;         // rows
  int64_t num_groups;         // hidden_size / group_size, groups per row
  int64_t row_chunks;         // hidden_size / kVecN, 16-byte chunks per row
  int64_t tiles_per_row;      // ceil(row_chunks / the launch's chunks per tile)
  int64_t input_row_stride;   // elements of TIn
  int64_t q_row_stride;       // elements of TOut
  int64_t s_row_stride;       // elements of output_s (fp32, or int32 words for ue8m0)
  int64_t s_group_stride;     // per group (fp32) or per word of 4 groups (ue8m0)
  int32_t log2_group_chunks;  // log2(group_size / kVecN), at most log2(kTileChunks)
  float eps;                  // floor of the group maximum
  float q_min, q_max;         // clamp bounds
  bool scale_ue8m0;           // power-of-two scales stored as exponent bytes
};

/// Launch facts. The 1-D kernel: kThreads per block, a tile of kTileChunks chunks per warp. The 2-D
/// and sector kernels: up to kTileMaxThreads per block, gridDim.y at most kMaxRowBlocks.
struct GroupQuantConfig {
  static constexpr uint32_t kThreads = 128;
  static constexpr int kItems = 4;                     // 64 bytes of input in flight per lane
  static constexpr int64_t kTileChunks = 32 * kItems;  // group_size <= kTileChunks * kVecN
  static constexpr int64_t kMaxBlocks = 1 << 20;       // grid cap; warps loop over the remaining tiles
  static constexpr uint32_t kTileMaxThreads = 256;     // 2-D kernel: a row's tiles in one block
  static constexpr int64_t kMaxRowBlocks = 65535;      // gridDim.y cap; rows past it are looped over
  static constexpr int64_t kSmallTokens = 256;         // up to here the 2-D tiles of one paired step
  static constexpr int kSectorSlots = 4;               // the sector kernel's chunks per lane
};

/// Writes the scale of group `group` of row `row` (one lane per group calls it). Scale rows are
/// s_row_stride 4-byte elements apart in both layouts (fp32 scales, or int32 words of ue8m0 bytes).
SGL_DEVICE void store_group_scale(const GroupQuantParams& p, int64_t row, int64_t group, float scale) {
  device::quant::store_row_group_scale(
      static_cast<float*>(p.output_s) + row * p.s_row_stride,
      group,
      scale,
      p.s_group_stride,
      p.num_groups,
      p.scale_ue8m0);
}

/// The 1-D kernel, for rows of 2^30 chunks or more (its tile offsets are 64-bit). A warp takes a
/// tile of kTileChunks = 32 * kItems consecutive 16-byte chunks of one row: step c of lane l is chunk
/// c * 32 + l of the tile, so every step is one coalesced 512-byte access of the warp, and all kItems
/// loads of a lane are issued before the first reduction. A tile holds whole groups (group_size /
/// kVecN chunks, a power of two <= kTileChunks): a group of at most 32 chunks lies in one step
/// (lanes_per_group consecutive lanes, a butterfly over them, kItems reductions interleaved); a
/// larger one spans kItems / groups-per-tile steps of every lane (first reduced in the lane, then
/// over the warp). Chunks past the row end (the last tile of a row) are neither read nor written;
/// their lanes still take part in the full-mask shuffles with a maximum of 0, and, the row being
/// whole groups, never share a group with a real chunk. kClamp false: fp8 with bounds that the
/// satfinite conversion implies (quantize_values).
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

/// Tile geometry of the 2-D kernel: a lane keeps kItems steps of kPack adjacent 16-byte chunks
/// (kPack * 16 bytes of input per step, kPack * kVecN output bytes stored at once).
template <int kItems_, int kPack_>
struct TileShape {
  static constexpr int kItems = kItems_;
  static constexpr int kPack = kPack_;
  static constexpr int kStepChunks = device::kWarpThreads * kPack;  // chunks of one step of a warp
  static constexpr int kTileChunks = kStepChunks * kItems;          // chunks of one warp's tile
};

/// The 2-D kernel: block (32 * warps_x, rows_y) threads; warp (threadIdx.x / 32) of block column
/// blockIdx.x takes tile blockIdx.x * warps_x + warp of row blockIdx.y * rows_y + threadIdx.y (rows
/// past gridDim.y * rows_y looped over). The index arithmetic is 32-bit within a row and runs before
/// the PDL wait; lanes of tiles past the row end exit (no shuffle partner is lost: a warp is one
/// tile). Step c of lane l holds chunks (c * 32 + l) * kPack .. + kPack - 1 of the tile, so each step
/// of a warp is kPack coalesced 16-byte loads and, for kPack * kVecN = 16 (bf16 / fp16 with kPack 2),
/// one 16-byte store of fp8 bytes per lane. A group of group_chunks chunks (>= kPack) is
/// group_chunks / kPack consecutive lanes of a step, or, larger than a step, group_chunks /
/// kStepChunks consecutive steps of every lane.
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

/// The full-sector kernel (the default above kSmallTokens rows): the 2-D kernel's grid and rows with
/// TileShape<kSlots, 1> tiles (kSlots coalesced steps of one chunk per lane), a cheaper group maximum,
/// one scale per lane.
///
/// Why: the paired tiles load a lane's two adjacent chunks as two 16-byte loads of one lane address,
/// lanes 32 bytes apart, so each warp load touches twice the sectors it uses (twice the sector
/// requests and L1 wavefronts per byte, and up to twice the L2 -> SM traffic). Four steps of one
/// chunk per lane (TileShape<4, 1>) have full-sector loads but pay four butterflies, four scales,
/// four reciprocals per lane and more registers (docs/perf_notes.md, per_token_group_quant_8bit).
///
/// Here slot k of lane l is chunk k * 32 + l of the tile: every load is 512 contiguous bytes (16
/// full sectors) and every fp8 store 32 * kVecN contiguous bytes (full sectors; 8 bytes per lane
/// for bf16 / fp16, so output_q needs only `aligned`). The kSlots maxima of a lane belong to
/// kSlots different groups (slot k of lanes l and l ^ m, m < lanes_per_group, is one group), so
/// the butterfly is a reduce-scatter: at each of its first log2(kSlots) levels a lane keeps half
/// of its values (the upper half when its lane bit of the level is set) and receives the partner's
/// copy of that half: 2 + 1 SHFL for kSlots 4 instead of 4 + 4, then 1 SHFL per remaining level.
/// The lane then holds the whole maximum of one slot, computes that slot's scale and reciprocal
/// once (2 divisions instead of 8), and an all-gather (1 + 2 SHFL) returns the kSlots reciprocals
/// to every lane. The lanes whose bits below the last scatter level are 0 each hold a distinct group
/// of the tile, so one store instruction writes all of the tile's scales. The maximum is exact in
/// any order (fmaxf of |x| with NaN ignored), so the bits are the paired tiles'.
/// Requires group_chunks >= kSlots (the scatter levels lie inside a group) and <= kSlots * 32
/// (a tile holds whole groups); the dispatcher takes the 2-D tiles otherwise.
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

/// A grid of the 2-D or sector kernel for tiles of kTileChunks chunks: a block holds warps_x tiles of
/// each of rows_y rows (all of a row's tiles when there are at most 8, so no warp idles), grid (row
/// tiles / warps_x, rows / rows_y). Sets params.tiles_per_row.
struct TileGrid {
  dim3 grid, block;
};

inline TileGrid tile_grid(GroupQuantParams& params, int64_t tile_chunks) {
  using namespace host;
  params.tiles_per_row = div_ceil(params.row_chunks, tile_chunks);
  const int64_t max_warps = GroupQuantConfig::kTileMaxThreads / device::kWarpThreads;
  const int64_t warps_x = params.tiles_per_row <= max_warps ? params.tiles_per_row : 4;
  const int64_t rows_y = std::max<int64_t>(1, 4 / warps_x);
  const int64_t grid_x = div_ceil(params.tiles_per_row, warps_x);
  const int64_t grid_y = std::min(div_ceil(params.num_tokens, rows_y), GroupQuantConfig::kMaxRowBlocks);
  return {
      dim3(static_cast<uint32_t>(grid_x), static_cast<uint32_t>(grid_y)),
      dim3(static_cast<uint32_t>(warps_x * device::kWarpThreads), static_cast<uint32_t>(rows_y))};
}

/// The 2-D kernel with tile Shape (kAligned: 16-byte accesses).
template <typename TIn, typename TOut, bool kClamp, typename Shape, bool kAligned>
void launch_group_quant_tiles(GroupQuantParams params, DLDevice device) {
  const TileGrid g = tile_grid(params, Shape::kTileChunks);
  const auto kernel = per_token_group_quant_8bit_tile_kernel<TIn, TOut, kAligned, kClamp, Shape>;
  host::LaunchKernel(g.grid, g.block, device).enable_pdl(true)(kernel, params);
}

/// The full-sector kernel (aligned rows only: the dispatcher checks).
template <typename TIn, typename TOut, bool kClamp>
void launch_group_quant_sectors(GroupQuantParams params, DLDevice device) {
  constexpr int kSlots = GroupQuantConfig::kSectorSlots;
  const TileGrid g = tile_grid(params, TileShape<kSlots, 1>::kTileChunks);
  const auto kernel = per_token_group_quant_8bit_sector_kernel<TIn, TOut, true, kClamp, kSlots>;
  host::LaunchKernel(g.grid, g.block, device).enable_pdl(true)(kernel, params);
}

/// The 1-D kernel over every tile of the input (params.tiles_per_row of kTileChunks chunks).
template <typename TIn, typename TOut, bool kClamp>
void launch_group_quant_rows(const GroupQuantParams& params, bool aligned, DLDevice device) {
  using namespace host;
  constexpr int64_t kWarpsPerBlock = GroupQuantConfig::kThreads / device::kWarpThreads;
  const int64_t blocks = div_ceil(params.num_tokens * params.tiles_per_row, kWarpsPerBlock);
  const auto grid = static_cast<uint32_t>(std::clamp<int64_t>(blocks, 1, GroupQuantConfig::kMaxBlocks));
  const auto kernel = aligned ? per_token_group_quant_8bit_kernel<TIn, TOut, true, kClamp>
                              : per_token_group_quant_8bit_kernel<TIn, TOut, false, kClamp>;
  LaunchKernel(grid, GroupQuantConfig::kThreads, device).enable_pdl(true)(kernel, params);
}

/// The kernel for a size and alignment (see the file comment). `aligned`: 16-byte accesses to every
/// row of input and output_q; `pair_aligned`: also two chunks' output bytes in one store. A paired
/// tile needs group_chunks >= 2 (a pair inside a group) and a tile at least a group long; the sector
/// kernel needs kSectorSlots <= group_chunks <= kSectorSlots * 32. Every path gives the same bits.
template <typename TIn, typename TOut, bool kClamp>
void dispatch_per_token_group_quant_8bit(
    const GroupQuantParams& params, bool aligned, bool pair_aligned, DLDevice device) {
  using Small = TileShape<1, 2>;
  using Large = TileShape<2, 2>;
  using Single = TileShape<4, 1>;
  constexpr int64_t kSlots = GroupQuantConfig::kSectorSlots;
  const int64_t group_chunks = int64_t{1} << params.log2_group_chunks;
  const bool pairs_ok = pair_aligned && group_chunks >= 2;
  const auto single = [&] {
    if (aligned) {
      launch_group_quant_tiles<TIn, TOut, kClamp, Single, true>(params, device);
    } else {
      launch_group_quant_tiles<TIn, TOut, kClamp, Single, false>(params, device);
    }
  };
  if (params.row_chunks >= (int64_t{1} << 30)) {  // past the 2-D kernels' 32-bit offsets within a row
    launch_group_quant_rows<TIn, TOut, kClamp>(params, aligned, device);
  } else if (params.num_tokens > GroupQuantConfig::kSmallTokens) {
    if (aligned && group_chunks >= kSlots && group_chunks <= kSlots * device::kWarpThreads) {
      launch_group_quant_sectors<TIn, TOut, kClamp>(params, device);
    } else if (pairs_ok && group_chunks <= Large::kTileChunks) {
      launch_group_quant_tiles<TIn, TOut, kClamp, Large, true>(params, device);
    } else {
      single();
    }
  } else if (pairs_ok && group_chunks <= Small::kTileChunks) {
    launch_group_quant_tiles<TIn, TOut, kClamp, Small, true>(params, device);
  } else {
    single();
  }
}

/// The size checks of a group quantizer's launcher (this op's and per_token_group_quant.cuh's):
/// group_size a power of two in [16, max_group_size], scale_ue8m0 only for fp8 output (not
/// int8_out), hidden_size a multiple of group_size. Returns the groups per row; throws PanicError
/// (Python RuntimeError) starting with `op`.
inline int64_t check_group_quant_sizes(
    const char* op, int64_t group_size, int64_t max_group_size, bool int8_out, bool scale_ue8m0, int64_t hidden_size) {
  using host::RuntimeCheck;
  RuntimeCheck(
      group_size >= 16 && group_size <= max_group_size && (group_size & (group_size - 1)) == 0,
      op,
      ": group_size must be a power of two in [16, ",
      max_group_size,
      "], got ",
      group_size);
  RuntimeCheck(
      !(int8_out && scale_ue8m0), op, ": output_q dtype: expected float8_e4m3fn (scale_ue8m0 is for fp8), got int8");
  RuntimeCheck(
      hidden_size % group_size == 0,
      op,
      ": hidden_size (",
      hidden_size,
      ") must be a multiple of group_size (",
      group_size,
      ")");
  return hidden_size / group_size;
}

/// output_q and output_s: each element at an address of its own, disjoint from input and from each
/// other (PanicError naming the tensors otherwise).
inline void verify_group_quant_outputs_disjoint(
    const tvm::ffi::TensorView& input, const tvm::ffi::TensorView& output_q, const tvm::ffi::TensorView& output_s) {
  using namespace host;
  verify_no_self_overlap(output_q, "output_q");
  verify_no_self_overlap(output_s, "output_s");
  verify_no_partial_overlap(output_q, "output_q", input, "input", /*allow_same=*/false);
  verify_no_partial_overlap(output_s, "output_s", input, "input", /*allow_same=*/false);
  verify_no_partial_overlap(output_s, "output_s", output_q, "output_q", /*allow_same=*/false);
}

/// Quantizes input [num_tokens, hidden_size] (TIn = fp16_t | bf16_t | fp32_t, last dim contiguous,
/// any row stride) into output_q (TOut = fp8_e4m3_t | int8_t, same shape, last dim contiguous, any
/// row stride)
/// and output_s: fp32 [num_tokens, hidden_size / group_size], or with scale_ue8m0 int32
/// [num_tokens, ceil(num_groups / 4)]; any strides that do not make two elements share an address.
/// group_size: a power of two in [16, 32 * 4 * (16 / sizeof(TIn))] dividing hidden_size. All tensors
/// on one CUDA device; output_s must not overlap the others. Empty inputs return without a launch.
/// kClamp: the build that clamps to [q_min, q_max]. int8 output always clamps; fp8 output clamps
/// only for bounds inside +-448 (wider ones are the satfinite conversion's own), so the caller
/// loads the build its bounds need and the first call compiles one set of kernels.
/// Throws PanicError (Python RuntimeError) naming the tensor on any mismatch.
template <typename TIn, typename TOut, bool kClamp>
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
  static_assert(
      std::is_same_v<TOut, fp8_e4m3_t> || std::is_same_v<TOut, int8_t>,
      "per_token_group_quant_8bit: TOut must be fp8_e4m3_t or int8_t");
  constexpr bool kInt8 = std::is_same_v<TOut, int8_t>;
  static_assert(kClamp || !kInt8, "per_token_group_quant_8bit: int8 output always clamps");
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
      .with_dtype<TOut>()
      .with_device<kDLCUDA>(device_)
      .verify(output_q, "output_q");
  const int64_t num_groups = check_group_quant_sizes(
      "per_token_group_quant_8bit", group_size, kMaxGroupSize, kInt8, scale_ue8m0, hidden_size.unwrap());
  SymbolicSize scale_cols{"scale_cols"};
  scale_cols.set_value(scale_ue8m0 ? div_ceil(num_groups, int64_t{4}) : num_groups);
  auto scale_matcher = TensorMatcher({num_tokens, scale_cols}).with_strides({kAnySize, kAnySize});
  if (scale_ue8m0) {
    scale_matcher.with_dtype<int32_t>().with_device<kDLCUDA>(device_).verify(output_s, "output_s");
  } else {
    scale_matcher.with_dtype<float>().with_device<kDLCUDA>(device_).verify(output_s, "output_s");
  }
  verify_group_quant_outputs_disjoint(input, output_q, output_s);
  RuntimeCheck(q_min < q_max, "per_token_group_quant_8bit: fp8_min must be < fp8_max, got ", q_min, " and ", q_max);
  // int8: the rounded value is stored as int8, so bounds past its range would wrap.
  RuntimeCheck(
      !std::is_same_v<TOut, int8_t> || (q_min >= -128.0 && q_max <= 127.0),
      "per_token_group_quant_8bit: int8 bounds must lie in [-128, 127], got ",
      q_min,
      " and ",
      q_max);
  constexpr double kFp8Max = device::quant::kTypeMax<fp8_e4m3_t>;
  RuntimeCheck(
      kClamp || (q_min <= -kFp8Max && q_max >= kFp8Max),
      "per_token_group_quant_8bit: the build without a clamp takes bounds at or past +-448, got ",
      q_min,
      " and ",
      q_max);

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

  dispatch_per_token_group_quant_8bit<TIn, TOut, kClamp>(params, aligned, pair_aligned, device);
}

}  // namespace
