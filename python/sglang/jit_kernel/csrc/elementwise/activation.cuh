// Gated activations: silu_and_mul, gelu_and_mul, gelu_tanh_and_mul.
//
//   H = input.shape[-1] / 2;  g = input[t, i], u = input[t, H + i]  (i < H)
//   out[t, i] = round(float(round(act(float(g)))) * float(u))
//
// The activation is computed in fp32 and rounded to T; that value is multiplied by u in fp32 and
// rounded again (torch's `act(x[..., :H]) * x[..., H:]` on T tensors). The fp32 arithmetic follows
// the formulas below operation by operation (each product and sum rounded, no FMA contraction:
// __fmul_rn / __fadd_rn), so the kernel and an fp32 torch reference written the same way differ
// only where the libm functions (expf, erff, tanhf) do:
//   silu       g / (1 + exp(-g))
//   gelu       (g * 0.5) * (1 + erf(g * 0.70710678))                        (exact, erf form)
//   gelu_tanh  (0.5 * g) * (1 + tanh(0.7978845608 * (g + 0.044715 * (g * g * g))))
// Exception, for speed: 16-bit types launched with 16-byte vectors (aligned rows, the common case)
// compute the activation with ex2.approx / rcp.approx: silu by activate_silu_branch_free, gelu /
// gelu_tanh as g * sigmoid(z(g)) (activate_logistic). The fp32 value is a few ulps off the formula, so after the
// rounding to T it is the same value except next to a rounding midpoint of T, where it may be the
// neighbour (1 ulp of T), or (gelu / gelu_tanh near g = -3, where the formula's 1 + erf / 1 + tanh
// cancels) the rounding of the float64 activation; checked on every 16-bit gate. fp32 and narrower
// vectors use the formulas above.
//
// Work layout. A CTA is a 2-D block: threadIdx.x walks the vectors of a row (16 bytes when every
// pointer, row stride and H * sizeof(T) allow it, else 8 / 4 / 2 bytes down to one element, so no
// access is misaligned and no row needs a tail), threadIdx.y the rows. The grid is (column chunks
// of a row, row groups): one CTA per chunk, so a few long rows (decode: one token, 2 x 14336) still
// spread over tens of SMs instead of one CTA per row; a row longer than a CTA is split into equal
// chunks. Each thread moves one vector of one row per iteration: large launches are a one-shot grid
// of 256-thread CTAs, launches of a wave or two take the largest CTAs that keep the SMs evenly
// loaded (gated_act_threads). gridDim.y is capped at 65535; CTAs then stride over row groups.
// Offsets are 64-bit throughout (any element count). Benchmark-only variants of the 16-byte kernel
// (two rows per thread, evict_last loads, exact math, pipelined rows, checked fast silu, fast-math
// gelu_tanh, branch-free silu) are selected by set_gated_act_launch_variant.
//
// Expert filter (MoE): with expert_ids, row t is computed only if expert_ids[t / expert_step] !=
// -1; a filtered row reads its id and nothing else, and its out row is not written.
//
// With PDL the kernel waits for the previous kernel before its first global access (the expert id
// or the rows) and releases the next kernel right after that wait: the next kernel's launch then
// overlaps this one, which only matters at decode sizes.
//
// Bytes moved: 3 * num_tokens * H * sizeof(T) (read 2H, write H per row); a filtered row moves
// only its 4-byte id.
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, SymbolicSize, SymbolicDevice, kAnySize, data_ptr, verify_no_*
#include <sgl_kernel/utils.h>   // For RuntimeCheck, div_ceil

#include <sgl_kernel/runtime.cuh>  // For runtime::get_sm_count, get_cc_major
#include <sgl_kernel/type.cuh>     // For dtype_trait, packed_t
#include <sgl_kernel/utils.cuh>    // For LaunchKernel, SGL_DEVICE, fp16_t, bf16_t, fp32_t, pdl_wait_primary
#include <sgl_kernel/vec.cuh>      // For AlignedVector

#include <algorithm>
#include <bit>
#include <cstdint>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/optional.h>
#include <type_traits>

namespace {

/// Which activation a gated_act_and_mul_kernel instantiation applies to the gate half.
enum class GatedActivation { kSilu, kGelu, kGeluTanh };

/// Kernel arguments of gated_act_and_mul_kernel.
struct GatedActParams {
  const void* input;          // [num_tokens, 2 * hidden_size], rows input_stride elements apart
  void* out;                  // [num_tokens, hidden_size], rows out_stride elements apart
  const int32_t* expert_ids;  // [>= ceil(num_tokens / expert_step)], or nullptr: every row computed
  int64_t num_tokens;         // rows
  int64_t hidden_size;        // H: elements of out per row (the gate and up halves of input)
  int64_t vecs_per_row;       // hidden_size / kVecN
  int64_t input_stride;       // elements between input rows
  int64_t out_stride;         // elements between out rows
  int64_t expert_step;        // rows per expert id (>= 1)
};

/// Launch facts of gated_act_and_mul_kernel.
struct GatedActConfig {
  static constexpr uint32_t kMaxThreads = 512;             // __launch_bounds__, the largest CTA of the heuristic
                                                           // and the benchmark override's limit (1024 made
                                                           // ptxas spill the fp32 gelu_tanh build)
  static constexpr uint32_t kDefaultThreads = 256;         // CTA size for large launches
  static constexpr uint32_t kMinThreads = 64;              // smallest CTA of the 9f465cb rule (old_geometry) and
                                                           // the CTA of the decode rule's count
  static constexpr uint32_t kMinSmallLaunchThreads = 128;  // smallest CTA of the fewest-CTAs rule
  static constexpr int64_t kMinCtasPerSm = 2;              // decode rule: narrower vectors until the launch has
                                                           // this many kMinThreads CTAs per SM
  static constexpr int64_t kMaxGridY = 65535;              // CUDA's limit on gridDim.y
  static constexpr int64_t kThreadsPerSm = 2048;           // resident threads per SM (SM80 / SM90)
  static constexpr int64_t kPairRowsMinWaves = 4;          // pair-rows variant: two rows per thread from this
                                                           // many full waves
  static constexpr int64_t kSmallLaunchWaves = 2;          // up to this many waves of 256-thread CTAs the
                                                           // fewest-CTAs rule picks the CTA size
  static constexpr int64_t kMinDecodeVecBytes = 4;         // narrowest vector the decode rule picks
};

/// act(g) in fp32, each operation rounded as written (see the file comment).
template <GatedActivation kAct>
SGL_DEVICE float activate(float g) {
  if constexpr (kAct == GatedActivation::kSilu) {
    return __fdiv_rn(g, __fadd_rn(1.0f, expf(-g)));
  } else if constexpr (kAct == GatedActivation::kGelu) {
    constexpr float kSqrtHalf = 0.70710678118654752f;  // 1 / sqrt(2)
    return __fmul_rn(__fmul_rn(g, 0.5f), __fadd_rn(1.0f, erff(__fmul_rn(g, kSqrtHalf))));
  } else {
    constexpr float kBeta = 0.7978845608f;  // sqrt(2 / pi)
    constexpr float kKappa = 0.044715f;
    const float cube = __fmul_rn(__fmul_rn(g, g), g);
    const float inner = __fmul_rn(kBeta, __fadd_rn(g, __fmul_rn(kKappa, cube)));
    return __fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, tanhf(inner)));
  }
}

/// silu(g) = g / (1 + exp(-g)) by the instruction sequence __fdiv_rn runs on its fast path (an
/// approximate reciprocal, one Newton step, the quotient and one remainder correction: the correctly
/// rounded quotient), without its per-element range check and branch: those made every element one
/// dependent chain behind a convergence barrier (and a call that clobbered registers), so a
/// thread's elements could not overlap. in_range is cleared when g lies outside [-64, 2^100] or |g| < 2^-24 (zeros,
/// tiny values, NaN, infinities): there 1 + exp(-g) may exceed 2^93 or the remainder may leave the
/// normal range, and the caller recomputes with __fdiv_rn. Inside, the denominator is in [1, 2^93)
/// and the quotient in [2^-88, 2^100], where the sequence is exact as written (the division test
/// checks every 16-bit gate against __fdiv_rn).
SGL_DEVICE float silu_fast_division(float g, bool& in_range) {
  const float d = __fadd_rn(1.0f, expf(-g));
  in_range &= (g >= -64.0f) & (g <= 0x1p100f) & (fabsf(g) >= 0x1p-24f);
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  r = __fmaf_rn(r, __fmaf_rn(-d, r, 1.0f), r);
  const float q = __fmaf_rn(g, r, 0.0f);
  return __fmaf_rn(r, __fmaf_rn(-d, q, g), q);
}

/// exp(x) from ex2.approx with the argument split in two (x * log2(e) as a rounded product plus
/// its FMA remainder, log2(e) itself as two floats): a few fp32 ulps over the whole range, where
/// ex2.approx(x * log2e) alone loses |x| * 2^-24 of relative accuracy to the product's rounding.
/// x is clamped to [-128, 128] (exp is 0 / inf in fp32 beyond); a NaN x gives inf, and the callers'
/// final product with g carries g's NaN. The correction is a product, e * (1 + lo * ln2), not an FMA
/// e + e * (lo * ln2): once ex2 overflows (x > ~88.7, silu gates below -88.7) the FMA gave
/// inf - inf = NaN wherever lo < 0, where the formula's exp is inf and silu is -0.
SGL_DEVICE float fast_exp(float x) {
  constexpr float kLog2eHi = 1.44269502162933349609375f;  // fp32 nearest to log2(e)
  constexpr float kLog2eLo = 1.925963033500011079e-08f;   // log2(e) - kLog2eHi
  constexpr float kLn2 = 0.69314718055994530942f;
  x = fmaxf(fminf(x, 128.0f), -128.0f);
  const float hi = __fmul_rn(x, kLog2eHi);
  const float lo = __fmaf_rn(x, kLog2eLo, __fmaf_rn(x, kLog2eHi, -hi));
  float e;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(hi));
  return __fmul_rn(e, __fmaf_rn(lo, kLn2, 1.0f));
}

/// g / (1 + e) as g * rcp.approx(1 + e) (1 ulp reciprocal; subnormal results kept: no ftz).
SGL_DEVICE float fast_gated_quotient(float g, float e) {
  float r;
  asm("rcp.approx.f32 %0, %1;" : "=f"(r) : "f"(__fadd_rn(1.0f, e)));
  return __fmul_rn(g, r);
}

/// kGatedActFastMath's activations (16-bit types only; gelu keeps erff): silu(g) = g / (1 + exp(-g))
/// and gelu_tanh(g) = g * sigmoid(2 * inner) = g / (1 + exp(-2 * inner)) (0.5 * (1 + tanh(y)) =
/// sigmoid(2y), no cancellation for negative gates), with fast_exp and one approximate reciprocal.
/// A few fp32 ulps from activate<kAct>, so the 16-bit rounding of the activation can differ from the
/// documented one near a rounding midpoint; for timing comparisons (test_fast_math_variant bounds it).
template <GatedActivation kAct>
SGL_DEVICE float activate_fast(float g) {
  if constexpr (kAct == GatedActivation::kSilu) {
    return fast_gated_quotient(g, fast_exp(-g));
  } else {
    constexpr float kBeta = 0.7978845608f;  // sqrt(2 / pi)
    constexpr float kKappa = 0.044715f;
    const float cube = __fmul_rn(__fmul_rn(g, g), g);
    const float inner = __fmul_rn(kBeta, __fadd_rn(g, __fmul_rn(kKappa, cube)));
    // beyond |2 * inner| = 80 exp leaves fast_exp's finite, normal range (inf * 0 gave NaN for gates
    // below about -8.6): the exact activation there; rare, and the branch is nearly always uniform
    if (!(fabsf(inner) <= 40.0f)) return activate<kAct>(g);
    return fast_gated_quotient(g, fast_exp(-2.0f * inner));
  }
}

/// kGatedActLogistic's activations (16-bit gelu_tanh and gelu): act = g * sigmoid(z(g)) = g / (1 + 2^t),
/// t = -log2(e) * z(g), by one ex2.approx.ftz and one rcp.approx.ftz, FMAs, and no branch (all N gates of
/// a vector interleave; activate_fast's per-gate fallback branch kept them one chain after another):
///   gelu_tanh  z = 2 * inner = g * (2 kBeta + 2 kBeta kKappa g^2): 0.5 * (1 + tanh(y)) = sigmoid(2y)
///              exactly, t = g * fma(g^2, b, a): 5 fp32 instructions and 2 MUFU per gate
///   gelu       z = logit(Phi(g)) by a polynomial fit (below): 10 fp32 instructions and 2 MUFU per gate
///              (erff: about 24 and 1)
/// Error (PTX bounds: ex2.approx 2 ulps relative, rcp.approx 1 ulp; every other instruction rounds
/// once). g > 0: e = 2^t <= 1 enters damped by e / (1 + e) <= 1/2; rcp, 1 + e, the product, ex2 and
/// (gelu) the fit keep act within 7.1 fp32 ulps of the exact value, the fp32 formula is within 1.5,
/// and the test accepts either 16-bit rounding within 16 (gelu) / 8 (gelu_tanh) ulps of a midpoint
/// (MIDPOINT_ULPS). g < 0: the relative error
/// grows with |t| (t's own rounding is ln2 * |t| ulps of 2^t): at most 30 ulps for -3 < g < 0 and
/// 2^-24 * |g| absolute below (the test's cancellation slack: 2^-22 * |g|), where the fp32 formula is
/// off by up to 180 ulps (1 + tanh / 1 + erf cancel); where that makes the formula misround an fp16
/// gate (gelu: 3 gates near -3), this rounds as the float64 value does. Modelled on every finite 16-bit
/// gate at every corner of the MUFU bounds and at twice them (scripts/gelu_logistic_fit.py: no gate
/// outside the test's acceptance of the formula or of the float64 value); on the GPU,
/// test_logistic_every_16_bit_gate. Special values: e = +inf (t >= 128) or 1 + e >= 2^126 (rcp's flush
/// to zero) give act = g * 0 = -0, where the formula's 1 + tanh / 1 + erf is already 0 (g below about
/// -4.5 / -5.5); g = +inf gives +inf, g = -inf NaN (inf * 0, as the formula's -inf * (1 + tanh) = -inf
/// * 0), NaN gives NaN.
template <GatedActivation kAct>
SGL_DEVICE float activate_logistic(float g) {
  static_assert(kAct != GatedActivation::kSilu, "silu keeps activate_fast");
  constexpr double kLog2e = 1.4426950408889634;
  const float s = __fmul_rn(g, g);
  float q;
  if constexpr (kAct == GatedActivation::kGeluTanh) {
    constexpr double kBeta = 0.7978845608f;  // the formula's fp32 constants (activate)
    constexpr double kKappa = 0.044715f;
    constexpr float kA = static_cast<float>(-2.0 * kBeta * kLog2e);
    constexpr float kB = static_cast<float>(-2.0 * kBeta * kKappa * kLog2e);
    q = __fmaf_rn(s, kB, kA);
  } else {
    // Q(u) = sum c_i u^i with g * Q(g^2) ~= -log2(e) * logit(Phi(g)) (Phi the standard normal CDF,
    // gelu(g) = g * Phi(g)): a degree-6 weighted minimax fit on |g| <= 6 of the error dz in
    // z = logit(Phi), held to Phi(-|g|) * |dz| <= 2^-23 (the relative error of g * sigmoid(z) for g > 0)
    // and |dz| <= 2^-19.4 for |g| <= 3.6 (the relative error for g < 0, where fp16 rounds finer than
    // the test's cancellation slack); scripts/gelu_logistic_fit.py makes and checks it. Q < 0 for every
    // u >= 0 (no root): beyond the fit range z keeps growing with |g| (sigmoid -> 0 / 1, as Phi), and a
    // Horner sum that overflows is -inf (finite coefficients: no inf - inf, no NaN).
    constexpr float c0 = -2.3022103f, c1 = -0.104828656f, c2 = 8.634846e-05f, c3 = 0.00016279597f;
    constexpr float c4 = -1.20163695e-05f, c5 = 4.2690567e-07f, c6 = -6.336741e-09f;
    q = __fmaf_rn(s, __fmaf_rn(s, __fmaf_rn(s, __fmaf_rn(s, __fmaf_rn(s, __fmaf_rn(s, c6, c5), c4), c3), c2), c1), c0);
  }
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(__fmul_rn(g, q)));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(__fadd_rn(1.0f, e)));
  return __fmul_rn(g, r);
}

/// kGatedActBranchFreeSilu's silu (16-bit T): g / (1 + exp(-g)) by one ex2.approx.ftz and one
/// rcp.approx.ftz, FMAs and no branch (activate_fast's clamp, hi / lo product split and non-ftz
/// reciprocal cost 16 fp32 instructions per gate, this 5 for bf16, 8 for fp16):
///   exp(-g) = 2^(-g * kHi) * 2^(-g * lo), log2(e) = kHi + lo, kHi with few enough significant bits that
///   g * kHi is exact for every gate of T (bf16 gates have 8 bits: kHi = 23637 / 2^14, 15 bits, within
///   2^-17.1 of log2(e); fp16 gates 11: 5909 / 2^12, 13 bits), so ex2's argument carries no rounding
///   (the relative error of exp(-g) would otherwise grow with |g|); 2^(-g * lo) = 1 - g * lo * ln2 to
///   first order (second-order term below 0.8 fp32 ulps for the bf16 gates above -88.7, 1.4 for the
///   fp16 gates above -12 whose results are normal in fp16).
///   Everything is scaled by S (a power of two; g * S exact for every gate of T):
///     c = sat(S * (1 - g * lo * ln2))   one FFMA.SAT: in [0, 1] for finite gates; g = +inf gives 0
///                                       (not -inf: no 0 * inf in d), NaN gives 0
///     d = fma(2^(-g kHi), c, S)         S * (1 + exp(-g))
///     act = (g * S) * rcp(d)
///   bf16, S = 2^-4: d < 2^124 wherever exp(-g) is finite, so the ftz reciprocal of d stays normal where
///   the formula's 1 + exp(-g) >= 2^126 (gates -87.5 .. -88.5) still gives normal tiny results; where
///   exp(-g) overflows (g < -88.7) d = inf and act = g * S * 0 = -0, as the formula's g / inf.
///   fp16, S = 1/2: one Newton step on the reciprocal (the fp16 gate -3.25390625 lies 11 fp32 ulps from
///   a rounding midpoint, within the MUFU bounds' reach at twice their size without it); the exponent
///   path takes max(g, -88.5) (fmaxf), so exp(-g) stays finite (no inf * 0 in the step) and d >= 2^126
///   below about -88: rcp flushes to 0, act = -0 (fp16's rounding of the formula's value there), g =
///   -inf gives -inf * 0 = NaN.
/// Special values: g = +inf gives +inf (e = 0, c = 0, d = S), -inf NaN (the formula's -inf / inf), NaN
/// NaN. Error (PTX bounds: ex2.approx 2 ulps relative, rcp.approx 1 ulp): modelled on every finite
/// 16-bit gate at every corner of the MUFU bounds and at twice them (scripts/silu_branch_free_model.py):
/// the rounding to T equals the fp32 formula's except within MIDPOINT_ULPS["silu"] = 8 fp32 ulps of a
/// midpoint (also with the formula's expf one ulp off); on the GPU, test_branch_free_silu_every_16_bit_gate.
template <typename T>
SGL_DEVICE float activate_silu_branch_free(float g) {
  static_assert(!std::is_same_v<T, fp32_t>, "16-bit types only");
  constexpr bool kBf16 = std::is_same_v<T, bf16_t>;
  constexpr double kLog2e = 1.4426950408889634;
  constexpr double kLn2 = 0.6931471805599453;
  constexpr double kHi = kBf16 ? 23637.0 / 16384.0 : 5909.0 / 4096.0;  // kSiluLog2eHi of the model
  constexpr float kScale = kBf16 ? 0x1p-4f : 0.5f;                     // S
  constexpr float kNegHi = static_cast<float>(-kHi);
  constexpr float kSlope = static_cast<float>(-(kLog2e - kHi) * kLn2 * kScale);
  constexpr float kHalfFloor = -88.5f;  // fp16: the exponent path's lower clamp
  float x = g;
  if constexpr (!kBf16) x = fmaxf(g, kHalfFloor);
  float c, e, r;
  asm("fma.rn.sat.f32 %0, %1, %2, %3;" : "=f"(c) : "f"(x), "f"(kSlope), "f"(kScale));
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(__fmul_rn(x, kNegHi)));
  const float d = __fmaf_rn(e, c, kScale);
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  if constexpr (!kBf16) r = __fmaf_rn(r, __fmaf_rn(-d, r, 1.0f), r);
  return __fmul_rn(__fmul_rn(g, kScale), r);
}

/// kGatedActCheckedFast's tolerance: fp32 bit patterns by which silu_rcp_quotient(g) may differ from
/// activate<kSilu>(g). Both divide the same d = 1 + expf(-g) (expf itself, bit-identical); the exact
/// quotient is correctly rounded (<= 0.5 ulp), g * rcp.approx(d) within 1 ulp (rcp) + 0.5 ulp (the
/// product): 2 ulps apart at most, 8 leaves a 4x margin. The exhaustive 16-bit gate test
/// (test_checked_fast_every_16_bit_gate) checks the result for every input.
inline constexpr int32_t kCheckedFastUlps = 8;

/// g / (1 + expf(-g)) as g * rcp.approx.ftz(1 + expf(-g)): a quotient within kCheckedFastUlps of the
/// exact one wherever the reciprocal is normal (1 + expf(-g) < 2^126; beyond, a flushed reciprocal
/// gives +-0, which same_16_bit_rounding rejects).
SGL_DEVICE float silu_rcp_quotient(float g) {
  const float d = __fadd_rn(1.0f, expf(-g));
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  return __fmul_rn(g, r);
}

/// Whether every fp32 value within kCheckedFastUlps bit patterns of a rounds to the same 16-bit T
/// value as a (for a0 and a1): then the exact activation, which lies in that interval, rounds to
/// round(a) too (rounding is monotone). Packed: one cvt per two values and one 32-bit compare per
/// pair. Intervals that would cross zero come out unequal (the patterns change sign: a NaN or a value
/// of the other sign), as do those reaching past the largest finite value (a NaN); NaN a is refused
/// by the a == a test. The caller recomputes refused pairs exactly.
template <typename T>
SGL_DEVICE bool same_16_bit_rounding(float a0, float a1) {
  using P = packed_t<T>;
  const int32_t b0 = __float_as_int(a0), b1 = __float_as_int(a1);
  const P lo =
      dtype_trait<P>::from(fp32x2_t{__int_as_float(b0 - kCheckedFastUlps), __int_as_float(b1 - kCheckedFastUlps)});
  const P hi =
      dtype_trait<P>::from(fp32x2_t{__int_as_float(b0 + kCheckedFastUlps), __int_as_float(b1 + kCheckedFastUlps)});
  uint32_t lo_bits, hi_bits;
  static_assert(sizeof(P) == sizeof(uint32_t));
  __builtin_memcpy(&lo_bits, &lo, sizeof(P));
  __builtin_memcpy(&hi_bits, &hi, sizeof(P));
  return (lo_bits == hi_bits) & (a0 == a0) & (a1 == a1);
}

/// kGatedActCheckedFast silu for the N gates of one vector (16-bit T, N even): silu_rcp_quotient for
/// every gate (no range test, 2 instructions for the division instead of 6 + 3), kept where
/// same_16_bit_rounding says the documented activation rounds to the same T value; each pair that
/// fails is recomputed by activate<kSilu> (a rare branch: at bf16 a pair fails with probability about
/// 2 * 17 / 65536, so about 1.7 % of warps enter a given pair's branch). The activation
/// returned may differ from activate<kSilu>(g) in fp32, but its rounding to T never does, and only
/// that rounding is used (act_and_mul): the variant's outputs are bit-identical to the default's.
template <typename T, std::size_t N>
SGL_DEVICE void silu_checked_fast_vector(const float (&g)[N], float (&act)[N]) {
  static_assert(N % 2 == 0);
#pragma unroll
  for (std::size_t i = 0; i < N; ++i) act[i] = silu_rcp_quotient(g[i]);
#pragma unroll
  for (std::size_t i = 0; i < N; i += 2) {
    if (!same_16_bit_rounding<T>(act[i], act[i + 1])) {
      act[i] = activate<GatedActivation::kSilu>(g[i]);
      act[i + 1] = activate<GatedActivation::kSilu>(g[i + 1]);
    }
  }
}

/// act(g[i]) in fp32 for the N gates of one vector, each bit-identical to activate<kAct>(g[i]) (with
/// kFast: activate_fast<kAct> for silu and gelu_tanh). silu
/// takes silu_fast_division for all N and redoes the vector through activate only when one gate is
/// out of its range (one branch per vector, rare on real activations).
template <GatedActivation kAct, bool kFast, std::size_t N>
SGL_DEVICE void activate_vector(const float (&g)[N], float (&act)[N]) {
  if constexpr (kFast && kAct != GatedActivation::kGelu) {
#pragma unroll
    for (std::size_t i = 0; i < N; ++i) act[i] = activate_fast<kAct>(g[i]);
  } else if constexpr (kAct == GatedActivation::kSilu) {
    bool in_range = true;
#pragma unroll
    for (std::size_t i = 0; i < N; ++i) act[i] = silu_fast_division(g[i], in_range);
    if (!in_range) {
#pragma unroll
      for (std::size_t i = 0; i < N; ++i) act[i] = activate<kAct>(g[i]);
    }
  } else {
#pragma unroll
    for (std::size_t i = 0; i < N; ++i) act[i] = activate<kAct>(g[i]);
  }
}

/// out[i] = round(float(round(act(float(gate[i])))) * float(up[i])) for the N elements of one vector.
/// 16-bit types convert pairs (one packed conversion instruction per two elements).
/// kLogistic (16-bit T, N even, gelu / gelu_tanh): activate_logistic instead of activate_vector;
/// kBranchFree (16-bit T, N even, silu): activate_silu_branch_free.
template <
    GatedActivation kAct,
    bool kFast,
    typename T,
    std::size_t N,
    bool kChecked = false,
    bool kLogistic = false,
    bool kBranchFree = false>
SGL_DEVICE device::AlignedVector<T, N> act_and_mul(
    const device::AlignedVector<T, N>& gate, const device::AlignedVector<T, N>& up) {
  device::AlignedVector<T, N> out;
  float g[N], act[N];
  if constexpr (std::is_same_v<T, fp32_t>) {
#pragma unroll
    for (std::size_t i = 0; i < N; ++i) g[i] = gate[i];
    activate_vector<kAct, kFast && !std::is_same_v<T, fp32_t>>(g, act);
#pragma unroll
    for (std::size_t i = 0; i < N; ++i) out[i] = __fmul_rn(act[i], up[i]);
  } else if constexpr (N == 1) {
    g[0] = dtype_trait<fp32_t>::from(gate[0]);
    activate_vector<kAct, kFast && !std::is_same_v<T, fp32_t>>(g, act);
    const T rounded = dtype_trait<T>::from(act[0]);
    out[0] = dtype_trait<T>::from(__fmul_rn(dtype_trait<fp32_t>::from(rounded), dtype_trait<fp32_t>::from(up[0])));
  } else {
    using P = packed_t<T>;  // two elements
#pragma unroll
    for (std::size_t i = 0; i < N; i += 2) {
      const fp32x2_t pair = dtype_trait<fp32x2_t>::from(P{gate[i], gate[i + 1]});
      g[i] = pair.x;
      g[i + 1] = pair.y;
    }
    if constexpr (kLogistic && kAct != GatedActivation::kSilu) {
#pragma unroll
      for (std::size_t i = 0; i < N; ++i) act[i] = activate_logistic<kAct>(g[i]);
    } else if constexpr (kBranchFree && kAct == GatedActivation::kSilu) {
#pragma unroll
      for (std::size_t i = 0; i < N; ++i) act[i] = activate_silu_branch_free<T>(g[i]);
    } else if constexpr (kChecked && !kFast && kAct == GatedActivation::kSilu) {
      silu_checked_fast_vector<T>(g, act);
    } else {
      activate_vector<kAct, kFast && !std::is_same_v<T, fp32_t>>(g, act);
    }
#pragma unroll
    for (std::size_t i = 0; i < N; i += 2) {
      const fp32x2_t u = dtype_trait<fp32x2_t>::from(P{up[i], up[i + 1]});
      const fp32x2_t a = dtype_trait<fp32x2_t>::from(dtype_trait<P>::from(fp32x2_t{act[i], act[i + 1]}));
      const P result = dtype_trait<P>::from(fp32x2_t{__fmul_rn(a.x, u.x), __fmul_rn(a.y, u.y)});
      out[i] = result.x;
      out[i + 1] = result.y;
    }
  }
  return out;
}

/// Whether row of the launch is computed: inside num_tokens and kept by the expert filter.
SGL_DEVICE bool gated_act_row_kept(const GatedActParams& params, int64_t row) {
  if (row >= params.num_tokens) return false;
  if (params.expert_ids == nullptr) return true;
  const int64_t id_index = params.expert_step == 1 ? row : row / params.expert_step;
  return params.expert_ids[id_index] != -1;
}

/// Compile-time variants of gated_act_and_mul_kernel, bits of its kVariant parameter. Only 16-byte
/// launches build more than kGatedActPlain (see launch_gated_act); the launcher runs
/// kGatedActPlain unless the benchmark hook _set_launch_variant asks for another one.
///   kGatedActPairRows  two rows per thread, rows_per_grid apart, both rows' loads before either is
///                      computed (the large-launch default of 9f465cb: 91 % of copy at [16384,
///                      2 x 14336] against 98.9 % for one row per thread the run before)
///   kGatedActEvictLast loads with an L2 evict_last policy (norm probes: the L2 then writes dirty
///                      lines back before it drops clean ones, 97.7 -> 100 % of copy for an
///                      out-of-place rmsnorm; the input's lines stay evict_last after the kernel)
///   kGatedActFastMath  16-bit types: ex2.approx / rcp.approx / tanh.approx based activations (see
///                      activate_fast): the default of 16-bit silu 16-byte launches before
///                      kGatedActBranchFreeSilu (and of gelu_tanh before kGatedActLogistic; 99 %
///                      of copy at [16384, 2 x 14336] bf16 against 86 % exact, same run); the rounded
///                      activation equals the exact one except next to a 16-bit rounding midpoint,
///                      where it may be its neighbour (test_fast_math_every_16_bit_gate, every gate)
///   kGatedActPipelined grid of at most the resident CTAs (occupancy query), each thread striding over
///                      rows with the next row's loads issued before the current row is computed:
///                      the loads stay in flight during the math (the one-shot grid has none in flight
///                      while a thread computes; the pair rows have none while the pair computes)
///   kGatedActCheckedFast  16-bit silu: the fast-math activation where its 16-bit rounding provably
///                      equals the documented one, the exact one elsewhere (silu_checked_fast_vector):
///                      bit-identical to the default; gelu / gelu_tanh and fp32 ignore the bit
///   kGatedActLogistic  16-bit gelu_tanh and gelu: g * sigmoid(z(g)) by one ex2 and one rcp, branch-free
///                      (activate_logistic; bf16 SASS from the loads to the store: 16.9 instructions
///                      per gelu_tanh gate against 39 with 4 branch ones for kGatedActFastMath, 22
///                      against 36 for gelu's erff, docs/perf_notes.md); the contract of
///                      kGatedActFastMath (or the float64 value's rounding); the default of 16-bit
///                      gelu / gelu_tanh 16-byte launches since the H200 A/B of 2026-12-01 (fourth
///                      session, [16384, 2 x 14336] bf16: 319.7 / 320.2 us, 104 % of copy, against
///                      409.4 / 394.7 for erff / kGatedActFastMath); silu and fp32 ignore the bit
///   kGatedActBranchFreeSilu  16-bit silu: one ex2 and one rcp per gate, no clamp, no branch, no
///                      non-ftz reciprocal (activate_silu_branch_free; bf16 SASS 5 fp32 instructions
///                      per gate against kGatedActFastMath's 16); the contract of kGatedActFastMath;
///                      the default of 16-bit silu 16-byte launches since the H200 A/B of 2026-12-01
///                      (fourth session, [T, 2 x 14336] bf16 cold, T = 64 / 2048 / 16384: 2.97 / 41.63
///                      / 320.05 us against 3.37 / 42.87 / 342.02); gelu / gelu_tanh and fp32 ignore
///                      the bit
inline constexpr int kGatedActPlain = 0;
inline constexpr int kGatedActPairRows = 1;
inline constexpr int kGatedActEvictLast = 2;
inline constexpr int kGatedActFastMath = 4;
inline constexpr int kGatedActPipelined = 8;
inline constexpr int kGatedActCheckedFast = 16;
inline constexpr int kGatedActLogistic = 64;
inline constexpr int kGatedActBranchFreeSilu = 128;
/// Not a kernel bit: _set_launch_variant(32, _) runs kGatedActPlain where the default would run
/// kGatedActBranchFreeSilu / kGatedActLogistic (the exact-libm default before 2026-12-01), for old-vs-new
/// rows and bit tests.
inline constexpr int kGatedActExact = 32;

/// One thread: vector threadIdx.x of column chunk blockIdx.x, for rows threadIdx.y + blockIdx.y *
/// blockDim.y + k * rows_per_grid (one row per iteration; with kGatedActPairRows the rows k and
/// k + 1 of each pair of iterations, both rows' loads first). Threads past the row's last vector
/// idle.
/// Registers (bf16, sm_90): 16-byte silu 44 (5 resident 256-thread CTAs), gelu / gelu_tanh 34, fast
/// math 32, logistic gelu / gelu_tanh 32; a cap of 40 (__launch_bounds__(512, 3)) spilled silu's
/// 16-byte build, so there is none.
template <typename T, int kVecN, GatedActivation kAct, int kVariant>
__global__ void __launch_bounds__(GatedActConfig::kMaxThreads) gated_act_and_mul_kernel(const GatedActParams params) {
  using vec_t = device::AlignedVector<T, kVecN>;
  constexpr bool kPairRows = (kVariant & kGatedActPairRows) != 0;
  constexpr bool kEvictLast = (kVariant & kGatedActEvictLast) != 0;
  constexpr bool kFast = (kVariant & kGatedActFastMath) != 0;
  constexpr bool kPipelined = (kVariant & kGatedActPipelined) != 0;
  constexpr bool kChecked = (kVariant & kGatedActCheckedFast) != 0;
  constexpr bool kLogistic = (kVariant & kGatedActLogistic) != 0;
  constexpr bool kBranchFree = (kVariant & kGatedActBranchFreeSilu) != 0;
  const int64_t vec = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;  // vector index inside a row
  const int64_t row_step = int64_t{gridDim.y} * blockDim.y;
  device::pdl_wait_primary();  // before the first global access: the rows and ids may be the previous kernel's
  device::pdl_launch_dependents();
  if (vec >= params.vecs_per_row) return;
  const auto* input = static_cast<const T*>(params.input);
  auto* out = static_cast<T*>(params.out);
  const auto load = [&](vec_t& v, const T* ptr) {
    if constexpr (kEvictLast) {
      v.load(ptr, vec, device::l2_evict_last_policy());
    } else {
      v.load(ptr, vec);
    }
  };
  if constexpr (kPairRows) {
    for (int64_t row = int64_t{blockIdx.y} * blockDim.y + threadIdx.y; row < params.num_tokens; row += 2 * row_step) {
      const int64_t next = row + row_step;
      const bool keep = gated_act_row_kept(params, row);
      const bool keep_next = gated_act_row_kept(params, next);
      vec_t gate, up, next_gate, next_up;
      if (keep) {
        load(gate, input + row * params.input_stride);
        load(up, input + row * params.input_stride + params.hidden_size);
      }
      if (keep_next) {
        load(next_gate, input + next * params.input_stride);
        load(next_up, input + next * params.input_stride + params.hidden_size);
      }
      if (keep) {
        act_and_mul<kAct, kFast, T, kVecN, kChecked, kLogistic, kBranchFree>(gate, up).store(
            out + row * params.out_stride, vec);
      }
      if (keep_next) {
        act_and_mul<kAct, kFast, T, kVecN, kChecked, kLogistic, kBranchFree>(next_gate, next_up)
            .store(out + next * params.out_stride, vec);
      }
    }
  } else if constexpr (kPipelined) {
    int64_t row = int64_t{blockIdx.y} * blockDim.y + threadIdx.y;
    bool keep = gated_act_row_kept(params, row);
    vec_t gate, up;
    if (keep) {
      load(gate, input + row * params.input_stride);
      load(up, input + row * params.input_stride + params.hidden_size);
    }
    for (; row < params.num_tokens; row += row_step) {
      const int64_t next = row + row_step;
      const bool keep_next = gated_act_row_kept(params, next);
      vec_t next_gate, next_up;
      if (keep_next) {  // in flight while this row is computed
        load(next_gate, input + next * params.input_stride);
        load(next_up, input + next * params.input_stride + params.hidden_size);
      }
      if (keep) {
        act_and_mul<kAct, kFast, T, kVecN, kChecked, kLogistic, kBranchFree>(gate, up).store(
            out + row * params.out_stride, vec);
      }
      gate = next_gate;
      up = next_up;
      keep = keep_next;
    }
  } else {
    for (int64_t row = int64_t{blockIdx.y} * blockDim.y + threadIdx.y; row < params.num_tokens; row += row_step) {
      if (!gated_act_row_kept(params, row)) continue;
      const T* gate_row = input + row * params.input_stride;
      vec_t gate, up;
      load(gate, gate_row);
      load(up, gate_row + params.hidden_size);
      act_and_mul<kAct, kFast, T, kVecN, kChecked, kLogistic, kBranchFree>(gate, up).store(
          out + row * params.out_stride, vec);
    }
  }
}

/// Benchmark hook state (_set_launch_override, _set_launch_variant): threads per CTA and the widest
/// vector in bytes forced on every launch (0 leaves each to the heuristics); the kernel variant of
/// 16-byte launches (kGatedAct* bits, one set_gated_act_launch_variant takes); old_geometry: the CTA-size
/// rule of 9f465cb (fewest threads on the busiest SM) instead of the fewest-CTAs rule below.
struct GatedActOverride {
  int64_t threads = 0;
  int64_t vec_bytes = 0;
  int64_t variant = kGatedActPlain;
  bool old_geometry = false;
};
inline GatedActOverride& gated_act_override() {
  static GatedActOverride forced;
  return forced;
}

/// CTA shape and grid of one launch.
struct GatedActGeometry {
  dim3 block;
  dim3 grid;
};

/// threads threads per CTA at most. Rows shorter than threads vectors: as few row lanes as the row
/// needs (a power of two >= its vectors) times the rest in rows. Longer rows: one row per CTA, the
/// row split into the fewest chunks of at most threads vectors, all chunks the same size (rounded up
/// to whole warps): 1792 vectors ([*, 2 x 14336] bf16) are 7 x 256 or 4 x 448 threads, not
/// 4 x 512 with half of the last CTA idle. rows_per_thread (1 or 2) rows of each thread in the
/// grid's first pass (the pair-rows kernel).
inline GatedActGeometry gated_act_geometry(
    int64_t num_tokens, int64_t vecs_per_row, uint32_t threads, int64_t rows_per_thread = 1) {
  uint32_t row_lanes =
      static_cast<uint32_t>(std::min<uint64_t>(threads, std::bit_ceil(static_cast<uint64_t>(vecs_per_row))));
  if (vecs_per_row > int64_t{threads}) {
    const int64_t chunks = host::div_ceil(vecs_per_row, int64_t{threads});
    row_lanes = static_cast<uint32_t>(host::div_ceil(host::div_ceil(vecs_per_row, chunks), int64_t{32}) * 32);
  }
  const uint32_t rows_per_cta = threads / row_lanes;
  const int64_t chunks = host::div_ceil(vecs_per_row, int64_t{row_lanes});
  const int64_t row_groups = host::div_ceil(num_tokens, int64_t{rows_per_cta} * rows_per_thread);
  return {
      dim3(row_lanes, rows_per_cta),
      dim3(static_cast<uint32_t>(chunks), static_cast<uint32_t>(std::min(row_groups, GatedActConfig::kMaxGridY)))};
}

/// Threads on the busiest SM of a launch with CTAs dealt out evenly: ceil(ctas / SMs) * CTA size.
inline int64_t gated_act_busiest_sm(const GatedActGeometry& g, int64_t num_sms) {
  return host::div_ceil(int64_t{g.grid.x} * g.grid.y, num_sms) * (int64_t{g.block.x} * g.block.y);
}

/// The CTA size of a launch the override leaves to the heuristics.
///
/// Large launches (the 256-thread grid is more than kSmallLaunchWaves waves of full SMs): 256, one
/// vector of one row per thread, as many CTAs as that takes (one-shot grid; 98.9 % of copy at
/// [16384, 2 x 14336] bf16 in the run of 9fd14a1).
///
/// Smaller launches, fewest-CTAs rule: among kMaxThreads down to kMinSmallLaunchThreads, the largest CTA whose
/// busiest SM holds at most 5/4 of the threads of the best size's busiest SM. Every CTA start is a
/// serial cost on its SM (and PDL releases the next kernel only once every CTA has started), so a
/// launch that fits in one wave wants one or two CTAs per SM, not seven small ones: [64, 2 x 14336]
/// bf16 gets 256 CTAs of 448 threads (the 9f465cb rule below gave 896 CTAs of 128: 2.59 us one input
/// against 1.71 for one 1024-thread CTA per row elsewhere). Decode rows on narrowed vectors keep
/// small CTAs ([1, 2 x 14336] bf16: 56 x 128, the bigger sizes put 2-16x the threads on one SM; 64-thread
/// CTAs, 112 of them, were the rule's floor before: 0.91 / 0.90 us bf16 / fp16 one input against 0.88 /
/// 0.87 for 56 x 128 in the same H200 run of the sixth session of 2026-12-01).
///
/// old_geometry (9f465cb): kDefaultThreads down to kMinThreads, the fewest threads on the busiest
/// SM, a smaller CTA winning only by more than 1/16.
inline uint32_t gated_act_threads(int64_t num_tokens, int64_t vecs_per_row, int64_t num_sms, bool old_geometry) {
  using Config = GatedActConfig;
  if (old_geometry) {
    uint32_t threads = 0;
    int64_t best_load = 0;
    for (uint32_t t = Config::kDefaultThreads; t >= Config::kMinThreads; t /= 2) {
      const int64_t load = gated_act_busiest_sm(gated_act_geometry(num_tokens, vecs_per_row, t), num_sms);
      if (threads == 0 || load * 16 < best_load * 15) {
        threads = t;
        best_load = load;
      }
    }
    return threads;
  }
  const GatedActGeometry large = gated_act_geometry(num_tokens, vecs_per_row, Config::kDefaultThreads);
  const int64_t full_wave = num_sms * (Config::kThreadsPerSm / Config::kDefaultThreads);
  if (int64_t{large.grid.x} * large.grid.y > Config::kSmallLaunchWaves * full_wave) return Config::kDefaultThreads;
  int64_t best_load = -1;
  for (uint32_t t = Config::kMaxThreads; t >= Config::kMinSmallLaunchThreads; t /= 2) {
    const int64_t load = gated_act_busiest_sm(gated_act_geometry(num_tokens, vecs_per_row, t), num_sms);
    if (best_load < 0 || load < best_load) best_load = load;
  }
  for (uint32_t t = Config::kMaxThreads; t > Config::kMinSmallLaunchThreads; t /= 2) {
    if (gated_act_busiest_sm(gated_act_geometry(num_tokens, vecs_per_row, t), num_sms) * 4 <= best_load * 5) return t;
  }
  return Config::kMinSmallLaunchThreads;
}

/// CTAs of block's size of this kernel resident on all SMs at once (cudaOccupancy query, cached per CTA
/// size: the launch hook's sizes are powers of two and the heuristic's multiples of 32 up to 512).
template <typename T, int kVecN, GatedActivation kAct, int kVariant>
int64_t gated_act_resident_ctas(dim3 block, int64_t num_sms) {
  static int per_sm[GatedActConfig::kMaxThreads / 32 + 1] = {};  // 0: not queried yet
  const uint32_t threads = block.x * block.y;
  int& cached = per_sm[std::min<uint32_t>(threads / 32, GatedActConfig::kMaxThreads / 32)];
  if (cached == 0) {
    int n = 0;
    const cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &n, gated_act_and_mul_kernel<T, kVecN, kAct, kVariant>, static_cast<int>(threads), 0);
    cached = (err == cudaSuccess && n > 0) ? n : 1;
  }
  return int64_t{cached} * num_sms;
}

template <typename T, int kVecN, GatedActivation kAct, int kVariant>
void launch_gated_act_variant(GatedActParams params, DLDevice device, bool pdl) {
  using namespace host;
  using Config = GatedActConfig;
  params.vecs_per_row = params.hidden_size / kVecN;
  // gridDim.x holds a row's chunks: at most 2^31 - 1 (32-thread chunks: hidden_size < 2^36 elements).
  RuntimeCheck(
      div_ceil(params.vecs_per_row, int64_t{32}) < (int64_t{1} << 31),
      "input: hidden_size must be < 2^36 elements, got ",
      params.hidden_size);
  const int64_t num_sms = runtime::get_sm_count(device.device_id);
  const GatedActOverride& forced = gated_act_override();
  const uint32_t threads =
      forced.threads > 0 ? static_cast<uint32_t>(forced.threads)
                         : gated_act_threads(params.num_tokens, params.vecs_per_row, num_sms, forced.old_geometry);
  GatedActGeometry geometry = gated_act_geometry(params.num_tokens, params.vecs_per_row, threads);
  if constexpr ((kVariant & kGatedActPairRows) != 0) {
    // 9f465cb: two rows per thread (half the row groups) once the one-row grid is
    // kPairRowsMinWaves waves of full SMs or more.
    const int64_t full_wave = num_sms * (Config::kThreadsPerSm / threads);
    if (int64_t{geometry.grid.x} * geometry.grid.y >= Config::kPairRowsMinWaves * full_wave) {
      geometry = gated_act_geometry(params.num_tokens, params.vecs_per_row, threads, 2);
    }
  }
  if constexpr ((kVariant & kGatedActPipelined) != 0) {
    // At most the CTAs that are resident at once (one wave, no tail wave): row groups capped to
    // floor(resident CTAs / chunks), each thread then striding over its rows.
    const int64_t resident = gated_act_resident_ctas<T, kVecN, kAct, kVariant>(geometry.block, num_sms);
    const int64_t groups = std::max<int64_t>(1, resident / std::max<int64_t>(1, geometry.grid.x));
    geometry.grid.y = static_cast<uint32_t>(std::min<int64_t>(geometry.grid.y, groups));
  }
  LaunchKernel(geometry.grid, geometry.block, device)
      .enable_pdl(pdl)(gated_act_and_mul_kernel<T, kVecN, kAct, kVariant>, params);
}

/// The launch of kVecN-element vectors: 16-byte vectors run the variant the override names (one
/// set_gated_act_launch_variant takes; fp32 has no fast-math builds and runs the variant without that bit),
/// narrower ones the plain kernel.
template <typename T, int kVecN, GatedActivation kAct>
void launch_gated_act(GatedActParams params, DLDevice device, bool pdl) {
  if constexpr (kVecN * sizeof(T) == 16) {
    int64_t variant = gated_act_override().variant;
    // The logistic bit: 16-bit gelu / gelu_tanh only; silu and fp32 run their default without it.
    constexpr bool kLogistic16 = !std::is_same_v<T, fp32_t> && kAct != GatedActivation::kSilu;
    if constexpr (!kLogistic16) variant &= ~int64_t{kGatedActLogistic};
    // The branch-free silu bit: 16-bit silu only; gelu / gelu_tanh and fp32 run their default without it.
    constexpr bool kBranchFree16 = !std::is_same_v<T, fp32_t> && kAct == GatedActivation::kSilu;
    if constexpr (!kBranchFree16) variant &= ~int64_t{kGatedActBranchFreeSilu};
    // The default: the logistic kernel for 16-bit gelu / gelu_tanh, the branch-free one for 16-bit silu
    // (H200, [16384, 2 x 14336] bf16 cold: 320.05 us, 104.3 % of copy, against 342.02 for
    // kGatedActFastMath, now variant 4), else plain (kGatedActExact, 32, asks for plain where these
    // would run).
    if (variant == kGatedActPlain) {
      if constexpr (kLogistic16) {
        variant = kGatedActLogistic;
      } else if constexpr (kBranchFree16) {
        variant = kGatedActBranchFreeSilu;
      }
    }
    variant &= ~int64_t{kGatedActExact};
    if constexpr (std::is_same_v<T, fp32_t>) variant &= ~int64_t{kGatedActFastMath | kGatedActCheckedFast};
    if constexpr (kAct != GatedActivation::kSilu) variant &= ~int64_t{kGatedActCheckedFast};
    constexpr bool k16Bit = !std::is_same_v<T, fp32_t>;
    constexpr bool kSilu16 = k16Bit && kAct == GatedActivation::kSilu;
    switch (variant) {
      case kGatedActPairRows:
        return launch_gated_act_variant<T, kVecN, kAct, kGatedActPairRows>(params, device, pdl);
      case kGatedActPipelined:
        return launch_gated_act_variant<T, kVecN, kAct, kGatedActPipelined>(params, device, pdl);
      case kGatedActPairRows | kGatedActFastMath:
        if constexpr (k16Bit) {
          return launch_gated_act_variant<T, kVecN, kAct, kGatedActPairRows | kGatedActFastMath>(params, device, pdl);
        }
        break;
      case kGatedActPipelined | kGatedActFastMath:
        if constexpr (k16Bit) {
          return launch_gated_act_variant<T, kVecN, kAct, kGatedActPipelined | kGatedActFastMath>(params, device, pdl);
        }
        break;
      case kGatedActCheckedFast:
        if constexpr (kSilu16) {
          return launch_gated_act_variant<T, kVecN, kAct, kGatedActCheckedFast>(params, device, pdl);
        }
        break;
      case kGatedActPairRows | kGatedActCheckedFast:
        if constexpr (kSilu16) {
          return launch_gated_act_variant<T, kVecN, kAct, kGatedActPairRows | kGatedActCheckedFast>(
              params, device, pdl);
        }
        break;
      case kGatedActPipelined | kGatedActCheckedFast:
        if constexpr (kSilu16) {
          return launch_gated_act_variant<T, kVecN, kAct, kGatedActPipelined | kGatedActCheckedFast>(
              params, device, pdl);
        }
        break;
      case kGatedActEvictLast:
        return launch_gated_act_variant<T, kVecN, kAct, kGatedActEvictLast>(params, device, pdl);
      case kGatedActLogistic:
        if constexpr (kLogistic16) {
          return launch_gated_act_variant<T, kVecN, kAct, kGatedActLogistic>(params, device, pdl);
        }
        break;
      case kGatedActBranchFreeSilu:
        if constexpr (kBranchFree16) {
          return launch_gated_act_variant<T, kVecN, kAct, kGatedActBranchFreeSilu>(params, device, pdl);
        }
        break;
      case kGatedActFastMath:
        if constexpr (!std::is_same_v<T, fp32_t>) {
          return launch_gated_act_variant<T, kVecN, kAct, kGatedActFastMath>(params, device, pdl);
        }
        break;
      case kGatedActFastMath | kGatedActEvictLast:
        if constexpr (!std::is_same_v<T, fp32_t>) {
          return launch_gated_act_variant<T, kVecN, kAct, kGatedActFastMath | kGatedActEvictLast>(params, device, pdl);
        }
        break;
      default:
        break;
    }
  }
  return launch_gated_act_variant<T, kVecN, kAct, kGatedActPlain>(params, device, pdl);
}

/// Widest vector (bytes, 16 at most, sizeof(T) at least) that divides every value (addresses, byte
/// strides, byte widths).
template <typename T>
int64_t gated_act_vector_bytes(std::initializer_list<uint64_t> values) {
  uint64_t any = 16;
  for (const uint64_t v : values) any |= v;
  const auto bytes = static_cast<int64_t>(any & (~any + 1));  // lowest set bit, at most 16
  return std::max<int64_t>(bytes, sizeof(T));
}

/// Last dim of a [rows, width] view contiguous (stride 1; any stride when width <= 1).
inline void check_gated_act_last_dim(const tvm::ffi::TensorView& view, const char* name) {
  host::RuntimeCheck(
      view.size(1) <= 1 || view.stride(1) == 1,
      name,
      ": last dim must be contiguous (stride 1), got stride ",
      view.stride(1));
}

/// out[t, i] = round(round(act(input[t, i])) * input[t, H + i]) for rows t kept by the expert filter.
///
/// out: [num_tokens, hidden_size], input: [num_tokens, 2 * hidden_size], T on one CUDA device, last
/// dims contiguous, row strides free (out rows must not overlap each other nor input);
/// expert_ids: optional int32 [>= ceil(num_tokens / expert_step)], contiguous, same device;
/// expert_step >= 1; enable_pdl 1 / 0 / -1 (auto: on for SM90+). Empty inputs return without a
/// launch. T = fp16_t | bf16_t | fp32_t. Throws PanicError (Python RuntimeError) naming the tensor.
template <typename T, GatedActivation kAct>
void gated_act_and_mul(
    tvm::ffi::TensorView out,
    tvm::ffi::TensorView input,
    tvm::ffi::Optional<tvm::ffi::TensorView> expert_ids,
    int64_t expert_step,
    int64_t enable_pdl) {
  using namespace host;

  // Validate
  SymbolicSize num_tokens{"num_tokens"};
  SymbolicSize input_width{"2 * hidden_size"};
  SymbolicSize hidden_size{"hidden_size"};
  SymbolicDevice device_;
  device_.set_options<kDLCUDA>();
  TensorMatcher({num_tokens, input_width})  //
      .with_strides({kAnySize, kAnySize})
      .with_dtype<T>()
      .with_device<kDLCUDA>(device_)
      .verify(input, "input");
  RuntimeCheck(
      input_width.unwrap() % 2 == 0, "input: last dim (2 * hidden_size) must be even, got ", input_width.unwrap());
  hidden_size.set_value(input_width.unwrap() / 2);
  TensorMatcher({num_tokens, hidden_size})  //
      .with_strides({kAnySize, kAnySize})
      .with_dtype<T>()
      .with_device<kDLCUDA>(device_)
      .verify(out, "out");
  check_gated_act_last_dim(input, "input");
  check_gated_act_last_dim(out, "out");
  verify_no_self_overlap(out, "out");
  verify_no_partial_overlap(out, "out", input, "input", /*allow_same=*/false);
  RuntimeCheck(expert_step >= 1, "expert_step must be >= 1, got ", expert_step);
  const int32_t* ids = nullptr;
  if (expert_ids.has_value()) {
    const tvm::ffi::TensorView ids_view = *expert_ids;
    SymbolicSize num_ids{"num_expert_ids"};
    TensorMatcher({num_ids})  //
        .with_dtype<int32_t>()
        .with_device<kDLCUDA>(device_)
        .verify(ids_view, "expert_ids");
    const int64_t needed = div_ceil(num_tokens.unwrap(), expert_step);
    RuntimeCheck(
        num_ids.unwrap() >= needed,
        "expert_ids: expected at least ceil(num_tokens / expert_step) = ",
        needed,
        " entries, got ",
        num_ids.unwrap());
    verify_no_partial_overlap(out, "out", ids_view, "expert_ids", /*allow_same=*/false);
    ids = data_ptr<const int32_t>(ids_view);
  }

  // Unwrap
  const GatedActParams params{
      .input = data_ptr<const void>(input),
      .out = data_ptr(out),
      .expert_ids = ids,
      .num_tokens = num_tokens.unwrap(),
      .hidden_size = hidden_size.unwrap(),
      .vecs_per_row = 0,  // set with the vector width
      .input_stride = input.stride(0),
      .out_stride = out.stride(0),
      .expert_step = expert_step,
  };
  const DLDevice device = device_.unwrap();
  if (params.num_tokens == 0 || params.hidden_size == 0) return;

  // Configure: the widest vector that every row start of input (both halves) and out allows
  const bool many_rows = params.num_tokens > 1;
  int64_t vec_bytes = gated_act_vector_bytes<T>({
      reinterpret_cast<uint64_t>(params.input),
      reinterpret_cast<uint64_t>(params.out),
      static_cast<uint64_t>(params.hidden_size) * sizeof(T),
      many_rows ? static_cast<uint64_t>(params.input_stride) * sizeof(T) : 0,
      many_rows ? static_cast<uint64_t>(params.out_stride) * sizeof(T) : 0,
  });
  // Decode sizes: narrower vectors (down to kMinDecodeVecBytes) while the whole launch would have
  // fewer threads than kMinCtasPerSm CTAs of kMinThreads on every SM. A thread's activations are one
  // dependent chain each (expf / erff / tanhf and a division), so fewer elements per thread on more
  // SMs finish sooner; large launches keep 16 bytes (fewest instructions per byte).
  const int64_t forced_bytes = gated_act_override().vec_bytes;
  if (forced_bytes > 0) {
    vec_bytes = std::min(vec_bytes, forced_bytes);
  } else {
    const int64_t wanted_threads =
        GatedActConfig::kMinCtasPerSm * GatedActConfig::kMinThreads * runtime::get_sm_count(device.device_id);
    const int64_t row_bytes = params.hidden_size * static_cast<int64_t>(sizeof(T));
    while (vec_bytes > std::max<int64_t>(GatedActConfig::kMinDecodeVecBytes, sizeof(T)) &&
           params.num_tokens * (row_bytes / vec_bytes) < wanted_threads) {
      vec_bytes /= 2;
    }
  }
  const bool pdl = enable_pdl >= 0 ? enable_pdl != 0 : runtime::get_cc_major(device.device_id) >= 9;

  // Launch
  constexpr int64_t kElemBytes = sizeof(T);
  switch (vec_bytes) {
    case 16:
      return launch_gated_act<T, std::max<int64_t>(16 / kElemBytes, 1), kAct>(params, device, pdl);
    case 8:
      return launch_gated_act<T, std::max<int64_t>(8 / kElemBytes, 1), kAct>(params, device, pdl);
    case 4:
      return launch_gated_act<T, std::max<int64_t>(4 / kElemBytes, 1), kAct>(params, device, pdl);
    default:
      return launch_gated_act<T, 1, kAct>(params, device, pdl);
  }
}

/// Benchmark hook (bench_activation.py --sweep): forces, on every later launch of this module, the
/// threads per CTA (a power of two in [32, 512]) and the widest vector in bytes (2, 4, 8 or 16; a
/// launch still narrows it to what its pointers allow); 0 leaves either to the heuristics.
inline void set_gated_act_launch_override(int64_t threads, int64_t vec_bytes) {
  host::RuntimeCheck(
      threads == 0 || (threads >= 32 && threads <= GatedActConfig::kMaxThreads &&
                       std::has_single_bit(static_cast<uint64_t>(threads))),
      "_set_launch_override: threads must be 0 or a power of two in [32, 512], got ",
      threads);
  host::RuntimeCheck(
      vec_bytes == 0 || vec_bytes == 2 || vec_bytes == 4 || vec_bytes == 8 || vec_bytes == 16,
      "_set_launch_override: vec_bytes must be 0, 2, 4, 8 or 16, got ",
      vec_bytes);
  gated_act_override().threads = threads;
  gated_act_override().vec_bytes = vec_bytes;
}

/// Benchmark hook (bench_activation.py, old-vs-new rows): the kernel variant of later 16-byte
/// launches of this module (0 plain, 1 pair rows, 2 loads evict_last, 4 fast math, 5 pair rows + fast
/// math, 6 fast math + evict_last, 8 pipelined rows, 12 pipelined + fast math, 16 checked fast silu,
/// 17 pair rows + checked fast silu, 24 pipelined + checked fast silu, 64 logistic gelu / gelu_tanh,
/// 128 branch-free silu; fp32 ignores the fast-math, checked-fast, logistic and branch-free bits, gelu
/// and gelu_tanh the checked-fast and branch-free bits, silu the logistic bit) and whether the CTA size follows
/// 9f465cb's rule (old_geometry != 0). (0, 0) is the default; (1, 1) is 9f15607's large-T kernel and
/// launch exactly (the same SASS and grid), (5, 1) that code with fast math.
inline void set_gated_act_launch_variant(int64_t variant, int64_t old_geometry) {
  host::RuntimeCheck(
      variant == kGatedActPlain || variant == kGatedActPairRows || variant == kGatedActEvictLast ||
          variant == kGatedActFastMath || variant == (kGatedActPairRows | kGatedActFastMath) ||
          variant == (kGatedActFastMath | kGatedActEvictLast) || variant == kGatedActPipelined ||
          variant == (kGatedActPipelined | kGatedActFastMath) || variant == kGatedActCheckedFast ||
          variant == (kGatedActPairRows | kGatedActCheckedFast) ||
          variant == (kGatedActPipelined | kGatedActCheckedFast) || variant == kGatedActExact ||
          variant == kGatedActLogistic || variant == kGatedActBranchFreeSilu,
      "_set_launch_variant: variant must be 0, 1, 2, 4, 5, 6, 8, 12, 16, 17, 24, 32, 64 or 128, got ",
      variant);
  gated_act_override().variant = variant;
  gated_act_override().old_geometry = old_geometry != 0;
}

}  // namespace
