// Host-only probes of include/sgl_kernel/tensor.h, compiled by tests/test_header_host.py with g++
// (cpp_files of load_jit) and called with CPU torch tensors: no GPU needed.
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, SymbolicSize, verify_no_partial_overlap, verify_no_self_overlap

#include <tvm/ffi/container/tensor.h>

#include <cstdint>

/// Raises unless a and b are disjoint (or the same view when allow_same).
void probe_partial_overlap(tvm::ffi::TensorView a, tvm::ffi::TensorView b, bool allow_same) {
  host::verify_no_partial_overlap(a, "a", b, "b", allow_same);
}

/// Raises if t has a stride-0 dimension of size > 1.
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
