// row_scatter: the byte-copy engine of the KV-cache writes (store_cache, set_mla_kv_buffer).
//
// A row i of the sources has two parts; part p of row i is copied, as raw bytes, into slot
// indices[i] of part p's destination: dst_p + indices[i] * dst_stride_p + [0, bytes_p). store_cache
// uses part 0 for k -> k_cache and part 1 for v -> v_cache; set_mla_kv_buffer uses part 0 for k_nope
// and part 1 for k_rope, both into one kv_buffer row (part 1's destination starts nope bytes later).
//
// Indices outside [0, num_slots) (the -1 of CUDA-graph padding rows, any other stray value) copy
// nothing: no write lands outside the destination or in another slot, and there is no device trap.
//
// Three kernels. The default (auto) one is flat: thread g moves vector g of the rows laid end to end,
// each row being part 0's vectors followed by part 1's, so no lane idles on a short part (per-part
// warps would leave 3 of 4 lanes of a warp idle on a 128-byte rope beside a 1024-byte nope) and
// consecutive threads touch consecutive bytes; the row of g comes from a multiply-shift (RowDivider)
// instead of a 64-bit division. A wide copy (the launcher's `wide`, 16-byte vectors) takes its form
// with two vectors per thread, both loads issued before either store. The warp kernel (an
// explicit num_split) has one warp copy one chunk of one part of one row, up to kUnroll vectors per
// lane in flight. All issue the source loads before they know the slot (the source address does not
// depend on it), so the index load and the data loads are in flight together: a decode step pays one
// memory latency, not two. Offsets are 64-bit (row * stride may exceed 2^32 bytes).
//
// PDL: every kernel waits for the previous kernel (griddepcontrol.wait) before its first global load
// (indices and sources may be its output; the slots written may be what it reads) and then releases
// the next kernel at once, so the next launch overlaps this one (see norm_rows.cuh's
// pdl_wait_then_release for why the release follows the wait).
#pragma once

#include <sgl_kernel/utils.h>  // For div_ceil, RuntimeCheck

#include <sgl_kernel/runtime.cuh>  // For runtime::get_sm_count
#include <sgl_kernel/utils.cuh>  // For LaunchKernel, SGL_DEVICE, device::kWarpThreads, device::pointer::offset, device::pdl_*
#include <sgl_kernel/vec.cuh>  // For AlignedVector

#include <algorithm>
#include <cstdint>
#include <dlpack/dlpack.h>

#include "access.cuh"  // For RowPart, RowScatterConfig, RowDivider, locate_flat_vector, load_issued_here

namespace {

/// Kernel arguments of row_scatter.
struct RowScatterParams {
  RowPart part0;
  RowPart part1;
  const void* indices;     // [num_rows] of the launch's index type, index_stride elements apart
  int64_t index_stride;    // elements between indices
  int64_t num_rows;        // rows to copy (entries of indices)
  int64_t num_slots;       // valid slots: [0, num_slots)
  int64_t num_split;       // warp kernel: chunks (warps) per row part, >= 1
  uint32_t row_vecs;       // flat kernel: part0.num_vecs + part1.num_vecs; num_rows * row_vecs < 2^31
  RowDivider row_divider;  // flat kernel: divides by row_vecs
};

/// Copies vectors [begin, end) of one row part from `src` to `dst` (both already at the row) with
/// the lanes of one warp; `valid` (the same in every lane) says whether the stores happen.
template <int kVecBytes>
SGL_DEVICE void copy_row_chunk(const void* src, void* dst, int64_t begin, int64_t end, bool valid, uint32_t lane) {
  using vec_t = device::AlignedVector<uint8_t, kVecBytes>;
  constexpr int kUnroll = RowScatterConfig::kUnroll;
  constexpr int64_t kStep = int64_t{device::kWarpThreads} * kUnroll;
  for (int64_t first = begin + lane; first < end; first += kStep) {
    vec_t v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = first + int64_t{u} * device::kWarpThreads;
      if (i < end) v[u].load(src, i);
    }
    if (!valid) return;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = first + int64_t{u} * device::kWarpThreads;
      if (i < end) v[u].store(dst, i);
    }
  }
}

/// Flat kernel: thread g of the grid moves vectors g, g + num_threads, ... of the rows laid end to end
/// (row = g / row_vecs; within a row part 0's vectors come first). One vector per thread and pass:
/// the index and source loads are issued together, then the store.
template <typename IndexT, int kVecBytes>
__global__ void __launch_bounds__(RowScatterConfig::kThreads) row_scatter_flat_kernel(const RowScatterParams params) {
  using vec_t = device::AlignedVector<uint8_t, kVecBytes>;
  device::pdl_wait_primary();  // before the first global load (see the file comment)
  device::pdl_launch_dependents();
  const auto* indices = static_cast<const IndexT*>(params.indices);
  const uint32_t row_vecs = params.row_vecs;
  const uint32_t total = static_cast<uint32_t>(params.num_rows) * row_vecs;  // < 2^31 (launcher)
  const uint32_t step = gridDim.x * blockDim.x;                              // <= 2^28: g + step < 2^32
  for (uint32_t g = blockIdx.x * blockDim.x + threadIdx.x; g < total; g += step) {
    const FlatVector at = locate_flat_vector(g, params.part0, params.part1, row_vecs, params.row_divider);
    const int64_t slot = static_cast<int64_t>(indices[int64_t{at.row} * params.index_stride]);
    const vec_t v = load_issued_here<vec_t>(at.src, at.vec);
    if (slot >= 0 && slot < params.num_slots) v.store(device::pointer::offset(at.dst, slot * at.dst_stride), at.vec);
  }
}

/// Flat kernel of a wide copy (16-byte vectors): thread g moves vectors g + u * step (u < kPer =
/// kWideVecsPerThread, step = the grid's threads) of the rows laid end to end, then g + kPer * step,
/// ...: every index and source load of a pass is issued before its first store, so a thread has
/// kPer * 16 bytes in flight. Each warp instruction still covers 512 contiguous source bytes. The
/// launcher sizes the grid for one pass (div_ceil(vectors, kThreads * kPer) blocks).
template <typename IndexT>
__global__ void __launch_bounds__(RowScatterConfig::kThreads)
    row_scatter_flat_wide_kernel(const RowScatterParams params) {
  constexpr int kPer = RowScatterConfig::kWideVecsPerThread;
  using vec_t = device::AlignedVector<uint8_t, 16>;
  device::pdl_wait_primary();  // before the first global load (see the file comment)
  device::pdl_launch_dependents();
  const auto* indices = static_cast<const IndexT*>(params.indices);
  const uint32_t row_vecs = params.row_vecs;
  const uint32_t total = static_cast<uint32_t>(params.num_rows) * row_vecs;  // < 2^31 (launcher)
  const uint32_t step = gridDim.x * blockDim.x;  // kPer * step <= 2^28: no 32-bit wrap below 2^32
  for (uint32_t base = blockIdx.x * blockDim.x + threadIdx.x; base < total; base += kPer * step) {
    vec_t v[kPer];
    int64_t slot[kPer];
    void* dst[kPer];
    uint32_t vec[kPer];
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const uint32_t g = base + u * step;
      slot[u] = -1;
      if (g < total) {
        const FlatVector at = locate_flat_vector(g, params.part0, params.part1, row_vecs, params.row_divider);
        vec[u] = at.vec;
        slot[u] = static_cast<int64_t>(indices[int64_t{at.row} * params.index_stride]);
        v[u] = load_issued_here<vec_t>(at.src, vec[u]);
        dst[u] = device::pointer::offset(at.dst, slot[u] * at.dst_stride);
      }
    }
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      if (slot[u] >= 0 && slot[u] < params.num_slots) v[u].store(dst[u], vec[u]);
    }
  }
}

/// Warp kernel: warp w of the grid takes units w, w + num_warps, ...; unit = (row, part, chunk),
/// chunk fastest.
template <typename IndexT, int kVecBytes>
__global__ void __launch_bounds__(RowScatterConfig::kThreads) row_scatter_kernel(const RowScatterParams params) {
  device::pdl_wait_primary();  // before the first global load (see the file comment)
  device::pdl_launch_dependents();
  const uint32_t lane = threadIdx.x % device::kWarpThreads;
  const int64_t warp = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / device::kWarpThreads;
  const int64_t num_warps = int64_t{gridDim.x} * blockDim.x / device::kWarpThreads;
  const int64_t units_per_row = 2 * params.num_split;
  const int64_t num_units = params.num_rows * units_per_row;
  const auto* indices = static_cast<const IndexT*>(params.indices);

  for (int64_t unit = warp; unit < num_units; unit += num_warps) {
    const int64_t row = unit / units_per_row;
    const int64_t rest = unit - row * units_per_row;
    const bool second = rest >= params.num_split;
    const int64_t chunk = second ? rest - params.num_split : rest;
    const RowPart& part = second ? params.part1 : params.part0;

    const int64_t slot = static_cast<int64_t>(indices[row * params.index_stride]);
    const int64_t begin = chunk * part.chunk_vecs;
    const int64_t end = std::min(begin + part.chunk_vecs, part.num_vecs);
    const void* src = device::pointer::offset(part.src, row * part.src_stride);
    const bool valid = slot >= 0 && slot < params.num_slots;
    void* dst = device::pointer::offset(part.dst, (valid ? slot : 0) * part.dst_stride);
    copy_row_chunk<kVecBytes>(src, dst, begin, end, valid, lane);
  }
}

/// Widest vector (1, 2, 4, 8 or 16 bytes) that every address, part size and row stride of `params`
/// is a multiple of, so no access is misaligned (a view with a storage offset, a row of 98 bytes).
/// A stride counts only when there is more than one row of its tensor.
inline int row_scatter_vector_bytes(const RowScatterParams& params, int64_t part0_bytes, int64_t part1_bytes) {
  const auto address = [](const void* p) { return static_cast<uint64_t>(reinterpret_cast<std::uintptr_t>(p)); };
  uint64_t bits = 16 | address(params.part0.src) | address(params.part0.dst) | address(params.part1.src) |
                  address(params.part1.dst) | static_cast<uint64_t>(part0_bytes) | static_cast<uint64_t>(part1_bytes);
  if (params.num_rows > 1) bits |= static_cast<uint64_t>(params.part0.src_stride | params.part1.src_stride);
  if (params.num_slots > 1) bits |= static_cast<uint64_t>(params.part0.dst_stride | params.part1.dst_stride);
  return static_cast<int>(bits & (~bits + 1));  // the lowest set bit: at most 16
}

/// Bytes per element of a dtype the engine copies: whole bytes only (no sub-byte or vector dtypes).
inline int64_t row_scatter_element_bytes(DLDataType dtype, const char* name) {
  host::RuntimeCheck(
      dtype.bits % 8 == 0 && dtype.bits > 0,
      name,
      ": dtype of ",
      int{dtype.bits},
      " bits: expected a whole number of bytes per element");
  return int64_t{dtype.bits} / 8 * dtype.lanes;
}

/// Chooses the kernel, num_split (when `requested` is 0) and the grid, then launches.
/// `params.part*.num_vecs` must be set for `vec_bytes`; the rest of the launch fields are filled
/// here. `params.num_rows` > 0.
///
/// Auto (`requested` 0): the flat kernel whenever its 32-bit vector ids cover the copy (below 2^31
/// vectors, 32 GiB at 16-byte vectors), one thread per vector, or with `wide` and 16-byte vectors
/// kWideVecsPerThread per thread (row_scatter_flat_wide_kernel; other widths ignore `wide`). Beyond
/// that, and for an explicit num_split, the warp kernel: in auto, while the whole copy, one vector
/// per lane, fits in one wave of resident warps, each lane moves one vector; beyond that up to
/// kUnroll vectors per chunk.
template <typename IndexT, int kVecBytes>
void launch_row_scatter(RowScatterParams params, int64_t requested_split, bool wide, DLDevice device) {
  using namespace host;
  using Config = RowScatterConfig;
  const int64_t row_vecs = params.part0.num_vecs + params.part1.num_vecs;
  if (requested_split <= 0 && row_vecs > 0 && params.num_rows < Config::kMaxFlatVecs / row_vecs) {
    params.row_vecs = static_cast<uint32_t>(row_vecs);
    params.row_divider = RowDivider::make(params.row_vecs);
    const bool wide_kernel = kVecBytes == 16 && wide;
    const int64_t per_thread = wide_kernel ? Config::kWideVecsPerThread : 1;
    const int64_t blocks = std::clamp<int64_t>(
        div_ceil(params.num_rows * row_vecs, int64_t{Config::kThreads} * per_thread),
        1,
        Config::kMaxBlocks / per_thread);
    LaunchKernel launch(static_cast<uint32_t>(blocks), Config::kThreads, device);
    launch.enable_pdl();
    if constexpr (kVecBytes == 16) {
      if (wide_kernel) return launch(row_scatter_flat_wide_kernel<IndexT>, params);
    }
    launch(row_scatter_flat_kernel<IndexT, kVecBytes>, params);
    return;
  }
  const int64_t max_vecs = std::max<int64_t>({params.part0.num_vecs, params.part1.num_vecs, 1});
  int64_t split = requested_split;
  if (split <= 0) {
    const int64_t one_per_lane = div_ceil(max_vecs, int64_t{device::kWarpThreads});
    const int64_t resident = int64_t{runtime::get_sm_count(device.device_id)} * Config::kFullWarps;
    const bool one_wave = params.num_rows * 2 * one_per_lane <= resident;
    split = one_wave ? one_per_lane : div_ceil(max_vecs, int64_t{device::kWarpThreads} * Config::kUnroll);
  }
  params.num_split = std::clamp<int64_t>(split, 1, max_vecs);
  params.part0.chunk_vecs = div_ceil(params.part0.num_vecs, params.num_split);
  params.part1.chunk_vecs = div_ceil(params.part1.num_vecs, params.num_split);
  const int64_t warps = params.num_rows * 2 * params.num_split;
  const int64_t blocks = std::clamp<int64_t>(div_ceil(warps, int64_t{Config::kWarps}), 1, Config::kMaxBlocks);
  LaunchKernel(static_cast<uint32_t>(blocks), Config::kThreads, device)
      .enable_pdl()(row_scatter_kernel<IndexT, kVecBytes>, params);
}

/// The vector widths a row_scatter build compiles: kWide the 16-byte vectors of aligned rows (every
/// KV-cache layout in use), kNarrow the 8 / 4 / 2 / 1-byte ones of rows that do not allow 16 bytes,
/// kAll both. store_cache builds kWide and kNarrow as two modules (per index type), so that its first
/// call compiles 3 kernels rather than 22; set_mla_kv_buffer builds kAll.
enum class ScatterWidths { kWide, kNarrow, kAll };

/// Launches row_scatter with IndexT indices and the widest vector of kWidths' that `vec_bytes`
/// (from row_scatter_vector_bytes) allows; num_vecs of both parts are derived from `part*_bytes`
/// here. `wide`: launch_row_scatter's two vectors per thread (16-byte vectors, auto split). Returns
/// false, launching nothing, for rows narrower than 16 bytes in a kWide build (the kNarrow one's); a
/// kNarrow build takes 16-byte rows with 8-byte vectors.
template <typename IndexT, ScatterWidths kWidths>
bool dispatch_row_scatter(
    RowScatterParams params,
    int64_t part0_bytes,
    int64_t part1_bytes,
    int vec_bytes,
    int64_t requested_split,
    bool wide,
    DLDevice device) {
  const auto launch = [&]<int kVecBytes>() {
    params.part0.num_vecs = part0_bytes / kVecBytes;
    params.part1.num_vecs = part1_bytes / kVecBytes;
    launch_row_scatter<IndexT, kVecBytes>(params, requested_split, wide, device);
    return true;
  };
  if constexpr (kWidths != ScatterWidths::kNarrow) {
    if (vec_bytes >= 16) return launch.template operator()<16>();
    if constexpr (kWidths == ScatterWidths::kWide) return false;
  }
  switch (vec_bytes) {
    case 4:
      return launch.template operator()<4>();
    case 2:
      return launch.template operator()<2>();
    case 1:
      return launch.template operator()<1>();
    default:  // 8, or 16 in a kNarrow build
      return launch.template operator()<8>();
  }
}

}  // namespace
