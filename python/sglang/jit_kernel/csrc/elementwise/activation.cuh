// Gated activations: silu_and_mul, gelu_and_mul, gelu_tanh_and_mul (one module per op and dtype: the
// activation is a template parameter of the launcher, so a module holds only its own kernels).
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
// Exception, for speed: 16-bit types on 16-byte vectors (aligned rows, the common case) compute the
// activation from one ex2.approx and one rcp.approx per gate, without a branch: silu by
// activate_silu_branch_free, gelu / gelu_tanh as g * sigmoid(z(g)) (activate_logistic). There the
// libm calls and the exact division would make the kernel compute-bound instead of bandwidth-bound.
// The fp32 value is a few ulps off the formula, so after the rounding to T it is the same value
// except next to a rounding midpoint of T, where it may be the neighbour (1 ulp of T), or (gelu /
// gelu_tanh near g = -3, where the formula's 1 + erf / 1 + tanh cancels) the rounding of the float64
// activation; the tests check every 16-bit gate. fp32 and narrower vectors use the formulas above.
//
// Work layout. A CTA is a 2-D block: threadIdx.x walks the vectors of a row (16 bytes when every
// pointer, row stride and H * sizeof(T) allow it, else 8 / 4 / 2 bytes down to one element, so no
// access is misaligned and no row needs a tail), threadIdx.y the rows. The grid is (column chunks
// of a row, row groups): one CTA per chunk, so a few long rows (decode: one token, 2 x 14336) still
// spread over tens of SMs instead of one CTA per row; a row longer than a CTA is split into equal
// chunks. Each thread moves one vector of one row per iteration: large launches are a one-shot grid
// of 256-thread CTAs, launches of a wave or two take the largest CTAs that keep the SMs evenly
// loaded (gated_act_threads). gridDim.y is capped at 65535; CTAs then stride over row groups.
// Offsets are 64-bit throughout (any element count).
//
// Expert filter (MoE): with expert_ids, row t is computed only if expert_ids[t / expert_step] !=
// -1; a filtered row reads its id and nothing else, and its out row is not written.
//
// With PDL the kernel waits for the previous kernel before its first global access (the expert id
// or the rows) and releases the next kernel right after that wait: the next kernel's launch then
// overlaps this one, which only matters at decode sizes.
//
// Bytes moved: 3 * num_tokens * H * sizeof(T) (read 2H, write H per row); a filtered row moves
// only its 4-byte id. Measurements and the designs that lost: docs/perf_notes.md, "activation".
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
                                                           // (at 1024 ptxas spills the fp32 gelu_tanh build)
  static constexpr uint32_t kDefaultThreads = 256;         // CTA size for large launches
  static constexpr uint32_t kMinThreads = 64;              // the CTA of the decode rule's count
  static constexpr uint32_t kMinSmallLaunchThreads = 128;  // smallest CTA of the fewest-CTAs rule
  static constexpr int64_t kMinCtasPerSm = 2;              // decode rule: narrower vectors until the launch has
                                                           // this many kMinThreads CTAs per SM
  static constexpr int64_t kMaxGridY = 65535;              // CUDA's limit on gridDim.y
  static constexpr int64_t kThreadsPerSm = 2048;           // resident threads per SM (SM80 / SM90)
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
SGL_DEVICE float silu_quotient_rn(float g, bool& in_range) {
  const float d = __fadd_rn(1.0f, expf(-g));
  in_range &= (g >= -64.0f) & (g <= 0x1p100f) & (fabsf(g) >= 0x1p-24f);
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  r = __fmaf_rn(r, __fmaf_rn(-d, r, 1.0f), r);
  const float q = __fmaf_rn(g, r, 0.0f);
  return __fmaf_rn(r, __fmaf_rn(-d, q, g), q);
}

/// The 16-byte 16-bit gelu_tanh and gelu: act = g * sigmoid(z(g)) = g / (1 + 2^t), t = -log2(e) * z(g),
/// by one ex2.approx.ftz and one rcp.approx.ftz, FMAs, and no branch (all N gates of a vector
/// interleave; a per-gate branch would make them one chain after another):
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
  static_assert(kAct != GatedActivation::kSilu, "silu has activate_silu_branch_free");
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

/// The 16-byte 16-bit silu: g / (1 + exp(-g)) by one ex2.approx.ftz and one rcp.approx.ftz, FMAs and
/// no branch (5 fp32 instructions per gate for bf16, 8 for fp16):
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

/// act(g[i]) in fp32 for the N gates of one vector, each bit-identical to activate<kAct>(g[i]). silu
/// takes silu_quotient_rn for all N and redoes the vector through activate only when one gate is
/// out of its range (one branch per vector, rare on real activations).
template <GatedActivation kAct, std::size_t N>
SGL_DEVICE void activate_vector(const float (&g)[N], float (&act)[N]) {
  if constexpr (kAct == GatedActivation::kSilu) {
    bool in_range = true;
#pragma unroll
    for (std::size_t i = 0; i < N; ++i) act[i] = silu_quotient_rn(g[i], in_range);
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
/// 16-bit types convert pairs (one packed conversion instruction per two elements); with kBranchFree
/// (by default: their 16-byte vectors) they take the branch-free approximations
/// (activate_silu_branch_free, activate_logistic), every other vector the formulas (activate_vector).
/// per_token_group_quant.cuh passes kBranchFree explicitly to reproduce this op's choice.
template <GatedActivation kAct, typename T, std::size_t N, bool kBranchFree = N * sizeof(T) == 16>
SGL_DEVICE device::AlignedVector<T, N> act_and_mul(
    const device::AlignedVector<T, N>& gate, const device::AlignedVector<T, N>& up) {
  device::AlignedVector<T, N> out;
  float g[N], act[N];
  if constexpr (std::is_same_v<T, fp32_t>) {
#pragma unroll
    for (std::size_t i = 0; i < N; ++i) g[i] = gate[i];
    activate_vector<kAct>(g, act);
#pragma unroll
    for (std::size_t i = 0; i < N; ++i) out[i] = __fmul_rn(act[i], up[i]);
  } else if constexpr (N == 1) {
    g[0] = dtype_trait<fp32_t>::from(gate[0]);
    activate_vector<kAct>(g, act);
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
    if constexpr (!kBranchFree) {
      activate_vector<kAct>(g, act);
    } else if constexpr (kAct == GatedActivation::kSilu) {
#pragma unroll
      for (std::size_t i = 0; i < N; ++i) act[i] = activate_silu_branch_free<T>(g[i]);
    } else {
#pragma unroll
      for (std::size_t i = 0; i < N; ++i) act[i] = activate_logistic<kAct>(g[i]);
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

/// One thread: vector threadIdx.x of column chunk blockIdx.x, for rows threadIdx.y + blockIdx.y *
/// blockDim.y + k * gridDim.y * blockDim.y (one row per iteration). Threads past the row's last
/// vector idle.
template <typename T, int kVecN, GatedActivation kAct>
__global__ void __launch_bounds__(GatedActConfig::kMaxThreads) gated_act_and_mul_kernel(const GatedActParams params) {
  using vec_t = device::AlignedVector<T, kVecN>;
  const int64_t vec = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;  // vector index inside a row
  const int64_t row_step = int64_t{gridDim.y} * blockDim.y;
  device::pdl_wait_primary();  // before the first global access: the rows and ids may be the previous kernel's
  device::pdl_launch_dependents();
  if (vec >= params.vecs_per_row) return;
  const auto* input = static_cast<const T*>(params.input);
  auto* out = static_cast<T*>(params.out);
  for (int64_t row = int64_t{blockIdx.y} * blockDim.y + threadIdx.y; row < params.num_tokens; row += row_step) {
    if (!gated_act_row_kept(params, row)) continue;
    const T* gate_row = input + row * params.input_stride;
    vec_t gate, up;
    gate.load(gate_row, vec);
    up.load(gate_row + params.hidden_size, vec);
    act_and_mul<kAct, T, kVecN>(gate, up).store(out + row * params.out_stride, vec);
  }
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
/// 4 x 512 with half of the last CTA idle.
inline GatedActGeometry gated_act_geometry(int64_t num_tokens, int64_t vecs_per_row, uint32_t threads) {
  uint32_t row_lanes =
      static_cast<uint32_t>(std::min<uint64_t>(threads, std::bit_ceil(static_cast<uint64_t>(vecs_per_row))));
  if (vecs_per_row > int64_t{threads}) {
    const int64_t chunks = host::div_ceil(vecs_per_row, int64_t{threads});
    row_lanes = static_cast<uint32_t>(host::div_ceil(host::div_ceil(vecs_per_row, chunks), int64_t{32}) * 32);
  }
  const uint32_t rows_per_cta = threads / row_lanes;
  const int64_t chunks = host::div_ceil(vecs_per_row, int64_t{row_lanes});
  const int64_t row_groups = host::div_ceil(num_tokens, int64_t{rows_per_cta});
  return {
      dim3(row_lanes, rows_per_cta),
      dim3(static_cast<uint32_t>(chunks), static_cast<uint32_t>(std::min(row_groups, GatedActConfig::kMaxGridY)))};
}

/// Threads on the busiest SM of a launch with CTAs dealt out evenly: ceil(ctas / SMs) * CTA size.
inline int64_t gated_act_busiest_sm(const GatedActGeometry& g, int64_t num_sms) {
  return host::div_ceil(int64_t{g.grid.x} * g.grid.y, num_sms) * (int64_t{g.block.x} * g.block.y);
}

/// The CTA size of a launch.
///
/// Large launches (the 256-thread grid is more than kSmallLaunchWaves waves of full SMs): 256, one
/// vector of one row per thread, as many CTAs as that takes (one-shot grid).
///
/// Smaller launches, fewest-CTAs rule: among kMaxThreads down to kMinSmallLaunchThreads, the largest
/// CTA whose busiest SM holds at most 5/4 of the threads of the best size's busiest SM. Every CTA
/// start is a serial cost on its SM (and PDL releases the next kernel only once every CTA has
/// started), so a launch that fits in one wave wants one or two CTAs per SM, not seven small ones:
/// [64, 2 x 14336] bf16 gets 256 CTAs of 448 threads. Decode rows on narrowed vectors keep small CTAs
/// ([1, 2 x 14336] bf16: 56 x 128; the bigger sizes put 2-16x the threads on one SM).
inline uint32_t gated_act_threads(int64_t num_tokens, int64_t vecs_per_row, int64_t num_sms) {
  using Config = GatedActConfig;
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

/// The launch of kVecN-element vectors.
template <typename T, int kVecN, GatedActivation kAct>
void launch_gated_act(GatedActParams params, DLDevice device, bool pdl) {
  using namespace host;
  params.vecs_per_row = params.hidden_size / kVecN;
  // gridDim.x holds a row's chunks: at most 2^31 - 1 (32-thread chunks: hidden_size < 2^36 elements).
  RuntimeCheck(
      div_ceil(params.vecs_per_row, int64_t{32}) < (int64_t{1} << 31),
      "input: hidden_size must be < 2^36 elements, got ",
      params.hidden_size);
  const int64_t num_sms = runtime::get_sm_count(device.device_id);
  const uint32_t threads = gated_act_threads(params.num_tokens, params.vecs_per_row, num_sms);
  const GatedActGeometry geometry = gated_act_geometry(params.num_tokens, params.vecs_per_row, threads);
  LaunchKernel(geometry.grid, geometry.block, device).enable_pdl(pdl)(gated_act_and_mul_kernel<T, kVecN, kAct>, params);
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

/// The vector width (bytes) of a launch: the widest vector that every row start of input (both
/// halves) and out allows, narrowed at decode sizes. per_token_group_quant.cuh evaluates it too (its
/// legacy mode reproduces the activation math this width selects in act_and_mul).
template <typename T>
int64_t gated_act_launch_vector_bytes(
    const void* input,
    const void* out,
    int64_t hidden_size,
    int64_t input_stride,
    int64_t out_stride,
    int64_t num_tokens,
    int device_id) {
  const bool many_rows = num_tokens > 1;
  int64_t vec_bytes = gated_act_vector_bytes<T>({
      reinterpret_cast<uint64_t>(input),
      reinterpret_cast<uint64_t>(out),
      static_cast<uint64_t>(hidden_size) * sizeof(T),
      many_rows ? static_cast<uint64_t>(input_stride) * sizeof(T) : 0,
      many_rows ? static_cast<uint64_t>(out_stride) * sizeof(T) : 0,
  });
  // Decode sizes: narrower vectors (down to kMinDecodeVecBytes) while the whole launch would have
  // fewer threads than kMinCtasPerSm CTAs of kMinThreads on every SM. A thread's activations are one
  // dependent chain each (expf / erff / tanhf and a division), so fewer elements per thread on more
  // SMs finish sooner; large launches keep 16 bytes (fewest instructions per byte).
  const int64_t wanted_threads =
      GatedActConfig::kMinCtasPerSm * GatedActConfig::kMinThreads * host::runtime::get_sm_count(device_id);
  const int64_t row_bytes = hidden_size * static_cast<int64_t>(sizeof(T));
  while (vec_bytes > std::max<int64_t>(GatedActConfig::kMinDecodeVecBytes, sizeof(T)) &&
         num_tokens * (row_bytes / vec_bytes) < wanted_threads) {
    vec_bytes /= 2;
  }
  return vec_bytes;
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

  // Configure
  const int64_t vec_bytes = gated_act_launch_vector_bytes<T>(
      params.input,
      params.out,
      params.hidden_size,
      params.input_stride,
      params.out_stride,
      params.num_tokens,
      device.device_id);
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

}  // namespace
