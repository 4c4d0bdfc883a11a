// apply_rope_inplace_with_kvcache into fp8 e4m3 caches: RoPE of q and k in place (rope.cuh's
// kernels and launch rules), and in the same launch the rotated k and the untouched v quantized with
// per-tensor scales and stored by slot (store_cache_quant's conversion), through the KV store
// policy RopeKvFp8. The result is bit for bit that of apply_rope_inplace followed by
// store_cache_quant:
//
//   q, k  <- rope(q, k)                                    (fp32, one rounding to T, as rope.cuh)
//   k_cache[out_loc[t]] = e4m3(clamp(float(k[t]) * k_inv, -448, 448))    (k as rotated, in T)
//   v_cache[out_loc[t]] = e4m3(clamp(float(v[t]) * v_inv, -448, 448))
//
// k_inv = 1 / k_scale[0] (a correctly rounded fp32 reciprocal of the device value) or the launcher's
// k_inv_scale; likewise v. Round to nearest even, saturating; NaN gives 0x7F. A token whose out_loc
// lies outside [0, cache_size) stores nothing (its q and k are still rotated); a position outside
// [0, max_position) rotates by cos = 1, sin = 0 (rope.cuh).
//
// Bytes moved: rope.cuh's rotation bytes + N * Hk * (2 * D - R) * sizeof(T) (the rest of k and v
// read) + 2 * N * Hk * D (both caches, one byte an element) + N * sizeof(out_loc).
#pragma once

#include <sgl_kernel/tensor.h>  // For verify_no_partial_overlap
#include <sgl_kernel/utils.h>   // For RuntimeCheck

#include <sgl_kernel/utils.cuh>  // For SGL_DEVICE, fp8_e4m3_t, fp32_t
#include <sgl_kernel/vec.cuh>    // For AlignedVector

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/optional.h>
#include <type_traits>
#include <utility>

#include "../kvcache/access.cuh"              // For bind_kv_scales
#include "../quantization/quantize_8bit.cuh"  // For quant::Chunk, chunk_to_float, quantize_values, kTypeMax, static_inverse_scale
#include "rope.cuh"  // For RopeParams, RopeKvCopy, rope_bind_kv, rope_dispatch, rope_cache_store

namespace {

/// rope.cuh's KV store policy for fp8 e4m3 caches (see RopeKvCopy): each vector of T, rotated k or
/// v, is quantized with its tensor's inverse scale and stored as kVecN bytes.
template <typename T>
struct RopeKvFp8 {
  using elem_t = fp8_e4m3_t;
  float k_inv;
  float v_inv;

  /// The inverse scales: 1 / k_scale[0] (correctly rounded) or k_inv_scale; likewise v.
  SGL_DEVICE static RopeKvFp8 make(const RopeParams& p) {
    return {
        device::quant::static_inverse_scale(p.k_scale, p.k_inv_scale),
        device::quant::static_inverse_scale(p.v_scale, p.v_inv_scale)};
  }
  template <std::size_t N>
  SGL_DEVICE void store(const device::AlignedVector<T, N>& x, elem_t* dst, bool is_k) const {
    constexpr float kMax = device::quant::kTypeMax<fp8_e4m3_t>;
    constexpr bool kClamp = N % 4 != 0;  // four or more values convert in pairs, satfinite clamps
    device::quant::Chunk<T, N, true> in;
    in.vec = x;
    float f[N];
    device::quant::chunk_to_float(in, f);
    const auto out = device::quant::quantize_values<fp8_e4m3_t, kClamp, N, true>(f, is_k ? k_inv : v_inv, -kMax, kMax);
    if constexpr (N >= 2) {
      rope_cache_store(out.vec, dst);
    } else {
      out.vec.store(dst);  // one byte: no L2-policy form
    }
  }
};

/// apply_rope_inplace_with_kvcache into float8_e4m3fn caches (see the file comment). As rope.cuh's
/// apply_rope_inplace_with_kvcache but k_cache, v_cache: [cache_size, num_kv_heads * head_dim] fp8
/// e4m3; k_scale, v_scale: none or fp32 [1] on the device (any stride), given with an inv_scale of 1
/// only. With no slots or no kv heads it only rotates. T = fp16_t | bf16_t | fp32_t. Throws
/// PanicError (Python RuntimeError) naming the tensor before any launch.
template <typename T>
void apply_rope_inplace_with_kvcache_fp8(
    tvm::ffi::TensorView q,
    tvm::ffi::TensorView k,
    tvm::ffi::TensorView v,
    tvm::ffi::TensorView k_cache,
    tvm::ffi::TensorView v_cache,
    tvm::ffi::TensorView cos_sin_cache,
    tvm::ffi::TensorView positions,
    tvm::ffi::TensorView out_loc,
    bool is_neox,
    int64_t rope_dim,
    int64_t enable_pdl,
    tvm::ffi::Optional<tvm::ffi::TensorView> k_scale,
    tvm::ffi::Optional<tvm::ffi::TensorView> v_scale,
    double k_inv_scale,
    double v_inv_scale) {
  using namespace host;
  static_assert(
      std::is_same_v<T, fp16_t> || std::is_same_v<T, bf16_t> || std::is_same_v<T, fp32_t>,
      "apply_rope_inplace_with_kvcache_fp8: T must be fp16_t, bf16_t or fp32_t");
  constexpr const char* kOp = "apply_rope_inplace_with_kvcache";

  // Validate
  RopeParams p{};
  DLDevice device{};
  rope_bind_kv<T, fp8_e4m3_t>(kOp, q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc, rope_dim, p, device);
  const auto [k_scale_ptr, v_scale_ptr] =
      bind_kv_scales(kOp, k_cache, v_cache, k_scale, v_scale, k_inv_scale, v_inv_scale, device);
  // q and k are rotated in place while every CTA reads the scales
  for (const auto& [scale, name] : {std::pair{&k_scale, "k_scale"}, std::pair{&v_scale, "v_scale"}}) {
    if (!scale->has_value()) continue;
    verify_no_partial_overlap(q, "q", scale->value(), name, /*allow_same=*/false);
    verify_no_partial_overlap(k, "k", scale->value(), name, /*allow_same=*/false);
  }

  // Unwrap
  p.k_scale = k_scale_ptr;
  p.v_scale = v_scale_ptr;
  p.k_inv_scale = static_cast<float>(k_inv_scale);
  p.v_inv_scale = static_cast<float>(v_inv_scale);
  if (p.k.num_heads == 0) p.cache_size = 0;  // nothing to store: out_loc is never valid

  // Launch: rope.cuh's KV-store kernels with the quantizing store (with no slots or no kv heads
  // they read v, if any, and store nothing)
  rope_dispatch<T, fp32_t, true, RopeKvFp8<T>>(p, is_neox, device, enable_pdl);
}

}  // namespace
