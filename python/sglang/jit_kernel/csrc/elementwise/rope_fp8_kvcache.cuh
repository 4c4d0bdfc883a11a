// apply_rope_inplace_with_kvcache into fp8 e4m3 caches: RoPE of q and k in place (rope.cuh's
// rotation), and in the same launch the rotated k and the untouched v quantized with per-tensor
// scales and stored by slot (store_cache_quant's conversion). The result is bit for bit that of
// apply_rope_inplace followed by store_cache_quant:
//
//   q, k  <- rope(q, k)                                    (fp32, one rounding to T, as rope.cuh)
//   k_cache[out_loc[t]] = e4m3(clamp(float(k[t]) * k_inv, -448, 448))    (k as rotated, in T)
//   v_cache[out_loc[t]] = e4m3(clamp(float(v[t]) * v_inv, -448, 448))
//
// k_inv = 1 / k_scale[0] (a correctly rounded fp32 reciprocal of the device value) or the launcher's
// k_inv_scale; likewise v. Round to nearest even, saturating; NaN gives 0x7F.
//
// One kernel per vector width: thread g of the grid takes unit g of the units of all tokens laid end
// to end (token = g / units, a multiply-shift). A token's units are first its rotation units, one per
// pair chunk of each q and k head (rope.cuh's chunk layout: two vectors of kVecN elements holding
// kVecN pairs), which rotate in place and, for a k head, store both vectors to k_cache; then its
// store units, per kv head the vectors of k past the rotated elements and all of v, quantized and
// stored. Rotated and stored elements of k are disjoint, so no unit reads what another writes. A
// token whose out_loc lies outside [0, cache_size) stores nothing (its q and k are still rotated);
// a position outside [0, max_position) rotates by cos = 1, sin = 0 (rope.cuh). Vectors are 16 bytes of
// T where every pointer, stride and size allows it, one element otherwise. Past 2^31 units the
// launcher splits the tokens into launches.
//
// Bytes moved: rope.cuh's rotation bytes + N * Hk * (2 * D - R) * sizeof(T) (the rest of k and v
// read) + 2 * N * Hk * D (both caches, one byte an element) + N * sizeof(out_loc).
#pragma once

#include <sgl_kernel/utils.h>  // For RuntimeCheck, div_ceil

#include <sgl_kernel/utils.cuh>  // For LaunchKernel, SGL_DEVICE, fp8_e4m3_t, fp32_t, pdl_wait_primary, pdl_launch_dependents
#include <sgl_kernel/vec.cuh>  // For AlignedVector

#include <algorithm>
#include <cstdint>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/optional.h>
#include <type_traits>

#include "../kvcache/access.cuh"              // For RowDivider, bind_kv_scales
#include "../quantization/quantize_8bit.cuh"  // For quant::Chunk, chunk_to_float, quantize_values, kTypeMax, static_inverse_scale
#include "rope.cuh"  // For RopeParams, rope_bind_kv, rope_vector_elements, rope_address, rope_resolve_pdl, chunk_offsets, head_at, load_index, load_cos_sin, rotate_pairs, rope_valid_loc

namespace {

/// Kernel arguments of rope_fp8_kvcache_kernel: rope.cuh's RopeParams (the caches' rows of e4m3
/// bytes, strides in bytes), the scales and the unit layout of a token.
struct RopeFp8Params {
  RopeParams rope;
  const float* k_scale;   // [1] on the device, or nullptr: k_inv_scale is used
  const float* v_scale;   // [1] on the device, or nullptr: v_inv_scale is used
  float k_inv_scale;      // used when k_scale is nullptr
  float v_inv_scale;      // used when v_scale is nullptr
  int64_t first_token;    // the first token of this launch
  uint32_t num_units;     // units of this launch: tokens * units_per_token < 2^31
  uint32_t units;         // units per token: rot_units + num_kv_heads * kv_vecs
  uint32_t rot_units;     // (num_q_heads + num_kv_heads) * chunks
  uint32_t chunks;        // pair chunks per head: half / kVecN
  uint32_t kv_vecs;       // store units per kv head: rest_vecs + head_dim / kVecN
  uint32_t rest_vecs;     // vectors of k past the rotated elements: (head_dim - 2 * half) / kVecN
  RowDivider by_units;    // divides by units
  RowDivider by_chunks;   // divides by chunks
  RowDivider by_kv_vecs;  // divides by kv_vecs
};

/// Launch facts of rope_fp8_kvcache_kernel.
struct RopeFp8Config {
  static constexpr uint32_t kThreads = 256;               // threads per block
  static constexpr int64_t kMaxBlocks = 1 << 20;          // grid cap; threads loop
  static constexpr int64_t kMaxUnits = int64_t{1} << 31;  // 32-bit unit ids per launch
};

/// Quantizes the kVecN elements of `x` with the multiplier `inv` and stores them at `dst` (e4m3 bytes).
template <typename T, int kVecN>
SGL_DEVICE void rope_store_fp8(const device::AlignedVector<T, kVecN>& x, uint8_t* dst, float inv) {
  constexpr float kMax = device::quant::kTypeMax<fp8_e4m3_t>;
  constexpr bool kClamp = kVecN % 4 != 0;  // four or more values convert in pairs, satfinite clamps
  device::quant::Chunk<T, kVecN, true> in;
  in.vec = x;
  float f[kVecN];
  device::quant::chunk_to_float(in, f);
  const auto out = device::quant::quantize_values<fp8_e4m3_t, kClamp, kVecN, true>(f, inv, -kMax, kMax);
  out.store(reinterpret_cast<fp8_e4m3_t*>(dst), 0);
}

/// Thread g takes units g, g + num_threads, ... of the launch's tokens (see the file comment).
template <typename T, int kVecN, bool kNeox>
__global__ void __launch_bounds__(RopeFp8Config::kThreads) rope_fp8_kvcache_kernel(const RopeFp8Params params) {
  using vec_t = device::AlignedVector<T, kVecN>;
  const RopeParams& p = params.rope;
  // Everything below may read what the previous kernel in the stream writes (PDL).
  device::pdl_wait_primary();
  device::pdl_launch_dependents();
  const float k_inv = device::quant::static_inverse_scale(params.k_scale, params.k_inv_scale);
  const float v_inv = device::quant::static_inverse_scale(params.v_scale, params.v_inv_scale);
  const uint32_t step = gridDim.x * blockDim.x;  // <= 2^28: g + step < 2^32
  for (uint32_t g = blockIdx.x * blockDim.x + threadIdx.x; g < params.num_units; g += step) {
    const uint32_t t = params.by_units.divide(g);
    const uint32_t u = g - t * params.units;
    const int64_t token = params.first_token + t;
    const int64_t loc = rope_valid_loc(p, token);
    if (u < params.rot_units) {
      const uint32_t head = params.by_chunks.divide(u);
      const uint32_t chunk = u - head * params.chunks;
      int64_t off_a, off_b;
      chunk_offsets<kVecN, kNeox>(chunk, p.half, off_a, off_b);
      T* x = head_at<T>(p, token, head);
      vec_t a, b;
      a.load(x + off_a);
      b.load(x + off_b);
      float c[kVecN], s[kVecN];
      load_cos_sin<fp32_t, kVecN>(p, load_index(p.positions, p.positions_int64, token), chunk, c, s);
      rotate_pairs<T, kVecN, kNeox>(a, b, c, s);
      a.store(x + off_a);
      b.store(x + off_b);
      if (loc >= 0 && head >= p.q.num_heads) {
        uint8_t* row = static_cast<uint8_t*>(p.k_cache) + loc * p.k_cache_stride + (head - p.q.num_heads) * p.head_dim;
        rope_store_fp8<T, kVecN>(a, row + off_a, k_inv);
        rope_store_fp8<T, kVecN>(b, row + off_b, k_inv);
      }
    } else if (loc >= 0) {
      const uint32_t s = u - params.rot_units;
      const uint32_t kv_head = params.by_kv_vecs.divide(s);
      const uint32_t j = s - kv_head * params.kv_vecs;
      const bool is_k = j < params.rest_vecs;
      const int64_t off = is_k ? 2 * p.half + int64_t{j} * kVecN : int64_t{j - params.rest_vecs} * kVecN;
      const T* src = is_k ? static_cast<const T*>(p.k.data) + token * p.k.token_stride + kv_head * p.k.head_stride
                          : static_cast<const T*>(p.v) + token * p.v_token_stride + kv_head * p.v_head_stride;
      uint8_t* dst = is_k ? static_cast<uint8_t*>(p.k_cache) + loc * p.k_cache_stride
                          : static_cast<uint8_t*>(p.v_cache) + loc * p.v_cache_stride;
      vec_t x;
      x.load(src + off);
      rope_store_fp8<T, kVecN>(x, dst + int64_t{kv_head} * p.head_dim + off, is_k ? k_inv : v_inv);
    }
  }
}

/// Launches the kernel over every token, in launches of fewer than 2^31 units each.
template <typename T, int kVecN, bool kNeox>
void launch_rope_fp8_kvcache(RopeFp8Params params, DLDevice device, bool pdl) {
  using namespace host;
  using Config = RopeFp8Config;
  const RopeParams& p = params.rope;
  const int64_t chunks = p.half / kVecN;
  const int64_t rest_vecs = (p.head_dim - 2 * p.half) / kVecN;
  const int64_t kv_vecs = rest_vecs + p.head_dim / kVecN;
  const int64_t rot_units = (p.q.num_heads + p.k.num_heads) * chunks;
  const int64_t units = rot_units + p.k.num_heads * kv_vecs;
  RuntimeCheck(
      units < Config::kMaxUnits,
      "apply_rope_inplace_with_kvcache: ",
      units,
      " vectors per token: expected fewer than 2^31 (32-bit unit ids)");
  params.units = static_cast<uint32_t>(units);
  params.rot_units = static_cast<uint32_t>(rot_units);
  params.chunks = static_cast<uint32_t>(chunks);
  params.kv_vecs = static_cast<uint32_t>(kv_vecs);
  params.rest_vecs = static_cast<uint32_t>(rest_vecs);
  params.by_units = RowDivider::make(params.units);
  params.by_chunks = RowDivider::make(std::max<uint32_t>(params.chunks, 1));
  params.by_kv_vecs = RowDivider::make(std::max<uint32_t>(params.kv_vecs, 1));
  const int64_t tokens_per_launch = (Config::kMaxUnits - 1) / units;
  for (int64_t first = 0; first < p.num_tokens; first += tokens_per_launch) {
    const int64_t tokens = std::min(tokens_per_launch, p.num_tokens - first);
    params.first_token = first;
    params.num_units = static_cast<uint32_t>(tokens * units);
    const int64_t blocks =
        std::clamp<int64_t>(div_ceil(tokens * units, int64_t{Config::kThreads}), 1, Config::kMaxBlocks);
    LaunchKernel(static_cast<uint32_t>(blocks), Config::kThreads, device)
        .enable_pdl(pdl)(rope_fp8_kvcache_kernel<T, kVecN, kNeox>, params);
  }
}

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
  RopeFp8Params params{};
  RopeParams& p = params.rope;
  DLDevice device{};
  rope_bind_kv<T, fp8_e4m3_t>(kOp, q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc, rope_dim, p, device);
  const auto [k_scale_ptr, v_scale_ptr] =
      bind_kv_scales(kOp, k_cache, v_cache, k_scale, v_scale, k_inv_scale, v_inv_scale, device);

  // Unwrap
  params.k_scale = k_scale_ptr;
  params.v_scale = v_scale_ptr;
  params.k_inv_scale = static_cast<float>(k_inv_scale);
  params.v_inv_scale = static_cast<float>(v_inv_scale);
  if (p.k.num_heads == 0) p.cache_size = 0;  // nothing to store: out_loc is never valid
  if (p.num_tokens == 0 || p.q.num_heads + p.k.num_heads == 0) return;

  // Configure: 16 bytes of T per vector where q, k, v, the cos/sin rows and the caches allow it
  constexpr int kVecN = static_cast<int>(16 / sizeof(T));
  const uint64_t s = sizeof(T);
  uint64_t strides = static_cast<uint64_t>(p.half | p.head_dim) * s;
  if (p.num_tokens > 1) strides |= static_cast<uint64_t>(p.q.token_stride | p.k.token_stride | p.v_token_stride) * s;
  strides |= static_cast<uint64_t>(p.q.head_stride | p.k.head_stride | p.v_head_stride) * s;
  const uint64_t cos_sin = rope_address(p.cos_sin_cache) |
                           static_cast<uint64_t>((p.max_position > 1 ? p.cache_stride : 0) | p.half) * sizeof(fp32_t);
  const uint64_t caches = rope_address(p.k_cache) | rope_address(p.v_cache) |
                          static_cast<uint64_t>(p.k_cache_stride | p.v_cache_stride | p.head_dim);
  const bool wide =
      rope_vector_elements<T>({rope_address(p.q.data), rope_address(p.k.data), rope_address(p.v), strides}) == kVecN &&
      cos_sin % (kVecN * sizeof(fp32_t)) == 0 && caches % kVecN == 0;
  const bool pdl = rope_resolve_pdl(enable_pdl, device);

  // Launch
  if (is_neox) {
    if (wide) return launch_rope_fp8_kvcache<T, kVecN, true>(params, device, pdl);
    return launch_rope_fp8_kvcache<T, 1, true>(params, device, pdl);
  }
  if (wide) return launch_rope_fp8_kvcache<T, kVecN, false>(params, device, pdl);
  launch_rope_fp8_kvcache<T, 1, false>(params, device, pdl);
}

}  // namespace
