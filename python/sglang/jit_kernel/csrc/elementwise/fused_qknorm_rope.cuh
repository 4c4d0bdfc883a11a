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
// + 2 * D * sizeof(T) (weights) + N * sizeof(position). At the Qwen3 shape (40 heads x 128 bf16) that
// is 20 KiB a token, 335 MB at 16384 tokens: 79.5 us at the 4.22 TB/s copy roof. Work per element
// the roof allows: ~32 thread instructions (128 FP32 lanes per SM, 4 elements per SM cycle).
//
// Layout. A head's D elements are "units" of two vectors of kVecN elements: the R/(2 kVecN) pair
// chunks of rope.cuh first, then the unrotated rest [R, D) two vectors at a time. G lanes (a power
// of two <= 32, aligned in the warp) share a head, lane l holding units l and l + G (kUnits); the
// sum of squares is reduced by shuffles within the G lanes.
//
// fused_qk_norm_rope_kernel (the default at large sizes, and wherever the table kernel below does
// not apply; QKNormRopeVariant::kTokenCta at every size). The heads of a token are split into "groups" of up to
// heads_per_group consecutive heads, q and k groups apart (a group never mixes the two weights, so a
// thread loads one weight once). The block is (G lanes, groups, tokens); a thread walks its group's
// heads kBatch at a time, all of a batch's loads issued before any is used: groups of kBatch heads at
// small sizes (every head in flight at once: latency), kLargeHeadsPerGroup at large ones. The trig
// is computed once per (token, pair) by the token's threads together, into shared memory: the
// frequency table [R/2] once per CTA before the PDL wait (parameters only), the cos/sin rows after
// it, while the first batch's data and the weight are in flight; one barrier, then every head reads
// its pairs' cos/sin from shared memory. The legacy kernel instead computed 8 powf and 8 sincosf per
// thread (~640 instructions, shared by <= 4 heads: ~40 % of the issue slots the roof allows at the
// Qwen3 shape), loaded the weight only after the reduction (a second memory latency per head) and a
// token's data only after its trig.
//
// Trig: sincosf (the reference's cosf/sinf of the same fp32 angle pos * f_i, ~1 ulp) by default; the
// cooperative table makes it ~40 instructions per (token, pair), < 1 per element. QKNormRopeVariant::
// kFastTrig selects sincos_reduced (Cody-Waite to [-pi, pi], then __sincosf: ~10 instructions, abs
// error ~5e-7 for |angle| < 2^20; the tests' bound is |y| * pos * 2^-23, ~1000x looser) to time
// whether the trig latency shows at one token.
//
// fused_qk_norm_rope_warp_table_kernel (the default below the large-size switch with 16-byte vectors
// and one unit per lane, as kWarpTable | kCtaTable with kDefaultTableWarps warps; kWarpTable alone
// is a table per warp): fused_qk_norm_rope_kernel's lane layout and math with one head per lane
// group. At one token that kernel's chain after the PDL wait is long: its position load issues after the data
// loads, then the trig, the cos/sin rows' barrier, the sum of squares, the shuffles and rsqrt follow
// one another; a thread rotates two heads one after the other (the second behind a spill reload); one
// CTA of 160 threads does all of it. Here every warp computes its token's table itself (2 sincosf a
// lane at R = 128), __syncwarp instead of the barrier, one head per thread, CTAs of a few warps
// spread over the SMs, the position load first. QKNormRopeVariant::kCtaTable (in the default): one
// table per CTA instead (one entry per thread at R = 128 and 2 warps), then a CTA barrier. The
// same functions of the same values in every kernel: the same bits (test_bit_identical_*).
//
// fused_qk_norm_rope_legacy_kernel (QKNormRopeVariant::kLegacy): the previous kernel, kept so that the
// benchmark can time old and new in one run; remove once the new one is validated on the H200.
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

#include "rope.cuh"  // For rotate_pairs, chunk_offsets, load_index, RopeAccess, rope_vector_elements, rope_resolve_pdl

namespace {

/// Launch facts of the fused_qk_norm_rope kernels.
struct QKNormRopeConfig {
  static constexpr uint32_t kMaxThreads = 512;
  // CTAs of kMaxThreads per SM the registers must allow, by units per lane: one unit fits 64
  // registers; two (head_dim 256 at 16-byte vectors) spill 100-140 bytes at 64, so they get 128.
  static constexpr uint32_t min_blocks(int units) { return units == 1 ? 2 : 1; }
  static constexpr int64_t kTargetThreads = 256;              // tokens packed into a CTA up to this many threads
  static constexpr int64_t kHeadPasses = 4;                   // legacy kernel: heads per thread at large sizes
  static constexpr int64_t kLargeThreads = int64_t{1} << 16;  // threads (one per head) from which a launch is "large"
  static constexpr int64_t kMaxLanes = 32;                    // lanes per head (one warp)
  static constexpr int kBatch = 2;                            // heads whose loads a thread issues together
  static constexpr int64_t kLargeHeadsPerGroup = 4;           // heads per group at large sizes
  static constexpr int64_t kMaxSmemBytes = 48 * 1024;         // dynamic shared memory without an opt-in
  // fused_qk_norm_rope_warp_table_kernel: table entries per lane whose frequencies are formed before
  // the PDL wait (R/2 <= 64 pairs: all of them), warps per CTA unless the variant's bits 8-15 say
  static constexpr int kWarpTablePairs = 2;
  static constexpr int64_t kWarpTableWarps = 2;
  // The default below the large-size switch (where the table kernel applies): one cos/sin table per
  // CTA of this many warps (the variant 0x418's kernel)
  static constexpr int64_t kDefaultTableWarps = 4;
};

/// Variant bits of fused_qk_norm_rope (the benchmark's switches; 0 is the default kernel).
struct QKNormRopeVariant {
  static constexpr int64_t kFastTrig = 1;  // the reduced __sincosf (sincos_reduced) instead of sincosf
  static constexpr int64_t kLegacy = 2;    // the previous kernel (one thread per head, powf per thread)
  // cos/sin of each lane's own pairs in registers (frequencies before the PDL wait, the trig as
  // soon as the position arrives): no shared-memory rows and no barrier after the wait. Applies
  // with one unit per lane below the L2-hint size (T = 1 here); the default kernel otherwise.
  static constexpr int64_t kRegTrig = 4;
  // fused_qk_norm_rope_warp_table_kernel: one head per lane group, each warp its own token's cos/sin
  // table (no CTA barrier). Applies with 16-byte vectors and one unit per lane below the large-size
  // switch (kLargeThreads: 204 tokens at the Qwen3 shape); the default kernel otherwise. Bits 8-15
  // are then the warps per CTA (0: kWarpTableWarps).
  static constexpr int64_t kWarpTable = 8;
  // With kWarpTable: one cos/sin table per CTA instead of one per warp, its entries spread over all
  // of the CTA's threads (R/2 = 64 pairs, 2 warps: one sincosf a thread instead of two), then
  // __syncthreads instead of __syncwarp; the same functions of the same values, so the same bits.
  // Why: at one token every warp of kWarpTable computes the same table, and the trig is on the
  // critical path. H200 standalone harness (.gpu/qkh, Qwen3 32 + 8 + 8 heads x 128 bf16, 1 / 64
  // tokens): default 1.68 / 1.73 us, kWarpTable 1.33 / 1.62, this with 2 warps per CTA (0x218)
  // 1.13 / 1.38, timed before the fix of a warp without heads returning ahead of the barrier (only
  // CTAs with idle warps). Through the op (bench_rope, 2026-12-02, cold / one input): 1 token 1.19 /
  // 1.20 with 4 warps (0x418) against the per-token CTA kernel's 1.68 / 1.67; 64 tokens 1.84 / 1.40
  // against 2.25 / 1.74: the default since (kDefaultTableWarps), where it applies.
  static constexpr int64_t kCtaTable = 16;
  // The per-token CTA kernel (fused_qk_norm_rope_kernel) at every size: the default below the
  // large-size switch before kCtaTable took it (kept so that the benchmark times old and new)
  static constexpr int64_t kTokenCta = 32;
  static constexpr int64_t kHeadsShift = 8;  // bits [8, 16): heads per group override (0: automatic)
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
  int32_t heads_per_group;  // default kernel: heads of one group (q and k groups apart)
  int32_t num_q_groups;     // default kernel: ceil(num_q_heads / heads_per_group); k groups follow
  bool fast_trig;           // default kernel: the reduced __sincosf instead of sincosf
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

/// sin and cos of `x`: x reduced to r = x - k * 2pi in [-pi, pi] (k = rint(x / 2pi); 2pi = hi + lo
/// with hi = fp32(2pi), two FMAs), then __sincosf(r) (MUFU; abs error <= 2^-21.41 on [-pi, pi]).
/// Abs error ~5e-7 for |x| < 2^20; beyond, k loses bits and the error grows like |x| * 2^-24 (the
/// fp32 angle itself is that coarse there).
SGL_DEVICE void sincos_reduced(float x, float& s, float& c) {
  constexpr float kInvTwoPi = 0.159154936671257019f;    // fp32(1 / 2pi)
  constexpr float kTwoPiHi = 6.28318548202514648f;      // fp32(2pi), above 2pi
  constexpr float kTwoPiLo = -1.74845553146951720e-7f;  // 2pi - kTwoPiHi
  const float k = rintf(x * kInvTwoPi);
  float r = fmaf(-k, kTwoPiHi, x);
  r = fmaf(-k, kTwoPiLo, r);
  __sincosf(r, &s, &c);
}

/// (cos, sin) of `angle` times p.attention_factor, the entries of a cos/sin row: sincosf, or
/// sincos_reduced when p.fast_trig; the default kernel's rows inline the same code (a call there
/// changes its register allocation).
SGL_DEVICE void scaled_sincos(const QKNormRopeParams& p, float angle, float& c, float& s) {
  float sv, cv;
  if (p.fast_trig) {
    sincos_reduced(angle, sv, cv);
  } else {
    sincosf(angle, &sv, &cv);
  }
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
/// into 2 * kVecN registers kept across every head (at 64 registers that spilled 90-130 bytes).
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
/// 2 * kVecN registers live across every head (spilled 88 bytes at 64 registers); packed, half that.
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
/// it; in the SASS of fused_qk_norm_rope_warp_table_kernel it stays above). The assumption keeps the
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

/// The default kernel (see the file comment). Thread (x, y, z): units x, x + G of the heads of group
/// y of token blockIdx.x * blockDim.z + z. Preconditions (the launcher's): dynamic shared memory of
/// qk_norm_rope_smem_bytes(half, blockDim.z); qkv rows, head_dim, R/2 and the weights aligned to
/// kVecN elements; heads_per_group >= 1.
/// kRegTrig (QKNormRopeVariant::kRegTrig, opt-in; kUnits == 1): the cos/sin of the lane's kVecN
/// pairs in registers instead of the shared rows (same functions of the same fp32 values: bit for
/// bit the default's results); the frequency table and both barriers are skipped.
/// It is a one-token variant: registers are not capped for occupancy (min blocks 1: 128 registers).
template <typename T, int kVecN, bool kNeox, int kUnits, bool kL2Hint, bool kRegTrig = false>
__global__ void __launch_bounds__(QKNormRopeConfig::kMaxThreads, kRegTrig ? 1 : QKNormRopeConfig::min_blocks(kUnits))
    fused_qk_norm_rope_kernel(const QKNormRopeParams p) {
  static_assert(!kRegTrig || kUnits == 1, "kRegTrig: one unit per lane");
  using vec_t = device::AlignedVector<T, kVecN>;
  constexpr int kBatch = QKNormRopeConfig::kBatch;
  extern __shared__ float qk_norm_rope_smem[];
  float* freq_table = qk_norm_rope_smem;                                   // [R/2]
  float* cos_sin = qk_norm_rope_smem + p.half + threadIdx.z * 2 * p.half;  // [2][R/2] of this token

  // Parameters only before the PDL wait: the CTA's frequency table, this thread's offsets and heads.
  const uint32_t token_threads = blockDim.x * blockDim.y;
  const uint32_t token_tid = threadIdx.y * blockDim.x + threadIdx.x;
  const uint32_t tid = threadIdx.z * token_threads + token_tid;
  if constexpr (!kRegTrig) {
    for (int64_t i = tid; i < p.half; i += token_threads * blockDim.z) freq_table[i] = rope_frequency(p, i);
  }

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
  // kRegTrig: the frequencies of this lane's pairs (unit threadIdx.x), parameters only
  float reg_freq[kRegTrig ? kVecN : 1];
  if constexpr (kRegTrig) {
#pragma unroll
    for (int j = 0; j < kVecN; ++j)
      reg_freq[j] = rotated[0] ? rope_frequency(p, int64_t{threadIdx.x} * kVecN + j) : 0.0f;
  } else {
    reg_freq[0] = 0.0f;
    __syncthreads();  // the frequency table
  }

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
  float reg_c[kRegTrig ? kVecN : 1], reg_s[kRegTrig ? kVecN : 1];
  if constexpr (kRegTrig) {
    if (!active) return;
    const float pos = static_cast<float>(load_index(p.positions, p.positions_int64, token));
#pragma unroll
    for (int j = 0; j < kVecN; ++j) {
      float sv = 0.0f, cv = 1.0f;
      if (rotated[0]) {
        const float angle = pos * reg_freq[j];
        if (p.fast_trig) {
          sincos_reduced(angle, sv, cv);
        } else {
          sincosf(angle, &sv, &cv);
        }
      }
      reg_c[j] = cv * p.attention_factor;
      reg_s[j] = sv * p.attention_factor;
    }
  } else if (token_valid) {
    const float pos = static_cast<float>(load_index(p.positions, p.positions_int64, token));
    for (int32_t i = static_cast<int32_t>(token_tid); i < half; i += static_cast<int32_t>(token_threads)) {
      const float angle = pos * freq_table[i];
      float sv, cv;
      if (p.fast_trig) {
        sincos_reduced(angle, sv, cv);
      } else {
        sincosf(angle, &sv, &cv);
      }
      cos_sin[i] = cv * p.attention_factor;
      cos_sin[half + i] = sv * p.attention_factor;
    }
  }
  if constexpr (!kRegTrig) {
    __syncthreads();  // the cos/sin rows
    if (!active) return;
  }

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
      if constexpr (kRegTrig) {
#pragma unroll
        for (int j = 0; j < kVecN; ++j) {
          cf[j] = reg_c[j];
          sf[j] = reg_s[j];
        }
      } else if (rotated[u]) {
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

/// Dynamic shared memory of fused_qk_norm_rope_warp_table_kernel: the cos and sin rows of the
/// CTA's token [tables][2][R/2] (times attention_factor), one table per warp (tables = W), or one
/// for the CTA (kCtaTable: tables = 1).
inline int64_t qk_norm_rope_warp_table_smem_bytes(int64_t half, int64_t tables) {
  return tables * 2 * half * static_cast<int64_t>(sizeof(float));
}

/// QKNormRopeVariant::kWarpTable (opt-in; small sizes). The default kernel's math and lane layout
/// (unit x of a head on lane x of a G-lane group, a head's squares added in the same order: the same
/// bits as the default) with one head per group and nothing shared beyond a warp: a warp holds
/// 32 / G heads of one token and computes that token's whole cos/sin table itself (R/2 sincosf over
/// 32 lanes, 2 per lane at R = 128; the same functions of the same fp32 values as the default's rows)
/// into shared rows of its own, then __syncwarp. No frequency table, no CTA barrier, no loop over
/// heads. After the PDL wait the position load issues first, then the data and weight loads (the
/// addresses, unit offsets and the lane's first kWarpTablePairs frequencies are formed before the
/// wait, so the loads are the first instructions after it); the trig starts as soon as the position
/// arrives, while the data is in flight. In the SASS the lane's two table entries and then the sum
/// of squares run one after the other, not interleaved (sincosf's slow-path branch ends ptxas's
/// scheduling region).
/// kCtaTable (QKNormRopeVariant::kCtaTable): one table for the CTA, entry i by thread i % blockDim.x,
/// then __syncthreads; every thread reaches the barrier (a warp without heads too: no return
/// before it).
/// Block (32 * W) x (blocks per token, tokens): warp w of block (bx, token) holds heads
/// (bx * W + w) * (32 / G) + lane / G. Preconditions (the launcher's): blockDim.x a multiple of 32,
/// units <= G (one unit per lane), dynamic shared memory of qk_norm_rope_warp_table_smem_bytes(half,
/// kCtaTable ? 1 : W), the default kernel's alignment. A small-size kernel: registers are not capped
/// for occupancy.
template <typename T, int kVecN, bool kNeox, bool kL2Hint, bool kCtaTable>
__global__ void __launch_bounds__(QKNormRopeConfig::kMaxThreads, 1)
    fused_qk_norm_rope_warp_table_kernel(const QKNormRopeParams p) {
  using vec_t = device::AlignedVector<T, kVecN>;
  constexpr int kTablePairs = QKNormRopeConfig::kWarpTablePairs;
  constexpr int32_t kWarp = static_cast<int32_t>(device::kWarpThreads);
  extern __shared__ float qk_norm_rope_smem[];
  const int32_t lane = static_cast<int32_t>(threadIdx.x) % kWarp;
  const int32_t warp = static_cast<int32_t>(threadIdx.x) / kWarp;
  const int32_t half = static_cast<int32_t>(p.half);
  // The rows of this warp's token: the warp's own, or with kCtaTable the CTA's one table
  float* const cos_row = qk_norm_rope_smem + (kCtaTable ? 0 : warp) * 2 * half;  // [R/2]
  float* const sin_row = cos_row + half;                                         // [R/2]
  // This thread's first table entry and the stride over the entries: the warp's or the CTA's threads
  const int32_t entry = kCtaTable ? static_cast<int32_t>(threadIdx.x) : lane;
  const int32_t entry_step = kCtaTable ? static_cast<int32_t>(blockDim.x) : kWarp;

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
  // the whole warp; not with kCtaTable: it owes its share of the CTA's table and the barrier
  if (!kCtaTable && warp_head >= p.num_heads) return;
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

  // The warp's (kCtaTable: the CTA's) cos/sin rows, by every lane (heads past num_heads too: the
  // whole warp, resp. CTA, reads them).
#pragma unroll
  for (int t = 0; t < kTablePairs; ++t) {
    const int32_t i = entry + t * entry_step;
    if (i < half) scaled_sincos(p, pos * freq[t], cos_row[i], sin_row[i]);
  }
  for (int32_t i = entry + kTablePairs * entry_step; i < half; i += entry_step) {
    scaled_sincos(p, pos * rope_frequency(p, i), cos_row[i], sin_row[i]);
  }
  if constexpr (kCtaTable) {
    __syncthreads();
  } else {
    __syncwarp();
  }
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

/// The previous kernel (QKNormRopeVariant::kLegacy), for the benchmark's old-vs-new rows: one thread
/// per (unit, head) at small sizes, up to kHeadPasses heads per thread at large ones; powf and
/// sincosf per thread.
template <typename T, int kVecN, bool kNeox, int kUnits>
__global__ void __launch_bounds__(QKNormRopeConfig::kMaxThreads, QKNormRopeConfig::min_blocks(kUnits))
    fused_qk_norm_rope_legacy_kernel(const QKNormRopeParams p) {
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

/// Launches a fused_qk_norm_rope kernel with kVecN (kMaxVecN, or 1 when the layout is not aligned to
/// it) and one or two units per lane. variant: QKNormRopeVariant bits.
template <typename T, int kVecN, bool kNeox>
void launch_fused_qk_norm_rope(QKNormRopeParams p, DLDevice device, bool pdl, int64_t variant) {
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

  if ((variant & QKNormRopeVariant::kLegacy) != 0) {
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
          .enable_pdl(pdl)(fused_qk_norm_rope_legacy_kernel<T, kVecN, kNeox, 1>, p);
    } else {
      LaunchKernel(static_cast<uint32_t>(grid), block, device)
          .enable_pdl(pdl)(fused_qk_norm_rope_legacy_kernel<T, kVecN, kNeox, 2>, p);
    }
    return;
  }

  // Groups: kBatch heads (all in flight) at small sizes, kLargeHeadsPerGroup (trig shared) at large
  // ones, doubled until the groups of one token fit a CTA; q and k groups apart.
  const int64_t num_k_heads = p.num_heads - p.num_q_heads;
  const int64_t override_hpg = (variant >> QKNormRopeVariant::kHeadsShift) & 0xff;
  int64_t hpg = override_hpg > 0 ? override_hpg
                : large          ? QKNormRopeConfig::kLargeHeadsPerGroup
                                 : QKNormRopeConfig::kBatch;
  const auto groups_of = [&](int64_t h) { return div_ceil(p.num_q_heads, h) + div_ceil(num_k_heads, h); };
  while (lanes * groups_of(hpg) > QKNormRopeConfig::kMaxThreads) hpg *= 2;
  p.heads_per_group = static_cast<int32_t>(hpg);
  p.num_q_groups = static_cast<int32_t>(div_ceil(p.num_q_heads, hpg));
  p.fast_trig = (variant & QKNormRopeVariant::kFastTrig) != 0;
  const int64_t groups = groups_of(hpg);
  // blockDim.z is at most 64 (a CUDA limit); the cos/sin rows of the CTA's tokens stay within
  // kMaxSmemBytes (R/2 <= 512 pairs: at least 5 tokens)
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
    // The default (variant 0) takes the table kernel with one table per CTA of kDefaultTableWarps
    // warps where it applies (the variant 0x418's launch), the per-token CTA kernel below otherwise
    const bool table_default = variant == 0;
    if ((table_default || (variant & QKNormRopeVariant::kWarpTable) != 0) && units <= lanes && !large) {
      // W warps of 32 / G heads of one token per CTA (fewer when the token has fewer); T < 2^16
      // here (below kLargeThreads), within grid.y's limit
      const int64_t warps_per_token = div_ceil(p.num_heads, static_cast<int64_t>(device::kWarpThreads) / lanes);
      const int64_t override_warps =
          table_default ? QKNormRopeConfig::kDefaultTableWarps : (variant >> QKNormRopeVariant::kHeadsShift) & 0xff;
      const int64_t warps = std::min<int64_t>(
          {override_warps > 0 ? override_warps : QKNormRopeConfig::kWarpTableWarps,
           warps_per_token,
           QKNormRopeConfig::kMaxThreads / device::kWarpThreads});
      const dim3 table_grid(
          static_cast<uint32_t>(div_ceil(warps_per_token, warps)), static_cast<uint32_t>(p.num_tokens));
      const dim3 table_block(static_cast<uint32_t>(warps * device::kWarpThreads));
      // R/2 <= 32 kVecN pairs (one unit per lane): at most 2 KiB a table, so 32 KiB a CTA of
      // kMaxThreads with a table per warp, 2 KiB with kCtaTable (< kMaxSmemBytes)
      const bool cta_table = table_default || (variant & QKNormRopeVariant::kCtaTable) != 0;
      const auto table_smem =
          static_cast<std::size_t>(qk_norm_rope_warp_table_smem_bytes(p.half, cta_table ? 1 : warps));
      const auto launch_table = [&](auto kernel) {
        LaunchKernel(table_grid, table_block, device, table_smem).enable_pdl(pdl)(kernel, p);
      };
      if (cta_table) {
        if (l2_hint) {
          launch_table(fused_qk_norm_rope_warp_table_kernel<T, kVecN, kNeox, true, true>);
        } else {
          launch_table(fused_qk_norm_rope_warp_table_kernel<T, kVecN, kNeox, false, true>);
        }
      } else if (l2_hint) {
        launch_table(fused_qk_norm_rope_warp_table_kernel<T, kVecN, kNeox, true, false>);
      } else {
        launch_table(fused_qk_norm_rope_warp_table_kernel<T, kVecN, kNeox, false, false>);
      }
      return;
    }
  }
  if ((variant & QKNormRopeVariant::kRegTrig) != 0 && units <= lanes && !l2_hint) {
    launch(fused_qk_norm_rope_kernel<T, kVecN, kNeox, 1, false, true>);
    return;
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
/// != 1). position_ids: [num_tokens] int32/int64. enable_pdl: 1 / 0 / -1 (auto). variant:
/// QKNormRopeVariant bits (0: the default kernel; the others are the benchmark's comparisons).
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
    int64_t enable_pdl,
    int64_t variant) {
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
  RuntimeCheck(variant >= 0 && (variant >> QKNormRopeVariant::kHeadsShift) <= 0xff, kOp, ": bad variant ", variant);
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
      launch_fused_qk_norm_rope<T, kVecN, true>(p, device, pdl, variant);
    } else {
      launch_fused_qk_norm_rope<T, kVecN, false>(p, device, pdl, variant);
    }
  };
  if (vec_n == kMaxVecN) {
    launch.template operator()<kMaxVecN>();
  } else {
    launch.template operator()<1>();
  }
}

}  // namespace
