// set_mla_kv_buffer: kv_buffer[loc[i]] = cat(k_nope[i], k_rope[i]), bit copies (the row_scatter
// engine: part 0 writes the nope bytes at the start of the slot row, part 1 the rope bytes after
// them). A loc outside [0, num_slots) (-1 for CUDA-graph padding) copies nothing for that row.
//
// Moves 2 * num_tokens * (nope + rope) * element_size bytes, plus loc.
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, Symbolic{Size,DType,Device}, verify_no_partial_overlap, verify_no_self_overlap
#include <sgl_kernel/utils.h>  // For RuntimeCheck, pointer::offset

#include <cstdint>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include "row_scatter.cuh"

namespace {

/// Verifies `t` as [rows, row] or [rows, 1, row]: the row contiguous, the stride of rows free.
inline void verify_mla_rows(
    tvm::ffi::TensorView t,
    const char* name,
    host::SymbolicSize& rows,
    host::SymbolicSize& row,
    host::SymbolicSize& row_stride,
    host::SymbolicDType& dtype,
    host::SymbolicDevice& device) {
  using namespace host;
  if (t.ndim() == 3) {
    TensorMatcher({rows, 1, row})
        .with_strides({row_stride, kAnySize, 1})
        .with_dtype(dtype)
        .with_device(device)
        .verify(t, name);
  } else {
    TensorMatcher({rows, row}).with_strides({row_stride, 1}).with_dtype(dtype).with_device(device).verify(t, name);
  }
}

/// set_mla_kv_buffer(kv_buffer, loc, k_nope, k_rope).
///
/// kv_buffer [num_slots, nope + rope], k_nope [num_tokens, nope], k_rope [num_tokens, rope] (each
/// also with a head dim of 1 before the row): one dtype, row strides free, last stride 1. loc
/// [num_tokens] int32 or int64, any stride. One CUDA device; kv_buffer shares no memory with the
/// sources or loc. Throws PanicError (Python RuntimeError) before any launch on a mismatch; nothing
/// is launched for 0 tokens or 0 slots.
void set_mla_kv_buffer(
    tvm::ffi::TensorView kv_buffer,
    tvm::ffi::TensorView loc,
    tvm::ffi::TensorView k_nope,
    tvm::ffi::TensorView k_rope) {
  using namespace host;

  // Validate
  SymbolicSize num_slots{"num_slots"}, kv_dim{"nope + rope"}, num_tokens{"num_tokens"};
  SymbolicSize nope{"nope"}, rope{"rope"};
  SymbolicSize kv_stride{"kv_buffer_row_stride"}, nope_stride{"k_nope_row_stride"}, rope_stride{"k_rope_row_stride"};
  SymbolicSize loc_stride{"loc_stride"};
  SymbolicDType dtype, index_dtype;
  index_dtype.set_options<int32_t, int64_t>();
  SymbolicDevice device_;
  device_.set_options<kDLCUDA>();
  verify_mla_rows(kv_buffer, "kv_buffer", num_slots, kv_dim, kv_stride, dtype, device_);
  verify_mla_rows(k_nope, "cache_k_nope", num_tokens, nope, nope_stride, dtype, device_);
  verify_mla_rows(k_rope, "cache_k_rope", num_tokens, rope, rope_stride, dtype, device_);
  TensorMatcher({num_tokens})
      .with_strides({loc_stride})
      .with_dtype(index_dtype)
      .with_device(device_)
      .verify(loc, "loc");
  RuntimeCheck(
      nope.unwrap() + rope.unwrap() == kv_dim.unwrap(),
      "set_mla_kv_buffer: kv_buffer row of ",
      kv_dim.unwrap(),
      " elements: expected nope + rope = ",
      nope.unwrap(),
      " + ",
      rope.unwrap());
  verify_no_partial_overlap(kv_buffer, "kv_buffer", k_nope, "cache_k_nope", /*allow_same=*/false);
  verify_no_partial_overlap(kv_buffer, "kv_buffer", k_rope, "cache_k_rope", /*allow_same=*/false);
  verify_no_partial_overlap(kv_buffer, "kv_buffer", loc, "loc", /*allow_same=*/false);
  verify_no_self_overlap(kv_buffer, "kv_buffer");  // slot rows of their own

  // Unwrap
  const int64_t elem = row_scatter_element_bytes(dtype.unwrap(), "kv_buffer");
  const int64_t nope_bytes = nope.unwrap() * elem;
  const int64_t rope_bytes = rope.unwrap() * elem;
  const int64_t rows = num_tokens.unwrap();
  RowScatterParams params{};
  params.part0 = RowPart{
      .src = k_nope.data_ptr(),
      .dst = kv_buffer.data_ptr(),
      .src_stride = nope_stride.unwrap() * elem,
      .dst_stride = kv_stride.unwrap() * elem};
  params.part1 = RowPart{
      .src = k_rope.data_ptr(),
      .dst = pointer::offset(kv_buffer.data_ptr(), nope_bytes),
      .src_stride = rope_stride.unwrap() * elem,
      .dst_stride = kv_stride.unwrap() * elem};
  params.indices = loc.data_ptr();
  params.index_stride = loc_stride.unwrap();
  params.num_rows = rows;
  params.num_slots = num_slots.unwrap();
  const DLDevice device = device_.unwrap();
  if (rows == 0 || params.num_slots == 0 || nope_bytes + rope_bytes == 0) return;

  // Configure: the widest vector every address, row stride and row size allows
  const int vec_bytes = row_scatter_vector_bytes(params, nope_bytes, rope_bytes);

  // Launch (auto split, one vector per thread)
  if (index_dtype.is_type<int32_t>()) {
    dispatch_row_scatter<int32_t, ScatterWidths::kAll>(params, nope_bytes, rope_bytes, vec_bytes, 0, false, device);
  } else {
    dispatch_row_scatter<int64_t, ScatterWidths::kAll>(params, nope_bytes, rope_bytes, vec_bytes, 0, false, device);
  }
}

}  // namespace
