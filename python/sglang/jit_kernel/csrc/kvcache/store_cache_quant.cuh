// store_cache_quant: k_cache[indices[i]] = e4m3(clamp(k[i] * k_inv, -448, 448)) and the same for v,
// for i < num_indices: store_cache's row scatter with a quantizing store.
//
// Rounding (what the tests hold bit for bit against torch): each element is widened to fp32 (exact),
// multiplied by the fp32 inverse scale (one IEEE rounding), clamped to [-448, 448] and rounded once to
// e4m3, to nearest even (quant::quantize_values, the conversion of the 8-bit quantizers). The inverse
// scale is 1 / scale[0] (a correctly rounded fp32 reciprocal, computed per thread from the device
// value, so a captured CUDA graph sees the scale of each replay) when a scale tensor is given, and
// the launcher's fp32 inv_scale otherwise. NaN gives 0x7F (either sign); +-inf gives +-448.
//
// Layout and bounds as in row_scatter.cuh's flat kernel: thread g converts vector g of the rows laid
// end to end (each row k's vectors, then v's), the row from a multiply-shift (RowDivider), the index
// and source loads issued together (load_issued_here) before the conversion and the store. A vector is
// 16 source bytes (16 / sizeof(T) elements) where every row size, address and stride allows it, one
// element otherwise. Slots outside [0, num_slots) (num_slots capped by size_limit) are skipped: no
// write out of bounds, no device trap. Past 2^31 vectors the launcher splits the rows into launches.
//
// Moves num_indices * (k_row + v_row) * (sizeof(T) + 1) bytes, plus the indices and the scales.
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, Symbolic{Size,DType,Device}
#include <sgl_kernel/utils.h>   // For div_ceil, RuntimeCheck

#include <sgl_kernel/utils.cuh>  // For LaunchKernel, SGL_DEVICE, fp16_t, bf16_t, fp32_t, fp8_e4m3_t, device::pointer::offset, device::pdl_*
#include <sgl_kernel/vec.cuh>  // For AlignedVector

#include <algorithm>
#include <cstdint>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/optional.h>
#include <type_traits>

#include "../quantization/quantize_8bit.cuh"  // For quant::Chunk, chunk_to_float, quantize_values, kTypeMax, static_inverse_scale
#include "access.cuh"  // For RowPart, RowScatterConfig, RowDivider, locate_flat_vector, load_issued_here, verify_kv_caches_disjoint, bind_kv_scales

namespace {

/// Kernel arguments of store_cache_quant. In `k` and `v` (access.cuh's RowPart), `src` holds rows of
/// T, `dst` rows of e4m3 bytes, strides in bytes, `num_vecs` the vectors per row; `chunk_vecs` is unused.
struct StoreCacheQuantParams {
  RowPart k;
  RowPart v;
  const float* k_scale;    // [1] on the device, or nullptr: k_inv_scale is used
  const float* v_scale;    // [1] on the device, or nullptr: v_inv_scale is used
  float k_inv_scale;       // used when k_scale is nullptr
  float v_inv_scale;       // used when v_scale is nullptr
  const void* indices;     // [num_rows] of the launch's index type, index_stride elements apart
  int64_t index_stride;    // elements between indices
  int64_t num_rows;        // rows of this launch
  int64_t num_slots;       // valid slots: [0, num_slots)
  uint32_t row_vecs;       // k.num_vecs + v.num_vecs; num_rows * row_vecs < 2^31
  RowDivider row_divider;  // divides by row_vecs
};

/// Thread g converts and stores vectors g, g + num_threads, ... of the rows laid end to end (kN
/// source elements each; see the file comment).
template <typename T, typename IndexT, int kN>
__global__ void __launch_bounds__(RowScatterConfig::kThreads)
    store_cache_quant_kernel(const StoreCacheQuantParams params) {
  using src_vec_t = device::AlignedVector<T, kN>;
  constexpr float kMax = device::quant::kTypeMax<fp8_e4m3_t>;
  // Four or more values convert in pairs without the clamp (satfinite gives the clamp's result).
  constexpr bool kClamp = kN % 4 != 0;
  device::pdl_wait_primary();  // before the first global load (row_scatter.cuh's PDL note)
  device::pdl_launch_dependents();
  const float k_inv = device::quant::static_inverse_scale(params.k_scale, params.k_inv_scale);
  const float v_inv = device::quant::static_inverse_scale(params.v_scale, params.v_inv_scale);
  const auto* indices = static_cast<const IndexT*>(params.indices);
  const uint32_t row_vecs = params.row_vecs;
  const uint32_t total = static_cast<uint32_t>(params.num_rows) * row_vecs;  // < 2^31 (launcher)
  const uint32_t step = gridDim.x * blockDim.x;                              // <= 2^28: g + step < 2^32
  for (uint32_t g = blockIdx.x * blockDim.x + threadIdx.x; g < total; g += step) {
    const FlatVector at = locate_flat_vector(g, params.k, params.v, row_vecs, params.row_divider);
    const int64_t slot = static_cast<int64_t>(indices[int64_t{at.row} * params.index_stride]);
    device::quant::Chunk<T, kN, true> in;
    in.vec = load_issued_here<src_vec_t>(at.src, at.vec);
    float f[kN];
    device::quant::chunk_to_float(in, f);
    const float inv = at.second ? v_inv : k_inv;
    const auto out = device::quant::quantize_values<fp8_e4m3_t, kClamp, kN, true>(f, inv, -kMax, kMax);
    if (slot >= 0 && slot < params.num_slots) {
      out.store(static_cast<fp8_e4m3_t*>(device::pointer::offset(at.dst, slot * at.dst_stride)), at.vec);
    }
  }
}

/// Launches the kernel over all rows, in launches of fewer than 2^31 vectors each (32-bit ids).
template <typename T, typename IndexT, int kN>
void launch_store_cache_quant(StoreCacheQuantParams params, int64_t index_bytes, DLDevice device) {
  using namespace host;
  using Config = RowScatterConfig;
  const int64_t row_vecs = params.k.num_vecs + params.v.num_vecs;
  params.row_vecs = static_cast<uint32_t>(row_vecs);
  params.row_divider = RowDivider::make(params.row_vecs);
  RuntimeCheck(
      row_vecs < Config::kMaxFlatVecs,
      "store_cache_quant: k and v rows of ",
      row_vecs,
      " vectors: expected fewer than 2^31 (32-bit vector ids)");
  const int64_t rows_per_launch = (Config::kMaxFlatVecs - 1) / row_vecs;
  const int64_t num_rows = params.num_rows;
  for (int64_t first = 0; first < num_rows; first += rows_per_launch) {
    StoreCacheQuantParams part = params;
    part.num_rows = std::min(rows_per_launch, num_rows - first);
    part.k.src = static_cast<const char*>(params.k.src) + first * params.k.src_stride;
    part.v.src = static_cast<const char*>(params.v.src) + first * params.v.src_stride;
    part.indices = static_cast<const char*>(params.indices) + first * params.index_stride * index_bytes;
    const int64_t blocks =
        std::clamp<int64_t>(div_ceil(part.num_rows * row_vecs, int64_t{Config::kThreads}), 1, Config::kMaxBlocks);
    LaunchKernel(static_cast<uint32_t>(blocks), Config::kThreads, device)
        .enable_pdl()(store_cache_quant_kernel<T, IndexT, kN>, part);
  }
}

/// store_cache_quant<T>(k, v, k_cache, v_cache, indices, k_scale, v_scale, k_inv_scale, v_inv_scale,
/// size_limit).
///
/// k [num_tokens, k_row], v [num_tokens, v_row] of T (fp16_t, bf16_t or fp32_t), row strides free,
/// last stride 1. k_cache [num_slots, k_row], v_cache [num_slots, v_row] fp8 e4m3, row strides free,
/// last stride 1. indices [num_indices] int32 or int64, any stride, num_indices <= num_tokens (the
/// rows after num_indices are not read). k_scale, v_scale: none, or fp32 [1] (any stride); a scale
/// given with an inv_scale other than 1 is refused (one of the two). size_limit >= 0: when > 0,
/// slots from size_limit on are skipped like those outside the cache. All on one CUDA device; the
/// caches share no memory with each other or with any input. Throws PanicError (Python RuntimeError)
/// before any launch on a mismatch; nothing is launched when num_indices or the slot range is 0.
template <typename T>
void store_cache_quant(
    tvm::ffi::TensorView k,
    tvm::ffi::TensorView v,
    tvm::ffi::TensorView k_cache,
    tvm::ffi::TensorView v_cache,
    tvm::ffi::TensorView indices,
    tvm::ffi::Optional<tvm::ffi::TensorView> k_scale,
    tvm::ffi::Optional<tvm::ffi::TensorView> v_scale,
    double k_inv_scale,
    double v_inv_scale,
    int64_t size_limit) {
  using namespace host;
  static_assert(
      std::is_same_v<T, fp16_t> || std::is_same_v<T, bf16_t> || std::is_same_v<T, fp32_t>,
      "store_cache_quant: T must be fp16_t, bf16_t or fp32_t");

  // Validate
  SymbolicSize num_tokens{"num_tokens"}, k_row{"k_row"}, v_row{"v_row"}, num_slots{"num_slots"};
  SymbolicSize num_indices{"num_indices"}, k_stride{"k_row_stride"}, v_stride{"v_row_stride"};
  SymbolicSize k_cache_stride{"k_cache_row_stride"}, v_cache_stride{"v_cache_row_stride"};
  SymbolicSize index_stride{"index_stride"};
  SymbolicDType index_dtype;
  index_dtype.set_options<int32_t, int64_t>();
  SymbolicDevice device_;
  device_.set_options<kDLCUDA>();
  TensorMatcher({num_tokens, k_row})  //
      .with_strides({k_stride, 1})
      .with_dtype<T>()
      .with_device(device_)
      .verify(k, "k");
  TensorMatcher({num_tokens, v_row})  //
      .with_strides({v_stride, 1})
      .with_dtype<T>()
      .with_device(device_)
      .verify(v, "v");
  TensorMatcher({num_slots, k_row})
      .with_strides({k_cache_stride, 1})
      .with_dtype<fp8_e4m3_t>()
      .with_device(device_)
      .verify(k_cache, "k_cache");
  TensorMatcher({num_slots, v_row})
      .with_strides({v_cache_stride, 1})
      .with_dtype<fp8_e4m3_t>()
      .with_device(device_)
      .verify(v_cache, "v_cache");
  TensorMatcher({num_indices})
      .with_strides({index_stride})
      .with_dtype(index_dtype)
      .with_device(device_)
      .verify(indices, "indices");
  const auto [k_scale_ptr, v_scale_ptr] = bind_kv_scales(
      "store_cache_quant", k_cache, v_cache, k_scale, v_scale, k_inv_scale, v_inv_scale, device_.unwrap());
  RuntimeCheck(
      num_indices.unwrap() <= num_tokens.unwrap(),
      "store_cache_quant: indices has ",
      num_indices.unwrap(),
      " entries: expected at most num_tokens = ",
      num_tokens.unwrap(),
      " (the rows of k)");
  RuntimeCheck(size_limit >= 0, "store_cache_quant: size_limit = ", size_limit, ": expected >= 0 (0 = no limit)");
  verify_kv_caches_disjoint(k_cache, v_cache, {{"k", &k}, {"v", &v}, {"indices", &indices}});

  // Unwrap
  constexpr int64_t kElem = sizeof(T);
  StoreCacheQuantParams params{};
  params.k = RowPart{
      .src = host::data_ptr(k),
      .dst = host::data_ptr(k_cache),
      .src_stride = k_stride.unwrap() * kElem,
      .dst_stride = k_cache_stride.unwrap()};
  params.v = RowPart{
      .src = host::data_ptr(v),
      .dst = host::data_ptr(v_cache),
      .src_stride = v_stride.unwrap() * kElem,
      .dst_stride = v_cache_stride.unwrap()};
  params.k_scale = k_scale_ptr;
  params.v_scale = v_scale_ptr;
  params.k_inv_scale = static_cast<float>(k_inv_scale);
  params.v_inv_scale = static_cast<float>(v_inv_scale);
  params.indices = host::data_ptr(indices);
  params.index_stride = index_stride.unwrap();
  params.num_rows = num_indices.unwrap();
  params.num_slots = size_limit > 0 ? std::min(num_slots.unwrap(), size_limit) : num_slots.unwrap();
  const int64_t k_elems = k_row.unwrap();
  const int64_t v_elems = v_row.unwrap();
  const DLDevice device = device_.unwrap();
  if (params.num_rows == 0 || params.num_slots == 0 || (k_elems == 0 && v_elems == 0)) return;

  // Configure: 16 source bytes per vector where every row size, address and stride allows it
  constexpr int kVecN = 16 / sizeof(T);
  const auto aligned = [](const void* p, int64_t bytes) {
    return reinterpret_cast<std::uintptr_t>(p) % static_cast<std::uintptr_t>(bytes) == 0;
  };
  const bool many_rows = params.num_rows > 1, many_slots = params.num_slots > 1;
  const bool wide = k_elems % kVecN == 0 && v_elems % kVecN == 0 && aligned(params.k.src, 16) &&
                    aligned(params.v.src, 16) && aligned(params.k.dst, kVecN) && aligned(params.v.dst, kVecN) &&
                    (!many_rows || (params.k.src_stride % 16 == 0 && params.v.src_stride % 16 == 0)) &&
                    (!many_slots || (params.k.dst_stride % kVecN == 0 && params.v.dst_stride % kVecN == 0));
  const int vec_n = wide ? kVecN : 1;
  params.k.num_vecs = k_elems / vec_n;
  params.v.num_vecs = v_elems / vec_n;

  // Launch
  const int64_t index_bytes = index_dtype.is_type<int32_t>() ? 4 : 8;
  const auto launch = [&]<typename IndexT>() {
    if (wide) return launch_store_cache_quant<T, IndexT, kVecN>(params, index_bytes, device);
    launch_store_cache_quant<T, IndexT, 1>(params, index_bytes, device);
  };
  if (index_dtype.is_type<int32_t>()) return launch.template operator()<int32_t>();
  launch.template operator()<int64_t>();
}

}  // namespace
