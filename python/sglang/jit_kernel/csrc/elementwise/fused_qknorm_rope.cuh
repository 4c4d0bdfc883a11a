// Per-head RMSNorm of q and k followed by RoPE with on-the-fly frequencies, in place on a packed
// qkv buffer (v untouched), in one launch:
//
//   y[e]   = x[e] * rsqrt(mean(x^2) + eps) * w[e]                   (w = q_weight or k_weight)
//   f_i    = base^(-2i / R), blended with f_i / factor by YaRN's ramp when factor != 1:
//            ramp = clamp((i - low) / (high - low), 0, 1), f_i <- (f_i / factor) * ramp + f_i * (1 - ramp)
//   c, s   = cos(pos * f_i) * attention_factor, sin(pos * f_i) * attention_factor
//   pairs of y (NeoX (i, i + R/2), GPT-J (2i, 2i + 1)) rotated as in rope.cuh; one rounding to T.
//
// Layout. A head's D elements are "units" of two vectors of kVecN elements: the R/(2 kVecN) pair
// chunks of rope.cuh first, then the unrotated rest [R, D) two vectors at a time. G lanes (a power
// of two <= 32, aligned in the warp) share a head, lane l holding units l and l + G (kUnits); the
// sum of squares is reduced by shuffles within the G lanes. The block is (G, heads, tokens). A
// thread computes its pairs' frequencies once (before the PDL wait: parameters only) and cos/sin
// once per token, then normalises and rotates every head it walks: at large sizes each thread walks
// up to kHeadPasses heads of its token, so that the sincosf work (about 40 instructions a pair) is
// shared by several heads and stays below the memory time; at small sizes every head gets its own
// threads (latency). Bytes moved: 2 * N * (Hq + Hk) * D * sizeof(T) + 2 * D * sizeof(T) + N * p.
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, SymbolicSize, SymbolicDevice, kAnySize, data_ptr
#include <sgl_kernel/utils.h>   // For RuntimeCheck, div_ceil

#include <sgl_kernel/utils.cuh>  // For LaunchKernel, SGL_DEVICE, kWarpThreads, pdl_wait_primary
#include <sgl_kernel/vec.cuh>    // For AlignedVector

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include "rope.cuh"  // For rotate_pairs, chunk_offsets, load_index, RopeAccess, rope_vector_elements, rope_resolve_pdl

namespace {

/// Launch facts of fused_qk_norm_rope_kernel.
struct QKNormRopeConfig {
  static constexpr uint32_t kMaxThreads = 512;
  // CTAs of kMaxThreads per SM the registers must allow, by units per lane: one unit fits 64
  // registers; two (head_dim 256 at 16-byte vectors) spill 100-140 bytes at 64, so they get 128.
  static constexpr uint32_t min_blocks(int units) { return units == 1 ? 2 : 1; }
  static constexpr int64_t kTargetThreads = 256;              // tokens packed into a CTA up to this many threads
  static constexpr int64_t kHeadPasses = 4;                   // heads per thread at large sizes
  static constexpr int64_t kLargeThreads = int64_t{1} << 16;  // one thread per head below this many
  static constexpr int64_t kMaxLanes = 32;                    // lanes per head (one warp)
};

/// Kernel arguments of fused_qk_norm_rope_kernel.
struct QKNormRopeParams {
  void* qkv;             // [num_tokens, row], head h of token t at t * token_stride + h * head_dim
  int64_t token_stride;  // elements
  int64_t num_tokens;
  int64_t num_q_heads;
  int64_t num_heads;  // num_q_heads + num_k_heads (v is never touched)
  int64_t head_dim;
  int64_t half;           // R / 2
  int64_t num_units;      // pair chunks + rest units per head
  int32_t lanes;          // G: lanes per head (power of two <= 32)
  const void* q_weight;   // [head_dim]
  const void* k_weight;   // [head_dim]
  const void* positions;  // [num_tokens] int32 / int64
  bool positions_int64;
  float eps;
  float base;
  float factor;
  float low;
  float high;
  float attention_factor;
};

/// The rotation frequency of pair i (YaRN-blended when factor != 1).
SGL_DEVICE float rope_frequency(const QKNormRopeParams& p, int64_t i) {
  float freq = powf(p.base, -2.0f * static_cast<float>(i) / static_cast<float>(2 * p.half));
  if (p.factor != 1.0f) {
    const float high = p.high == p.low ? p.high + 0.001f : p.high;
    const float ramp = fminf(fmaxf((static_cast<float>(i) - p.low) / (high - p.low), 0.0f), 1.0f);
    freq = (freq / p.factor) * ramp + freq * (1.0f - ramp);
  }
  return freq;
}

/// Sum over the G lanes of this lane's group (G a power of two, groups aligned in the warp); only
/// the group's lanes need to be converged. Every lane of the group gets the total.
SGL_DEVICE float group_sum(float value, int32_t lanes) {
  // The group is `lanes` consecutive lanes of the warp starting at a multiple of `lanes` (blockDim.x ==
  // lanes divides 32, so the linear thread ids of one (y, z) are such a group).
  uint32_t lane;
  asm("mov.u32 %0, %%laneid;" : "=r"(lane));
  const uint32_t group_mask = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u) << (lane & ~(lanes - 1u));
  for (int32_t m = lanes / 2; m > 0; m /= 2) value += __shfl_xor_sync(group_mask, value, m, device::kWarpThreads);
  return value;
}

template <typename T, int kVecN, bool kNeox, int kUnits>
__global__ void __launch_bounds__(QKNormRopeConfig::kMaxThreads, QKNormRopeConfig::min_blocks(kUnits))
    fused_qk_norm_rope_kernel(const QKNormRopeParams p) {
  using vec_t = device::AlignedVector<T, kVecN>;
  const int64_t num_chunks = p.half / kVecN;
  const int64_t token = int64_t{blockIdx.x} * blockDim.z + threadIdx.z;

  // Parameters only before the PDL wait: unit offsets and the frequencies of this lane's pairs.
  int64_t off_a[kUnits], off_b[kUnits];
  bool unit_valid[kUnits], b_valid[kUnits], rotated[kUnits];
  float freq[kUnits][kVecN];
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    const int64_t unit = threadIdx.x + int64_t{u} * p.lanes;
    unit_valid[u] = unit < p.num_units;
    rotated[u] = unit < num_chunks;
    if (rotated[u]) {
      chunk_offsets<kVecN, kNeox>(unit, p.half, off_a[u], off_b[u]);
    } else {
      off_a[u] = 2 * p.half + (unit - num_chunks) * 2 * kVecN;
      off_b[u] = off_a[u] + kVecN;
    }
    b_valid[u] = unit_valid[u] && off_b[u] < p.head_dim;
#pragma unroll
    for (int j = 0; j < kVecN; ++j) freq[u][j] = rotated[u] ? rope_frequency(p, unit * kVecN + j) : 0.0f;
  }

  device::pdl_wait_primary();
  device::pdl_launch_dependents();
  if (token >= p.num_tokens) return;

  const float pos = static_cast<float>(load_index(p.positions, p.positions_int64, token));
  float c[kUnits][kVecN], s[kUnits][kVecN];
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
#pragma unroll
    for (int j = 0; j < kVecN; ++j) {
      float sv = 0.0f, cv = 1.0f;
      if (rotated[u]) sincosf(pos * freq[u][j], &sv, &cv);
      c[u][j] = cv * p.attention_factor;
      s[u][j] = sv * p.attention_factor;
    }
  }

  const float inv_dim = 1.0f / static_cast<float>(p.head_dim);
  T* row = static_cast<T*>(p.qkv) + token * p.token_stride;
  for (int64_t head = threadIdx.y; head < p.num_heads; head += blockDim.y) {
    T* ptr = row + head * p.head_dim;
    const T* w = static_cast<const T*>(head < p.num_q_heads ? p.q_weight : p.k_weight);
    vec_t a[kUnits], b[kUnits];
    float sum = 0.0f;
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      a[u].fill(static_cast<T>(0.0f));
      b[u].fill(static_cast<T>(0.0f));
      if (unit_valid[u]) a[u].load(ptr + off_a[u]);
      if (b_valid[u]) b[u].load(ptr + off_b[u]);
#pragma unroll
      for (int j = 0; j < kVecN; ++j) {
        const float x = static_cast<float>(a[u][j]), y = static_cast<float>(b[u][j]);
        sum += x * x + y * y;
      }
    }
    const float rstd = rsqrtf(group_sum(sum, p.lanes) * inv_dim + p.eps);
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      if (!unit_valid[u]) continue;
      vec_t wa, wb;
      wa.load(w + off_a[u]);
      float za[kVecN], zb[kVecN] = {};
#pragma unroll
      for (int j = 0; j < kVecN; ++j) za[j] = static_cast<float>(a[u][j]) * rstd * static_cast<float>(wa[j]);
      if (b_valid[u]) {
        wb.load(w + off_b[u]);
#pragma unroll
        for (int j = 0; j < kVecN; ++j) zb[j] = static_cast<float>(b[u][j]) * rstd * static_cast<float>(wb[j]);
      }
      if (rotated[u]) {
        rotate_pairs_fp32<T, kVecN, kNeox>(za, zb, c[u], s[u], a[u], b[u]);
      } else {
#pragma unroll
        for (int j = 0; j < kVecN; ++j) {
          a[u][j] = static_cast<T>(za[j]);
          b[u][j] = static_cast<T>(zb[j]);
        }
      }
      a[u].store(ptr + off_a[u]);
      if (b_valid[u]) b[u].store(ptr + off_b[u]);
    }
  }
}

/// Launches fused_qk_norm_rope_kernel with kVecN (kMaxVecN, or 1 when the layout is not aligned to
/// it) and one or two units per lane.
template <typename T, int kVecN, bool kNeox>
void launch_fused_qk_norm_rope(QKNormRopeParams p, DLDevice device, bool pdl) {
  using namespace host;
  const int64_t units = p.num_units;
  RuntimeCheck(
      units <= 2 * QKNormRopeConfig::kMaxLanes,
      "fused_qk_norm_rope: head_dim ",
      p.head_dim,
      " needs ",
      units,
      " units of ",
      2 * kVecN,
      " elements, at most ",
      2 * QKNormRopeConfig::kMaxLanes,
      " are supported (align the qkv rows to 16 bytes, or use a smaller head_dim)");
  int64_t lanes = 1;
  while (lanes < std::min<int64_t>(units, QKNormRopeConfig::kMaxLanes)) lanes *= 2;
  p.lanes = static_cast<int32_t>(lanes);
  const int64_t per_token_all = lanes * p.num_heads;
  const bool large = per_token_all * p.num_tokens >= QKNormRopeConfig::kLargeThreads;
  const int64_t passes = large ? std::min<int64_t>(QKNormRopeConfig::kHeadPasses, p.num_heads) : 1;
  int64_t heads = div_ceil(p.num_heads, passes);
  heads = std::min<int64_t>(heads, QKNormRopeConfig::kMaxThreads / lanes);
  // blockDim.z is at most 64 (a CUDA limit)
  const int64_t tokens = std::clamp<int64_t>(
      QKNormRopeConfig::kTargetThreads / (lanes * heads), 1, std::clamp<int64_t>(p.num_tokens, 1, 64));
  const dim3 block(static_cast<uint32_t>(lanes), static_cast<uint32_t>(heads), static_cast<uint32_t>(tokens));
  const int64_t grid = div_ceil(p.num_tokens, tokens);
  RuntimeCheck(
      grid < (int64_t{1} << 31), "fused_qk_norm_rope: num_tokens too large for one launch, got ", p.num_tokens);
  if (units <= lanes) {
    LaunchKernel(static_cast<uint32_t>(grid), block, device)
        .enable_pdl(pdl)(fused_qk_norm_rope_kernel<T, kVecN, kNeox, 1>, p);
  } else {
    LaunchKernel(static_cast<uint32_t>(grid), block, device)
        .enable_pdl(pdl)(fused_qk_norm_rope_kernel<T, kVecN, kNeox, 2>, p);
  }
}

/// In place on qkv [num_tokens, (hq + hk + hv) * head_dim] (T, last dim contiguous, token stride
/// free): RMSNorm of each q and k head with q_weight / k_weight ([head_dim], contiguous), then RoPE
/// of its first rotary_dim elements (0: head_dim) with frequencies base^(-2i/R) (YaRN when factor
/// != 1). position_ids: [num_tokens] int32/int64. enable_pdl: 1 / 0 / -1 (auto).
/// T = fp16_t | bf16_t | fp32_t. Throws PanicError (Python RuntimeError) naming the tensor.
template <typename T>
void fused_qk_norm_rope(
    tvm::ffi::TensorView qkv,
    int64_t num_heads_q,
    int64_t num_heads_k,
    int64_t num_heads_v,
    int64_t head_dim,
    double eps,
    tvm::ffi::TensorView q_weight,
    tvm::ffi::TensorView k_weight,
    double base,
    bool is_neox,
    tvm::ffi::TensorView position_ids,
    double factor,
    double low,
    double high,
    double attention_factor,
    int64_t rotary_dim,
    int64_t enable_pdl) {
  using namespace host;
  constexpr const char* kOp = "fused_qk_norm_rope";

  // Validate
  RuntimeCheck(num_heads_q >= 0 && num_heads_k >= 0 && num_heads_v >= 0, kOp, ": head counts must be >= 0");
  RuntimeCheck(head_dim > 0, kOp, ": head_dim must be > 0, got ", head_dim);
  SymbolicSize num_tokens{"num_tokens"};
  SymbolicSize row{"(num_heads_q + num_heads_k + num_heads_v) * head_dim"};
  SymbolicSize dim{"head_dim"};
  row.set_value((num_heads_q + num_heads_k + num_heads_v) * head_dim);
  dim.set_value(head_dim);
  SymbolicDevice device_;
  device_.set_options<kDLCUDA>();
  TensorMatcher({num_tokens, row})  //
      .with_strides({kAnySize, 1})
      .with_dtype<T>()
      .with_device<kDLCUDA>(device_)
      .verify(qkv, "qkv");
  TensorMatcher({dim})  //
      .with_dtype<T>()
      .with_device<kDLCUDA>(device_)
      .verify(q_weight, "q_weight")
      .verify(k_weight, "k_weight");
  TensorMatcher({num_tokens})  //
      .with_dtype<int32_t, int64_t>()
      .with_device<kDLCUDA>(device_)
      .verify(position_ids, "position_ids");
  const int64_t r = rotary_dim == 0 ? head_dim : rotary_dim;
  RuntimeCheck(
      r > 0 && r % 2 == 0 && r <= head_dim,
      kOp,
      ": rotary_dim must be even, > 0 and <= head_dim (",
      head_dim,
      "), got ",
      r);
  RuntimeCheck(eps >= 0.0, kOp, ": eps must be >= 0, got ", eps);
  verify_no_partial_overlap(qkv, "qkv", q_weight, "q_weight", /*allow_same=*/false);
  verify_no_partial_overlap(qkv, "qkv", k_weight, "k_weight", /*allow_same=*/false);
  verify_no_partial_overlap(qkv, "qkv", position_ids, "position_ids", /*allow_same=*/false);

  // Unwrap
  QKNormRopeParams p{};
  p.qkv = data_ptr(qkv);
  p.token_stride = qkv.stride(0);
  p.num_tokens = num_tokens.unwrap();
  p.num_q_heads = num_heads_q;
  p.num_heads = num_heads_q + num_heads_k;
  p.head_dim = head_dim;
  p.half = r / 2;
  p.q_weight = data_ptr<const void>(q_weight);
  p.k_weight = data_ptr<const void>(k_weight);
  p.positions = data_ptr<const void>(position_ids);
  p.positions_int64 = position_ids.dtype().bits == 64;
  p.eps = static_cast<float>(eps);
  p.base = static_cast<float>(base);
  p.factor = static_cast<float>(factor);
  p.low = static_cast<float>(low);
  p.high = static_cast<float>(high);
  p.attention_factor = static_cast<float>(attention_factor);
  const DLDevice device = device_.unwrap();
  if (p.num_tokens == 0 || p.num_heads == 0) return;

  // Configure: 16-byte vectors when the rows, head_dim and R/2 allow it, else one element
  const uint64_t s = sizeof(T);
  constexpr int kMaxVecN = static_cast<int>(16 / sizeof(T));
  const uint64_t token_bits = p.num_tokens > 1 ? static_cast<uint64_t>(p.token_stride) * s : 0;
  const int64_t vec_n = rope_vector_elements<T>(
      {rope_address(p.qkv),
       token_bits,
       static_cast<uint64_t>(head_dim) * s,
       static_cast<uint64_t>(p.half) * s,
       rope_address(p.q_weight),
       rope_address(p.k_weight)});
  const bool pdl = rope_resolve_pdl(enable_pdl, device);

  // Launch
  auto launch = [&]<int kVecN>() {
    p.num_units = p.half / kVecN + div_ceil((head_dim - r) / kVecN, int64_t{2});
    if (is_neox) {
      launch_fused_qk_norm_rope<T, kVecN, true>(p, device, pdl);
    } else {
      launch_fused_qk_norm_rope<T, kVecN, false>(p, device, pdl);
    }
  };
  if (vec_n == kMaxVecN) {
    launch.template operator()<kMaxVecN>();
  } else {
    launch.template operator()<1>();
  }
}

}  // namespace
