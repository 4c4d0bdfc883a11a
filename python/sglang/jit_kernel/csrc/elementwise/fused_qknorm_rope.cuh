// Per-head RMSNorm of q and k followed by RoPE with on-the-fly frequencies, in place on a packed
// qkv buffer (v untouched), in one launch:
//
//   y[e]   = x[e] * rsqrt(mean(x^2) + eps) * w[e]                   (w = q_weight or k_weight)
//   f_i    = base^(-2i / R), blended with f_i / factor by YaRN's ramp when factor != 1:
//            ramp = clamp((i - low) / (high - low), 0, 1), f_i <- (f_i / factor) * ramp + f_i * (1 - ramp)
//   c, s   = cos(pos * f_i) * attention_factor, sin(pos * f_i) * attention_factor
//   pairs of y (NeoX (i, i + R/2), GPT-J (2i, 2i + 1)) rotated as in rope.cuh; one rounding to T.
//
// Bytes moved: 2 * N * (Hq + Hk) * D * sizeof(T) (q and k read and written once; v never touched)
// + 2 * D * sizeof(T) (weights) + N * sizeof(position).
//
// Layout. A head's D elements are "units" of two vectors of kVecN elements: the R/(2 kVecN) pair
// chunks of rope.cuh first, then the unrotated rest [R, D) two vectors at a time. G lanes (a power
// of two <= 32, aligned in the warp) share a head, lane l holding units l and l + G (kUnits); the
// sum of squares is reduced by shuffles within the G lanes. Trig: sincosf of the reference's fp32
// angle pos * f_i (~1 ulp), computed once per (token, pair) into a shared table, not per head.
//
// Two kernels, by size (launch_fused_qk_norm_rope):
//
// fused_qk_norm_rope_table_kernel: below QKNormRopeConfig::kLargeThreads threads (one per head
// and lane), with 16-byte vectors and one unit per lane. One head per lane group, CTAs of up to
// kTableWarps warps of one token spread over the SMs; the CTA computes its token's cos/sin table
// (at most two entries per thread at R = 128), one barrier, no loop over heads. After the PDL wait the
// position load issues first, then the data and weight loads; the trig starts as soon as the
// position arrives, while the data is in flight. Why: at a few tokens the chain after the PDL wait
// (position, trig, table, sum of squares, shuffles, rsqrt, rotation) is the whole cost, and a
// per-token CTA that walks its heads one batch after the other lengthens it.
//
// fused_qk_norm_rope_kernel: everywhere else (large sizes, narrow vectors, two units per lane). The
// heads of a token are split into "groups" of up to heads_per_group consecutive heads, q and k
// groups apart (a group never mixes the two weights, so a thread loads one weight once). The block
// is (G lanes, groups, tokens); a thread walks its group's heads kBatch at a time, all of a batch's
// loads issued before any is used: groups of kBatch heads at small sizes (every head in flight at
// once: latency), kLargeHeadsPerGroup at large ones (the trig shared by more heads). The frequency
// table [R/2] is computed once per CTA before the PDL wait (parameters only), the cos/sin rows after
// it, while the first batch's data and the weight are in flight; a barrier after the frequency
// table and one after the cos/sin rows, then every head reads its pairs' cos/sin from shared
// memory.
//
// Both kernels apply the same functions to the same values in the same order (a head's squares
// added in the same order, the same sincosf of the same fp32 angle); the tests compare their bits.
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, SymbolicSize, SymbolicDevice, kAnySize, data_ptr, verify_no_*_overlap
#include <sgl_kernel/utils.h>  // For RuntimeCheck, div_ceil

#include <sgl_kernel/utils.cuh>  // For LaunchKernel, SGL_DEVICE, kWarpThreads, pdl_wait_primary
#include <sgl_kernel/vec.cuh>    // For AlignedVector

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include "rope.cuh"  // For rotate_pairs_fp32, rope_to_floats, rope_from_floats, load_index, RopeAccess, RopeConfig, rope_vector_elements, rope_resolve_pdl

namespace {

/// Launch facts of the fused_qk_norm_rope kernels.
struct QKNormRopeConfig {
  static constexpr uint32_t kMaxThreads = 512;
  // CTAs of kMaxThreads per SM the registers must allow, by units per lane: one unit fits 64
  // registers; two (head_dim 256 at 16-byte vectors) spill 100-140 bytes at 64, so they get 128.
  static constexpr uint32_t min_blocks(int units) { return units == 1 ? 2 : 1; }
  static constexpr int64_t kTargetThreads = 256;              // tokens packed into a CTA up to this many threads
  static constexpr int64_t kLargeThreads = int64_t{1} << 16;  // threads (one per head) from which a launch is "large"
  static constexpr int64_t kMaxLanes = 32;                    // lanes per head (one warp)
  static constexpr int kBatch = 2;                            // heads whose loads a thread issues together
  static constexpr int64_t kLargeHeadsPerGroup = 4;           // heads per group at large sizes
  static constexpr int64_t kMaxSmemBytes = 48 * 1024;         // dynamic shared memory without an opt-in
  // fused_qk_norm_rope_table_kernel: table entries per thread whose frequencies are formed
  // before the PDL wait (R/2 <= 2 * blockDim.x pairs: all of them), and warps per CTA (fewer when
  // the token has fewer heads)
  static constexpr int kTablePairsBeforeWait = 2;
  static constexpr int64_t kTableWarps = 4;
};

/// Kernel arguments of the fused_qk_norm_rope kernels.
struct QKNormRopeParams {
  void* qkv;             // [num_tokens, row], head h of token t at t * token_stride + h * head_dim
  int64_t token_stride;  // elements
  int64_t num_tokens;
  int64_t num_q_heads;
  int64_t num_heads;  // num_q_heads + num_k_heads (v is never touched)
  int64_t head_dim;
  int64_t half;             // R / 2
  int64_t num_units;        // pair chunks + rest units per head
  int32_t lanes;            // G: lanes per head (power of two <= 32)
  int32_t heads_per_group;  // fused_qk_norm_rope_kernel: heads of one group (q and k groups apart)
  int32_t num_q_groups;     // fused_qk_norm_rope_kernel: ceil(num_q_heads / heads_per_group); k groups follow
  const void* q_weight;     // [head_dim]
  const void* k_weight;     // [head_dim]
  const void* positions;    // [num_tokens] int32 / int64
  bool positions_int64;
  float eps;
  float inv_dim;  // 1 / head_dim (fp32)
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

/// (cos, sin) of `angle` times p.attention_factor, the entries of a cos/sin row (sincosf);
/// fused_qk_norm_rope_kernel's rows inline the same code (a call there changes its register
/// allocation).
SGL_DEVICE void scaled_sincos(const QKNormRopeParams& p, float angle, float& c, float& s) {
  float sv, cv;
  sincosf(angle, &sv, &cv);
  const float scaled_c = cv * p.attention_factor, scaled_s = sv * p.attention_factor;  // before c may alias p
  c = scaled_c;
  s = scaled_s;
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

/// group_sum of kN values at once (their shuffles interleave).
template <int kN>
SGL_DEVICE void group_sums(float (&value)[kN], int32_t lanes) {
  uint32_t lane;
  asm("mov.u32 %0, %%laneid;" : "=r"(lane));
  const uint32_t group_mask = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u) << (lane & ~(lanes - 1u));
  for (int32_t m = lanes / 2; m > 0; m /= 2) {
#pragma unroll
    for (int i = 0; i < kN; ++i) value[i] += __shfl_xor_sync(group_mask, value[i], m, device::kWarpThreads);
  }
}

/// out = the N floats at `ptr` (shared memory, aligned to 16 bytes when N % 4 == 0). Volatile: the
/// loads stay where the code has them (inside the head loop), so the cos/sin values are not hoisted
/// into 2 * kVecN registers kept across every head (at 64 registers that spills).
template <int N>
SGL_DEVICE void load_shared_floats(const float* ptr, float (&out)[N]) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                   : "=f"(out[i]), "=f"(out[i + 1]), "=f"(out[i + 2]), "=f"(out[i + 3])
                   : "r"(addr + 4 * i));
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("ld.shared.f32 %0, [%1];" : "=f"(out[i]) : "r"(addr + 4 * i));
  }
}

/// v, through an empty asm per 32-bit word: the compiler cannot hoist what is computed from the
/// result out of a loop. Used on the weight inside the head loop: hoisted, its fp32 conversion is
/// 2 * kVecN registers live across every head (which spills at 64 registers); packed, half that.
template <typename T, std::size_t N>
SGL_DEVICE device::AlignedVector<T, N> opaque(device::AlignedVector<T, N> v) {
  if constexpr (sizeof(v) % 4 == 0) {
    uint32_t words[sizeof(v) / 4];
    memcpy(words, &v, sizeof(v));
#pragma unroll
    for (std::size_t i = 0; i < sizeof(v) / 4; ++i) asm volatile("" : "+r"(words[i]));
    memcpy(&v, words, sizeof(v));
  }
  return v;
}

/// Where unit `unit` of a head lies and what it holds (the file comment's layout): element offsets
/// (off_a, off_b) of its two vectors within the head; `rotated`: a pair chunk (unit < R / (2 kVecN)),
/// else two vectors of the unrotated rest [R, D), the second of which may fall past head_dim
/// (b_valid false); `valid`: unit < num_units.
template <int kVecN, bool kNeox>
SGL_DEVICE void qk_norm_rope_unit(
    const QKNormRopeParams& p,
    int32_t unit,
    int32_t& off_a,
    int32_t& off_b,
    bool& valid,
    bool& b_valid,
    bool& rotated) {
  // Offsets within a head fit 32 bits (head_dim < 2^31 / 2: the launcher's unit bound).
  const int32_t half = static_cast<int32_t>(p.half);
  const int32_t num_chunks = half / kVecN;
  valid = unit < p.num_units;
  rotated = unit < num_chunks;
  if (rotated) {
    off_a = kNeox ? unit * kVecN : unit * 2 * kVecN;
    off_b = kNeox ? half + unit * kVecN : off_a + kVecN;
  } else {
    off_a = 2 * half + (unit - num_chunks) * 2 * kVecN;
    off_b = off_a + kVecN;
  }
  b_valid = valid && off_b < p.head_dim;
}

/// sum + the squares of a unit's 2 kVecN elements, added in element order (x[j]^2 + y[j]^2 per
/// step): every kernel adds a head's squares in this order, so their rstd are the same bits.
template <typename T, int kVecN>
SGL_DEVICE float add_unit_squares(
    float sum, const device::AlignedVector<T, kVecN>& a, const device::AlignedVector<T, kVecN>& b) {
  float x[kVecN], y[kVecN];
  rope_to_floats<T, kVecN>(a, x);
  rope_to_floats<T, kVecN>(b, y);
#pragma unroll
  for (int j = 0; j < kVecN; ++j) sum += x[j] * x[j] + y[j] * y[j];
  return sum;
}

/// One unit after the reduction, in place in (a, b): z = x * rstd * w in fp32, then its pairs rotated
/// by (c, s) when `rotated` (else z only), rounded once to T. w: the unit's weight vectors (wa, wb).
template <typename T, int kVecN, bool kNeox>
SGL_DEVICE void norm_rotate_unit(
    device::AlignedVector<T, kVecN>& a,
    device::AlignedVector<T, kVecN>& b,
    const device::AlignedVector<T, kVecN>& wa,
    const device::AlignedVector<T, kVecN>& wb,
    float rstd,
    const float (&c)[kVecN],
    const float (&s)[kVecN],
    bool rotated) {
  float za[kVecN], zb[kVecN], fa[kVecN], fb[kVecN];
  rope_to_floats<T, kVecN>(a, za);
  rope_to_floats<T, kVecN>(b, zb);
  rope_to_floats<T, kVecN>(wa, fa);
  rope_to_floats<T, kVecN>(wb, fb);
#pragma unroll
  for (int j = 0; j < kVecN; ++j) {
    za[j] = za[j] * rstd * fa[j];
    zb[j] = zb[j] * rstd * fb[j];
  }
  if (rotated) {
    rotate_pairs_fp32<T, kVecN, kNeox>(za, zb, c, s, a, b);
  } else {
    rope_from_floats<T, kVecN>(za, a);
    rope_from_floats<T, kVecN>(zb, b);
  }
}

/// ptr (global memory), through an empty asm: the front end computes it where the call stands, before
/// the PDL wait's asm, instead of sinking the address arithmetic below the wait (ptxas may still move
/// it; in the SASS of fused_qk_norm_rope_table_kernel it stays above). The assumption keeps the
/// accesses global (LDG / STG, not generic LD / ST).
template <typename P>
SGL_DEVICE P* pinned(P* ptr) {
  asm volatile("" : "+l"(ptr));
  __builtin_assume(__isGlobal(ptr));
  return ptr;
}

/// Dynamic shared memory of fused_qk_norm_rope_kernel: the frequency table [R/2] and, per token of
/// the CTA, its cos and sin rows [tokens][2][R/2] (times attention_factor).
inline int64_t qk_norm_rope_smem_bytes(int64_t half, int64_t tokens) {
  return (half + tokens * 2 * half) * static_cast<int64_t>(sizeof(float));
}

/// The grouped kernel, fused_qk_norm_rope_kernel (see the file comment). Thread (x, y, z): units x,
/// x + G of the heads of group y of token blockIdx.x * blockDim.z + z. Preconditions (the launcher's): dynamic shared
/// memory of qk_norm_rope_smem_bytes(half, blockDim.z); qkv rows, head_dim, R/2 and the weights
/// aligned to kVecN elements; heads_per_group >= 1.
template <typename T, int kVecN, bool kNeox, int kUnits, bool kL2Hint>
__global__ void __launch_bounds__(QKNormRopeConfig::kMaxThreads, QKNormRopeConfig::min_blocks(kUnits))
    fused_qk_norm_rope_kernel(const QKNormRopeParams p) {
  using vec_t = device::AlignedVector<T, kVecN>;
  constexpr int kBatch = QKNormRopeConfig::kBatch;
  extern __shared__ float qk_norm_rope_smem[];
  float* freq_table = qk_norm_rope_smem;                                   // [R/2]
  float* cos_sin = qk_norm_rope_smem + p.half + threadIdx.z * 2 * p.half;  // [2][R/2] of this token

  // Parameters only before the PDL wait: the CTA's frequency table, this thread's offsets and heads.
  const uint32_t token_threads = blockDim.x * blockDim.y;
  const uint32_t token_tid = threadIdx.y * blockDim.x + threadIdx.x;
  const uint32_t tid = threadIdx.z * token_threads + token_tid;
  for (int64_t i = tid; i < p.half; i += token_threads * blockDim.z) freq_table[i] = rope_frequency(p, i);

  // Offsets within a head fit 32 bits (head_dim < 2^31 / 2: the launcher's unit bound).
  const int32_t half = static_cast<int32_t>(p.half);
  const int32_t num_chunks = half / kVecN;
  const int64_t token = int64_t{blockIdx.x} * blockDim.z + threadIdx.z;
  int32_t off_a[kUnits], off_b[kUnits];
  bool unit_valid[kUnits], b_valid[kUnits], rotated[kUnits];
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    const int32_t unit = static_cast<int32_t>(threadIdx.x) + u * p.lanes;
    unit_valid[u] = unit < p.num_units;
    rotated[u] = unit < num_chunks;
    if (rotated[u]) {
      off_a[u] = kNeox ? unit * kVecN : unit * 2 * kVecN;
      off_b[u] = kNeox ? half + unit * kVecN : off_a[u] + kVecN;
    } else {
      off_a[u] = 2 * half + (unit - num_chunks) * 2 * kVecN;
      off_b[u] = off_a[u] + kVecN;
    }
    b_valid[u] = unit_valid[u] && off_b[u] < p.head_dim;
  }
  // Group y: q heads [y * hpg, ...) or, past the q groups, k heads; never both (one weight).
  const int64_t group = threadIdx.y;
  const bool is_q = group < p.num_q_groups;
  const int64_t first_head =
      is_q ? group * p.heads_per_group : p.num_q_heads + (group - p.num_q_groups) * p.heads_per_group;
  const int64_t end_head = std::min<int64_t>(first_head + p.heads_per_group, is_q ? p.num_q_heads : p.num_heads);
  const int32_t num_group_heads = static_cast<int32_t>(std::max<int64_t>(end_head - first_head, 0));
  const bool token_valid = token < p.num_tokens;
  const bool active = token_valid && num_group_heads > 0;
  T* head_ptr = static_cast<T*>(p.qkv) + token * p.token_stride + first_head * p.head_dim;  // the batch's first head
  const T* w = static_cast<const T*>(is_q ? p.q_weight : p.k_weight);
  const RopeAccess<kL2Hint> access = RopeAccess<kL2Hint>::make();
  __syncthreads();  // the frequency table

  device::pdl_wait_primary();
  device::pdl_launch_dependents();

  vec_t a[kBatch][kUnits], b[kBatch][kUnits];
  const auto load_batch = [&](int32_t left) {  // left: heads of the group from head_ptr on
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const T* ptr = head_ptr + i * p.head_dim;
#pragma unroll
      for (int u = 0; u < kUnits; ++u) {
        a[i][u].fill(static_cast<T>(0.0f));
        b[i][u].fill(static_cast<T>(0.0f));
        if (active && i < left) {
          if (unit_valid[u]) access.load(a[i][u], ptr + off_a[u]);
          if (b_valid[u]) access.load(b[i][u], ptr + off_b[u]);
        }
      }
    }
  };
  // The first batch and the weight are in flight while the token's threads compute its cos/sin rows.
  load_batch(num_group_heads);
  vec_t wa[kUnits], wb[kUnits];
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    wa[u].fill(static_cast<T>(0.0f));
    wb[u].fill(static_cast<T>(0.0f));
    if (active && unit_valid[u]) wa[u].load(w + off_a[u]);
    if (active && b_valid[u]) wb[u].load(w + off_b[u]);
  }
  if (token_valid) {
    const float pos = static_cast<float>(load_index(p.positions, p.positions_int64, token));
    for (int32_t i = static_cast<int32_t>(token_tid); i < half; i += static_cast<int32_t>(token_threads)) {
      const float angle = pos * freq_table[i];
      float sv, cv;
      sincosf(angle, &sv, &cv);
      cos_sin[i] = cv * p.attention_factor;
      cos_sin[half + i] = sv * p.attention_factor;
    }
  }
  __syncthreads();  // the cos/sin rows
  if (!active) return;

  for (int32_t left = num_group_heads;;) {
    float sum[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      sum[i] = 0.0f;
#pragma unroll
      for (int u = 0; u < kUnits; ++u) sum[i] = add_unit_squares<T, kVecN>(sum[i], a[i][u], b[i][u]);
    }
    group_sums<kBatch>(sum, p.lanes);
    float rstd[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) rstd[i] = rsqrtf(sum[i] * p.inv_dim + p.eps);
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      if (!unit_valid[u]) continue;
      float cf[kVecN], sf[kVecN];
      if (rotated[u]) {
        const int32_t pair0 = (static_cast<int32_t>(threadIdx.x) + u * p.lanes) * kVecN;
        load_shared_floats<kVecN>(cos_sin + pair0, cf);
        load_shared_floats<kVecN>(cos_sin + half + pair0, sf);
      }
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        if (i >= left) continue;
        T* ptr = head_ptr + i * p.head_dim;
        norm_rotate_unit<T, kVecN, kNeox>(a[i][u], b[i][u], opaque(wa[u]), opaque(wb[u]), rstd[i], cf, sf, rotated[u]);
        access.store(a[i][u], ptr + off_a[u]);
        if (b_valid[u]) access.store(b[i][u], ptr + off_b[u]);
      }
    }
    left -= kBatch;
    if (left <= 0) break;
    head_ptr += kBatch * p.head_dim;
    load_batch(left);
  }
}

/// Dynamic shared memory of fused_qk_norm_rope_table_kernel: the cos and sin rows of the
/// CTA's token [2][R/2] (times attention_factor).
inline int64_t qk_norm_rope_table_smem_bytes(int64_t half) { return 2 * half * static_cast<int64_t>(sizeof(float)); }

/// The small-size kernel (see the file comment): fused_qk_norm_rope_kernel's math and lane layout
/// (unit x of a head on lane x of a G-lane group, a head's squares added in the same order: the same
/// bits) with one head per lane group. The CTA computes its token's cos/sin table (entry i by thread
/// i % blockDim.x; the same functions of the same fp32 values as fused_qk_norm_rope_kernel's rows)
/// into shared memory, then __syncthreads; every thread reaches the barrier (a warp without heads
/// too: no return before it). No frequency table, no loop over heads. The addresses, unit offsets
/// and the thread's first kTablePairsBeforeWait frequencies are formed before the PDL wait, so the loads
/// are the first instructions after it. In the SASS the thread's table entries and then the sum of
/// squares run one after the other, not interleaved (sincosf's slow-path branch ends ptxas's
/// scheduling region).
/// Block (32 * W) x (blocks per token, tokens): warp w of block (bx, token) holds heads
/// (bx * W + w) * (32 / G) + lane / G. Preconditions (the launcher's): blockDim.x a multiple of 32,
/// units <= G (one unit per lane), dynamic shared memory of qk_norm_rope_table_smem_bytes(half),
/// fused_qk_norm_rope_kernel's alignment. A small-size kernel: registers are not capped for
/// occupancy.
template <typename T, int kVecN, bool kNeox, bool kL2Hint>
__global__ void __launch_bounds__(QKNormRopeConfig::kMaxThreads, 1)
    fused_qk_norm_rope_table_kernel(const QKNormRopeParams p) {
  using vec_t = device::AlignedVector<T, kVecN>;
  constexpr int kTablePairs = QKNormRopeConfig::kTablePairsBeforeWait;
  constexpr int32_t kWarp = static_cast<int32_t>(device::kWarpThreads);
  extern __shared__ float qk_norm_rope_smem[];
  const int32_t lane = static_cast<int32_t>(threadIdx.x) % kWarp;
  const int32_t warp = static_cast<int32_t>(threadIdx.x) / kWarp;
  const int32_t half = static_cast<int32_t>(p.half);
  // The CTA's table (its token's rows)
  float* const cos_row = qk_norm_rope_smem;  // [R/2]
  float* const sin_row = cos_row + half;     // [R/2]
  // This thread's first table entry and the stride over the entries
  const int32_t entry = static_cast<int32_t>(threadIdx.x);
  const int32_t entry_step = static_cast<int32_t>(blockDim.x);

  // Parameters only before the PDL wait: the lane's head and unit, its addresses, its table
  // entries' frequencies.
  const int64_t warp_head =
      (int64_t{blockIdx.x} * (blockDim.x / device::kWarpThreads) + warp) * (kWarp / p.lanes);  // its first head
  const int64_t head = warp_head + lane / p.lanes;
  const int64_t token = blockIdx.y;
  const int32_t unit = lane % p.lanes;
  int32_t off_a, off_b;
  bool unit_valid, b_valid, rotated;
  qk_norm_rope_unit<kVecN, kNeox>(p, unit, off_a, off_b, unit_valid, b_valid, rotated);
  const bool head_valid = head < p.num_heads;
  T* const ptr = static_cast<T*>(p.qkv) + token * p.token_stride + (head_valid ? head : 0) * p.head_dim;
  const T* const w = static_cast<const T*>(head < p.num_q_heads ? p.q_weight : p.k_weight);
  T* const ptr_a = pinned(ptr + off_a);
  T* const ptr_b = pinned(ptr + off_b);
  const T* const w_a = pinned(w + off_a);
  const T* const w_b = pinned(w + off_b);
  const void* const pos_ptr = pinned(
      p.positions_int64 ? static_cast<const void*>(static_cast<const int64_t*>(p.positions) + token)
                        : static_cast<const void*>(static_cast<const int32_t*>(p.positions) + token));
  float freq[kTablePairs];
#pragma unroll
  for (int t = 0; t < kTablePairs; ++t) {
    const int32_t i = entry + t * entry_step;
    freq[t] = i < half ? rope_frequency(p, i) : 0.0f;
  }
  const RopeAccess<kL2Hint> access = RopeAccess<kL2Hint>::make();

  device::pdl_wait_primary();
  device::pdl_launch_dependents();

  const float pos = static_cast<float>(load_index(pos_ptr, p.positions_int64, 0));
  vec_t a, b, wa, wb;
  a.fill(static_cast<T>(0.0f));
  b.fill(static_cast<T>(0.0f));
  wa.fill(static_cast<T>(0.0f));
  wb.fill(static_cast<T>(0.0f));
  if (head_valid && unit_valid) {
    access.load(a, ptr_a);
    wa.load(w_a);
  }
  if (head_valid && b_valid) {
    access.load(b, ptr_b);
    wb.load(w_b);
  }

  // The CTA's cos/sin rows, by every thread (heads past num_heads too: the whole CTA reads them).
#pragma unroll
  for (int t = 0; t < kTablePairs; ++t) {
    const int32_t i = entry + t * entry_step;
    if (i < half) scaled_sincos(p, pos * freq[t], cos_row[i], sin_row[i]);
  }
  for (int32_t i = entry + kTablePairs * entry_step; i < half; i += entry_step) {
    scaled_sincos(p, pos * rope_frequency(p, i), cos_row[i], sin_row[i]);
  }
  __syncthreads();
  if (!head_valid) return;

  const float rstd = rsqrtf(group_sum(add_unit_squares<T, kVecN>(0.0f, a, b), p.lanes) * p.inv_dim + p.eps);
  if (!unit_valid) return;
  float cf[kVecN], sf[kVecN];
  if (rotated) {
    load_shared_floats<kVecN>(cos_row + unit * kVecN, cf);
    load_shared_floats<kVecN>(sin_row + unit * kVecN, sf);
  } else {
#pragma unroll
    for (int j = 0; j < kVecN; ++j) {
      cf[j] = 1.0f;
      sf[j] = 0.0f;
    }
  }
  norm_rotate_unit<T, kVecN, kNeox>(a, b, wa, wb, rstd, cf, sf, rotated);
  access.store(a, ptr_a);
  if (b_valid) access.store(b, ptr_b);
}

/// Launches a fused_qk_norm_rope kernel with kVecN (kMaxVecN, or 1 when the layout is not aligned to
/// it) and one or two units per lane (the file comment's rule).
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

  // Groups: kBatch heads (all in flight) at small sizes, kLargeHeadsPerGroup (trig shared) at large
  // ones, doubled until the groups of one token fit a CTA; q and k groups apart.
  const int64_t num_k_heads = p.num_heads - p.num_q_heads;
  int64_t hpg = large ? QKNormRopeConfig::kLargeHeadsPerGroup : QKNormRopeConfig::kBatch;
  const auto groups_of = [&](int64_t h) { return div_ceil(p.num_q_heads, h) + div_ceil(num_k_heads, h); };
  while (lanes * groups_of(hpg) > QKNormRopeConfig::kMaxThreads) hpg *= 2;
  p.heads_per_group = static_cast<int32_t>(hpg);
  p.num_q_groups = static_cast<int32_t>(div_ceil(p.num_q_heads, hpg));
  const int64_t groups = groups_of(hpg);
  // blockDim.z is at most 64 (a CUDA limit); the cos/sin rows of the CTA's tokens stay within
  // kMaxSmemBytes (R/2 <= 512 pairs: at least 11 tokens)
  const int64_t smem_tokens =
      (QKNormRopeConfig::kMaxSmemBytes / static_cast<int64_t>(sizeof(float)) - p.half) / (2 * p.half);
  const int64_t tokens = std::clamp<int64_t>(
      QKNormRopeConfig::kTargetThreads / (lanes * groups),
      1,
      std::clamp<int64_t>(std::min(p.num_tokens, smem_tokens), 1, 64));
  const int64_t smem_bytes = qk_norm_rope_smem_bytes(p.half, tokens);
  RuntimeCheck(
      smem_bytes <= QKNormRopeConfig::kMaxSmemBytes, "fused_qk_norm_rope: rotary_dim ", 2 * p.half, " too large");
  const dim3 block(static_cast<uint32_t>(lanes), static_cast<uint32_t>(groups), static_cast<uint32_t>(tokens));
  const int64_t grid = div_ceil(p.num_tokens, tokens);
  RuntimeCheck(
      grid < (int64_t{1} << 31), "fused_qk_norm_rope: num_tokens too large for one launch, got ", p.num_tokens);
  constexpr bool kFull = kVecN * sizeof(T) == 16;
  const bool l2_hint = kFull && 2 * p.num_tokens * p.num_heads * p.head_dim * static_cast<int64_t>(sizeof(T)) >=
                                    RopeConfig::kL2HintMinBytes;
  const auto launch = [&](auto kernel) {
    LaunchKernel(static_cast<uint32_t>(grid), block, device, static_cast<std::size_t>(smem_bytes))
        .enable_pdl(pdl)(kernel, p);
  };
  if constexpr (kFull) {
    if (units <= lanes && !large) {
      // W warps of 32 / G heads of one token per CTA (fewer when the token has fewer); T < 2^16
      // here (below kLargeThreads), within grid.y's limit
      const int64_t warps_per_token = div_ceil(p.num_heads, static_cast<int64_t>(device::kWarpThreads) / lanes);
      const int64_t warps = std::min<int64_t>(
          {QKNormRopeConfig::kTableWarps, warps_per_token, QKNormRopeConfig::kMaxThreads / device::kWarpThreads});
      const dim3 table_grid(
          static_cast<uint32_t>(div_ceil(warps_per_token, warps)), static_cast<uint32_t>(p.num_tokens));
      const dim3 table_block(static_cast<uint32_t>(warps * device::kWarpThreads));
      // R/2 <= 32 kVecN pairs (one unit per lane): at most 2 KiB (< kMaxSmemBytes)
      const auto table_smem = static_cast<std::size_t>(qk_norm_rope_table_smem_bytes(p.half));
      const auto launch_table = [&](auto kernel) {
        LaunchKernel(table_grid, table_block, device, table_smem).enable_pdl(pdl)(kernel, p);
      };
      if (l2_hint) {
        launch_table(fused_qk_norm_rope_table_kernel<T, kVecN, kNeox, true>);
      } else {
        launch_table(fused_qk_norm_rope_table_kernel<T, kVecN, kNeox, false>);
      }
      return;
    }
  }
  if (units <= lanes) {
    if (l2_hint) {
      launch(fused_qk_norm_rope_kernel<T, kVecN, kNeox, 1, kFull>);
    } else {
      launch(fused_qk_norm_rope_kernel<T, kVecN, kNeox, 1, false>);
    }
  } else {
    if (l2_hint) {
      launch(fused_qk_norm_rope_kernel<T, kVecN, kNeox, 2, kFull>);
    } else {
      launch(fused_qk_norm_rope_kernel<T, kVecN, kNeox, 2, false>);
    }
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
  verify_no_self_overlap(qkv, "qkv");  // tokens of their own (a token stride of 0 or below the row races)

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
  p.inv_dim = 1.0f / static_cast<float>(head_dim);
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
