// scale: dst[i] = src[i] * factor, element-wise, fp32 arithmetic, one rounding to the dtype.
//
// The per-element functor on the element-wise engine (unary_map.cuh: 16-byte vectors, alignment-
// dependent vector width, 64-bit indices, grid sizing); memory-bound at 2 * num_elements * sizeof(T)
// bytes.
#pragma once

#include <sgl_kernel/utils.cuh>  // For SGL_DEVICE, fp16_t, bf16_t, fp32_t

#include <tvm/ffi/container/tensor.h>

#include "unary_map.cuh"  // For unary_map, UnaryMapConfig, DefaultUnaryMapConfig

namespace {

/// Launch facts of scale (benchmark/sweep_scale.py sweeps them): the engine's.
template <int kUnrollV, uint32_t kThreadsV>
using ScaleConfig = UnaryMapConfig<kUnrollV, kThreadsV>;

/// x -> T(float(x) * factor): the product in fp32, rounded once to T.
template <typename T>
struct ScaleOp {
  float factor;  // multiplier, applied in fp32
  SGL_DEVICE T operator()(T x) const { return static_cast<T>(static_cast<float>(x) * factor); }
};

/// dst = src * factor with an explicit launch configuration (benchmark/sweep_scale.py times several).
template <typename T, typename Config>
void scale_with_config(tvm::ffi::TensorView dst, tvm::ffi::TensorView src, double factor) {
  unary_map<T, Config>(dst, src, ScaleOp<T>{static_cast<float>(factor)});
}

/// dst = src * factor. dst and src: contiguous 1-D tensors of T on one CUDA device, same length;
/// dst may be src (in place). Empty tensors return without a launch.
/// T = fp16_t | bf16_t | fp32_t. Throws PanicError (Python RuntimeError) on a mismatch.
template <typename T>
void scale(tvm::ffi::TensorView dst, tvm::ffi::TensorView src, double factor) {
  scale_with_config<T, DefaultUnaryMapConfig>(dst, src, factor);
}

}  // namespace
