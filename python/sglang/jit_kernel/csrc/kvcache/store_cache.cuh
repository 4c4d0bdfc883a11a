// store_cache: k_cache[indices[i]] = k[i], v_cache[indices[i]] = v[i] for i < num_indices, as bit
// copies of any dtype (the row_scatter engine). k and v may have different row widths; an index
// outside [0, num_slots) (-1 for CUDA-graph padding) copies nothing for that row.
//
// Moves 2 * num_indices * (k_row_bytes + v_row_bytes) bytes, plus the indices.
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, Symbolic{Size,DType,Device}
#include <sgl_kernel/utils.h>   // For RuntimeCheck

#include <cstdint>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include "access.cuh"       // For verify_kv_caches_disjoint
#include "row_scatter.cuh"  // For RowScatterParams, RowPart, ScatterWidths, row_scatter_element_bytes, row_scatter_vector_bytes, dispatch_row_scatter

namespace {

/// From this many source bytes (k and v rows together) on, store_cache is a wide copy: the flat
/// kernel moves two 16-byte vectors per thread (launch_row_scatter's `wide`), more bytes in flight per
/// thread, which is faster on a copy this long; on shorter copies one vector per thread is faster
/// (docs/perf_notes.md, store_cache).
inline constexpr int64_t kStoreCacheWideMinBytes = int64_t{32} << 20;

/// store_cache(k, v, k_cache, v_cache, indices, row_bytes, num_split) of the build for IndexT
/// indices and kWidths' vectors.
///
/// k [num_tokens, k_row], v [num_tokens, v_row]: rows of one dtype each, row strides free, last
/// stride 1. k_cache [num_slots, k_row] of k's dtype, v_cache [num_slots, v_row] of v's dtype, row
/// strides free, last stride 1. indices [num_indices] of IndexT (int32_t | int64_t), any stride, num_indices <=
/// num_tokens (the rows after num_indices are not read). All on one CUDA device; the caches share
/// no memory with k, v or indices. row_bytes: 0, or k_row * element size (checked). num_split: 0
/// (auto: the flat kernel, a wide copy from kStoreCacheWideMinBytes on) or the warps per row part.
/// Throws PanicError (Python RuntimeError) before any launch on a mismatch; nothing is launched
/// when num_indices or num_slots is 0. Returns true once launched (or with nothing to launch);
/// false, launching nothing, for rows a kWide build does not take (dispatch_row_scatter).
template <typename IndexT, ScatterWidths kWidths>
bool store_cache(
    tvm::ffi::TensorView k,
    tvm::ffi::TensorView v,
    tvm::ffi::TensorView k_cache,
    tvm::ffi::TensorView v_cache,
    tvm::ffi::TensorView indices,
    int64_t row_bytes,
    int64_t num_split) {
  using namespace host;

  // Validate
  SymbolicSize num_tokens{"num_tokens"}, k_row{"k_row"}, v_row{"v_row"}, num_slots{"num_slots"};
  SymbolicSize num_indices{"num_indices"}, k_stride{"k_row_stride"}, v_stride{"v_row_stride"};
  SymbolicSize k_cache_stride{"k_cache_row_stride"}, v_cache_stride{"v_cache_row_stride"};
  SymbolicSize index_stride{"index_stride"};
  SymbolicDType k_dtype, v_dtype;
  SymbolicDevice device_;
  device_.set_options<kDLCUDA>();
  TensorMatcher({num_tokens, k_row})  //
      .with_strides({k_stride, 1})
      .with_dtype(k_dtype)
      .with_device(device_)
      .verify(k, "k");
  TensorMatcher({num_tokens, v_row})  //
      .with_strides({v_stride, 1})
      .with_dtype(v_dtype)
      .with_device(device_)
      .verify(v, "v");
  TensorMatcher({num_slots, k_row})
      .with_strides({k_cache_stride, 1})
      .with_dtype(k_dtype)
      .with_device(device_)
      .verify(k_cache, "k_cache");
  TensorMatcher({num_slots, v_row})
      .with_strides({v_cache_stride, 1})
      .with_dtype(v_dtype)
      .with_device(device_)
      .verify(v_cache, "v_cache");
  TensorMatcher({num_indices})
      .with_strides({index_stride})
      .with_dtype<IndexT>()
      .with_device(device_)
      .verify(indices, "indices");
  RuntimeCheck(
      num_indices.unwrap() <= num_tokens.unwrap(),
      "store_cache: indices has ",
      num_indices.unwrap(),
      " entries: expected at most num_tokens = ",
      num_tokens.unwrap(),
      " (the rows of k)");
  verify_kv_caches_disjoint(k_cache, v_cache, {{"k", &k}, {"v", &v}, {"indices", &indices}});

  // Unwrap
  const int64_t k_elem = row_scatter_element_bytes(k_dtype.unwrap(), "k");
  const int64_t v_elem = row_scatter_element_bytes(v_dtype.unwrap(), "v");
  const int64_t k_bytes = k_row.unwrap() * k_elem;
  const int64_t v_bytes = v_row.unwrap() * v_elem;
  RuntimeCheck(
      row_bytes == 0 || row_bytes == k_bytes,
      "store_cache: row_bytes = ",
      row_bytes,
      ": expected 0 or k_row * element size = ",
      k_bytes);
  RuntimeCheck(num_split >= 0, "store_cache: num_split = ", num_split, ": expected >= 0 (0 = auto)");
  const int64_t rows = num_indices.unwrap();
  RowScatterParams params{};
  params.part0 = RowPart{
      .src = k.data_ptr(),
      .dst = k_cache.data_ptr(),
      .src_stride = k_stride.unwrap() * k_elem,
      .dst_stride = k_cache_stride.unwrap() * k_elem};
  params.part1 = RowPart{
      .src = v.data_ptr(),
      .dst = v_cache.data_ptr(),
      .src_stride = v_stride.unwrap() * v_elem,
      .dst_stride = v_cache_stride.unwrap() * v_elem};
  params.indices = indices.data_ptr();
  params.index_stride = index_stride.unwrap();
  params.num_rows = rows;
  params.num_slots = num_slots.unwrap();
  const DLDevice device = device_.unwrap();
  if (rows == 0 || params.num_slots == 0 || (k_bytes == 0 && v_bytes == 0)) return true;

  // Configure: the widest vector every address, row stride and row size allows; two vectors per
  // thread from kStoreCacheWideMinBytes of sources on
  const int vec_bytes = row_scatter_vector_bytes(params, k_bytes, v_bytes);
  const bool wide = rows * (k_bytes + v_bytes) >= kStoreCacheWideMinBytes;

  // Launch
  return dispatch_row_scatter<IndexT, kWidths>(params, k_bytes, v_bytes, vec_bytes, num_split, wide, device);
}

}  // namespace
