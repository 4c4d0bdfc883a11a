// add_constant: dst[i] = src[i] + kConstant for int32 tensors, kConstant a compile-time constant.
//
// The tutorial's reference op of a template knob: kConstant enters the build marker, so every value
// is its own module. The per-element functor runs on the element-wise engine (elementwise/unary_map.cuh,
// shared with scale): 16-byte vectors (4 int32 per access), a narrower vector for a data pointer that
// is not 16-byte aligned, 64-bit indices. Memory-bound at 8 * num_elements bytes.
#pragma once

#include <sgl_kernel/utils.cuh>  // For SGL_DEVICE

#include <cstdint>
#include <tvm/ffi/container/tensor.h>

#include "elementwise/unary_map.cuh"  // For unary_map

namespace {

/// x -> x + kConstant with two's-complement wraparound, without signed-overflow UB: the sum is
/// taken as uint32 and reinterpreted.
template <int32_t kConstant>
struct AddConstantOp {
  SGL_DEVICE int32_t operator()(int32_t x) const {
    return static_cast<int32_t>(static_cast<uint32_t>(x) + static_cast<uint32_t>(kConstant));
  }
};

/// dst = src + kConstant. dst, src: contiguous 1-D int32 CUDA tensors of one length, on one device;
/// dst may be src. Empty tensors return without a launch. Throws PanicError (Python RuntimeError).
template <int32_t kConstant>
void add_constant(tvm::ffi::TensorView dst, tvm::ffi::TensorView src) {
  unary_map<int32_t>(dst, src, AddConstantOp<kConstant>{});
}

}  // namespace
