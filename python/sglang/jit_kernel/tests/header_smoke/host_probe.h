// Host-only probes of include/sgl_kernel/tensor.h, compiled by tests/test_header_host.py with g++
// (cpp_files of load_jit) and called with CPU torch tensors: no GPU needed.
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, SymbolicSize, verify_no_partial_overlap, verify_no_self_overlap

#include <cstdint>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/shape.h>
#include <tvm/ffi/container/tensor.h>

/// Raises unless a and b share no element (or are the same view when allow_same).
void probe_partial_overlap(tvm::ffi::TensorView a, tvm::ffi::TensorView b, bool allow_same) {
  host::verify_no_partial_overlap(a, "a", b, "b", allow_same);
}

/// Raises unless two hand-built bf16 DLTensor views are disjoint (or the same view when allow_same).
/// Each is (shape, strides, offset): its first element `offset` elements past one base address that
/// is never read, so strides may be negative (a flipped view), which torch tensors cannot express.
void probe_partial_overlap_dl(
    tvm::ffi::Shape a_shape,
    tvm::ffi::Shape a_strides,
    int64_t a_offset,
    tvm::ffi::Shape b_shape,
    tvm::ffi::Shape b_strides,
    int64_t b_offset,
    bool allow_same) {
  const auto view = [](const tvm::ffi::Shape& shape, const tvm::ffi::Shape& strides, int64_t offset) {
    DLTensor t{};
    t.data = reinterpret_cast<void*>(std::uintptr_t{1} << 40);
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = static_cast<int32_t>(shape.size());
    t.dtype = DLDataType{kDLBfloat, 16, 1};
    t.shape = const_cast<int64_t*>(shape.data());
    t.strides = const_cast<int64_t*>(strides.data());
    t.byte_offset = static_cast<uint64_t>(offset) * 2;
    return t;
  };
  const DLTensor a = view(a_shape, a_strides, a_offset), b = view(b_shape, b_strides, b_offset);
  host::verify_no_partial_overlap(tvm::ffi::TensorView(&a), "a", tvm::ffi::TensorView(&b), "b", allow_same);
}

/// Raises if elements of t can share an address (a stride-0 dim of size > 1, or dims that overlap).
void probe_self_overlap(tvm::ffi::TensorView t) { host::verify_no_self_overlap(t, "t"); }

/// Verifies x: [num_tokens, hidden_size] and w: [hidden_size], float32, CPU, contiguous.
int64_t probe_match_rows(tvm::ffi::TensorView x, tvm::ffi::TensorView w) {
  using namespace host;
  SymbolicSize num_tokens{"num_tokens"}, hidden_size{"hidden_size"};
  SymbolicDevice device;
  TensorMatcher({num_tokens, hidden_size}).with_dtype<float>().with_device_types<kDLCPU>(device).verify(x, "x");
  TensorMatcher({hidden_size}).with_dtype<float>().with_device_types<kDLCPU>(device).verify(w, "w");
  return num_tokens.unwrap() * hidden_size.unwrap();
}
