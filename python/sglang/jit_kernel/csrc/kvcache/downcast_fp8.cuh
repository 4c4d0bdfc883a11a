// downcast_fp8: k_out[loc[i] * mult + offset] = fp8_e4m3(clamp(k[i] / k_scale, -448, 448)), and the
// same for v, for every token i.
//
// Rounding (what the tests hold bit for bit against torch): x is widened to fp32 exactly, divided by
// the fp32 scale with a correctly rounded division, and the quotient is rounded once to e4m3, to
// nearest even, saturating at +-448 (cvt.rn.satfinite, which equals the clamp followed by the
// rounding). +-inf -> +-448; NaN -> 0x7F whatever its sign. The original rounds 1 / scale and the
// product to the input dtype first; the two agree bit for bit when the scale is a power of two (both
// extra roundings are exact then), and otherwise can differ by one e4m3 step near a rounding midpoint.
//
// The division (lean and flat kernels): the steps of the compiler's own div.rn.f32 fast path, with
// the reciprocal part (rcp.approx, one Newton step), which depends on the scale only, done once per
// thread instead of once per element: q0 = x * r, e = fma(-s, q0, x), q = fma(r, e, q0). The
// compiler takes that path whenever its FCHK test allows (ordinary exponents) and calls a slow
// routine otherwise; here the fast path is used only where the exponents are far from every limit:
// s in [2^-40, 2^40] (positive; checked per thread) and |x| at most 2^60, so q lies in [2^-100,
// 2^100] and the residual e is exact. Elements with |x| < 2^-60 (zeros, subnormals) give quotients
// below 2^-20, which round to a signed e4m3 zero whatever the last fp32 bits. Any other scale
// (negative, 0, NaN, inf, below 2^-40, above 2^40) takes __fdiv_rn per element.
//
// Kernels, chosen by the launcher from the shapes and addresses (one path per shape):
//   - lean, for 16-element vectors (head_dim, addresses and strides allow them): thread g converts
//     vector g of the rows laid end to end (row = (token, k or v), k and v of a token adjacent): two
//     16-byte loads of bf16, one 16-byte store of e4m3 (see its comment);
//   - flat, for narrower vectors (8, 4, 2 or 1 elements): the same layout, one load per vector;
//   - legacy, past the 32-bit vector ids of the two (2^31 vectors or more): up to 4 rows of
//     8-element vectors per thread, __fdiv_rn per element, 64-bit ids.
// Lean and flat issue every load of a thread (its scale, loc, source vector) before any compute or
// store, so a thread waits one memory latency; the row and head of g come from multiply-shifts
// (RowDivider). Destination rows whose slot loc[i] * mult + offset (exact) lies outside
// [0, num_slots) are skipped: nothing is written out of bounds and there is no device trap.
// Moves num_tokens * H * D * 2 * (sizeof(T) + 1) bytes, plus loc.
//
// PDL (lean and flat): the kernel waits for the previous kernel (griddepcontrol.wait) before its
// first global load (k, v and loc may be its output) and then releases the next kernel at once, so
// the next launch overlaps this one.
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, Symbolic{Size,DType,Device}, verify_no_{partial,self}_overlap
#include <sgl_kernel/utils.h>   // For div_ceil, RuntimeCheck

#include <sgl_kernel/runtime.cuh>  // For runtime::get_sm_count
#include <sgl_kernel/utils.cuh>    // For LaunchKernel, SGL_DEVICE, fp16_t, bf16_t, fp8_e4m3_t, pointer::offset
#include <sgl_kernel/vec.cuh>      // For AlignedVector

#include <algorithm>
#include <cstdint>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <dlpack/dlpack.h>
#include <limits>
#include <tvm/ffi/container/tensor.h>
#include <type_traits>

#include "access.cuh"  // For RowDivider, load_issued_here

namespace {

/// One of k / v: its source rows, destination rows and scale.
struct DowncastSide {
  const void* src;           // [num_tokens, num_heads, head_dim] of T
  void* dst;                 // [num_slots, num_heads, head_dim] e4m3 bytes
  const float* scale;        // [1], on the device
  int64_t src_token_stride;  // elements of T
  int64_t src_head_stride;   // elements of T
  int64_t dst_token_stride;  // bytes
  int64_t dst_head_stride;   // bytes
};

/// Kernel arguments of downcast_fp8.
struct DowncastFp8Params {
  DowncastSide k;
  DowncastSide v;
  const void* loc;  // [num_tokens] int32 or int64, loc_stride elements apart
  int64_t loc_stride;
  int64_t num_tokens;
  int64_t num_slots;  // valid destination rows: [0, num_slots)
  int64_t mult;
  int64_t offset;
  uint32_t vecs_per_head;    // head_dim / kVec
  uint32_t vecs_per_row;     // num_heads * vecs_per_head
  uint32_t span;             // threads per row in a block: min(vecs_per_row, kThreads)
  uint32_t rows_per_pass;    // rows a block covers at once: kThreads / span
  uint32_t chunks_per_row;   // blocks along a row: div_ceil(vecs_per_row, kThreads)
  uint32_t rows_per_thread;  // 1 .. kMaxRowsPerThread
  bool int32_loc;
};

/// Launch facts of the legacy kernel.
struct DowncastFp8Config {
  static constexpr uint32_t kThreads = 256;
  static constexpr uint32_t kMaxRowsPerThread = 4;   // vectors in flight per thread at large sizes
  static constexpr int64_t kResidentThreads = 2048;  // per SM (H100/H200)
};

/// The destination row of `token`, or -1 when loc * mult + offset is outside [0, num_slots).
SGL_DEVICE int64_t destination_row(const DowncastFp8Params& p, int64_t token) {
  const int64_t i = token * p.loc_stride;
  const int64_t loc =
      p.int32_loc ? int64_t{static_cast<const int32_t*>(p.loc)[i]} : static_cast<const int64_t*>(p.loc)[i];
  const __int128 slot = static_cast<__int128>(loc) * p.mult + p.offset;  // exact: no wrap-around into range
  return (slot >= 0 && slot < p.num_slots) ? static_cast<int64_t>(slot) : int64_t{-1};
}

/// e4m3 byte of fp32 `y`: RNE, saturating at +-448 (= clamp then round); NaN -> 0x7F.
SGL_DEVICE uint8_t e4m3_byte(float y) {
  const auto b = static_cast<uint8_t>(__nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3));
  return y != y ? uint8_t{0x7F} : b;
}

/// kVec elements of T -> kVec e4m3 bytes of x / scale (pairs through cvt.rn.satfinite.e4m3x2).
template <typename T, int kVec>
SGL_DEVICE device::AlignedVector<uint8_t, kVec> downcast(const device::AlignedVector<T, kVec>& x, float scale) {
  device::AlignedVector<uint8_t, kVec> q;
  if constexpr (kVec == 1) {
    q[0] = e4m3_byte(__fdiv_rn(static_cast<float>(x[0]), scale));
  } else {
#pragma unroll
    for (int i = 0; i < kVec; i += 2) {
      const float2 y{__fdiv_rn(static_cast<float>(x[i]), scale), __fdiv_rn(static_cast<float>(x[i + 1]), scale)};
      const auto pair = static_cast<uint16_t>(__nv_cvt_float2_to_fp8x2(y, __NV_SATFINITE, __NV_E4M3));
      q[i] = y.x != y.x ? uint8_t{0x7F} : static_cast<uint8_t>(pair & 0xFF);
      q[i + 1] = y.y != y.y ? uint8_t{0x7F} : static_cast<uint8_t>(pair >> 8);
    }
  }
  return q;
}

/// Legacy kernel (2^31 vectors or more). Block b covers rows [(b / chunks_per_row) * rows_per_block,
/// ...) and vectors [(b % chunks_per_row) * kThreads, ...) of each; thread t takes row t / span
/// (+ u * rows_per_pass) and vector t % span.
template <typename T, int kVec>
__global__ void __launch_bounds__(DowncastFp8Config::kThreads) downcast_fp8_kernel(const DowncastFp8Params p) {
  constexpr uint32_t kThreads = DowncastFp8Config::kThreads;
  constexpr uint32_t kMaxRows = DowncastFp8Config::kMaxRowsPerThread;
  using in_vec = device::AlignedVector<T, kVec>;

  const uint32_t row_in_pass = threadIdx.x / p.span;
  const uint32_t block_rows = blockIdx.x / p.chunks_per_row;
  const uint32_t vec = (blockIdx.x - block_rows * p.chunks_per_row) * kThreads + (threadIdx.x - row_in_pass * p.span);
  if (row_in_pass >= p.rows_per_pass || vec >= p.vecs_per_row) return;
  const uint32_t head = vec / p.vecs_per_head;
  const uint32_t head_vec = vec - head * p.vecs_per_head;
  const int64_t num_rows = 2 * p.num_tokens;
  const int64_t first_row = int64_t{block_rows} * p.rows_per_pass * p.rows_per_thread + row_in_pass;

  in_vec x[kMaxRows];
#pragma unroll
  for (uint32_t u = 0; u < kMaxRows; ++u) {
    const int64_t row = first_row + int64_t{u} * p.rows_per_pass;
    if (u < p.rows_per_thread && row < num_rows) {
      const DowncastSide& s = (row & 1) ? p.v : p.k;
      const auto* src = static_cast<const T*>(s.src) + (row >> 1) * s.src_token_stride + head * s.src_head_stride;
      x[u].load(src, head_vec);
    }
  }
#pragma unroll
  for (uint32_t u = 0; u < kMaxRows; ++u) {
    const int64_t row = first_row + int64_t{u} * p.rows_per_pass;
    if (u < p.rows_per_thread && row < num_rows) {
      const DowncastSide& s = (row & 1) ? p.v : p.k;
      const int64_t slot = destination_row(p, row >> 1);
      if (slot >= 0) {
        void* dst = device::pointer::offset(s.dst, slot * s.dst_token_stride + head * s.dst_head_stride);
        downcast<T, kVec>(x[u], *s.scale).store(dst, head_vec);
      }
    }
  }
}

/// Kernel arguments of the flat downcast kernel (the shared fields in `base`).
struct DowncastFp8FlatParams {
  DowncastFp8Params base;
  uint32_t vecs_per_head;   // head_dim / kVec
  uint32_t vecs_per_side;   // num_heads * vecs_per_head: the vectors of one row
  uint32_t total;           // 2 * num_tokens * vecs_per_side < 2^31
  RowDivider row_divider;   // divides by vecs_per_side
  RowDivider head_divider;  // divides by vecs_per_head
};

/// Launch facts of the flat kernel.
struct DowncastFp8FlatConfig {
  static constexpr uint32_t kThreads = 256;
  static constexpr int64_t kMaxBlocks = 1 << 20;         // grid cap; threads loop past it
  static constexpr int64_t kMaxVecs = int64_t{1} << 31;  // 32-bit vector ids (RowDivider)
};

/// Division x / s by the fast path's steps with the reciprocal r of s done once (file comment).
/// Valid for s in [2^-40, 2^40] and |x| <= 2^60; the sign of a zero quotient is not kept.
SGL_DEVICE float divide_by_reciprocal(float x, float s, float r) {
  const float q0 = __fmul_rn(x, r);
  const float e = __fmaf_rn(-s, q0, x);
  return __fmaf_rn(r, e, q0);
}

/// The refined reciprocal of the fast path: rcp.approx (MUFU.RCP), then one Newton step.
SGL_DEVICE float division_reciprocal(float s) {
  float r0;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r0) : "f"(s));
  return __fmaf_rn(r0, __fmaf_rn(-s, r0, 1.0f), r0);
}

/// Four e4m3 bytes in a word: a NaN byte (0x7F or 0xFF; satfinite never gives magnitude 0x7F to a
/// number) becomes 0x7F. m + 1 carries into a byte's top bit exactly when its low 7 bits are 0x7F.
SGL_DEVICE uint32_t canonical_nan_bytes(uint32_t w) {
  const uint32_t nan_bytes = ((w & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u;
  return w & ~nan_bytes;
}

/// kVec elements (widened to fp32 in `y`) -> kVec e4m3 bytes, packed pairwise by cvt.rn.satfinite.
template <int kVec>
SGL_DEVICE device::AlignedVector<uint8_t, kVec> pack_e4m3(const float (&y)[kVec]) {
  device::AlignedVector<uint8_t, kVec> q;
  if constexpr (kVec == 1) {
    q[0] = e4m3_byte(y[0]);
  } else if constexpr (kVec == 2) {
    const auto pair = static_cast<uint16_t>(__nv_cvt_float2_to_fp8x2(float2{y[0], y[1]}, __NV_SATFINITE, __NV_E4M3));
    const uint32_t w = canonical_nan_bytes(pair);
    q[0] = static_cast<uint8_t>(w & 0xFF);
    q[1] = static_cast<uint8_t>(w >> 8);
  } else {
    uint32_t* words = reinterpret_cast<uint32_t*>(&q);
#pragma unroll
    for (int i = 0; i < kVec; i += 4) {
      const auto lo =
          static_cast<uint32_t>(__nv_cvt_float2_to_fp8x2(float2{y[i], y[i + 1]}, __NV_SATFINITE, __NV_E4M3));
      const auto hi =
          static_cast<uint32_t>(__nv_cvt_float2_to_fp8x2(float2{y[i + 2], y[i + 3]}, __NV_SATFINITE, __NV_E4M3));
      words[i / 4] = canonical_nan_bytes(lo | (hi << 16));
    }
  }
  return q;
}

/// Flat kernel (vectors of kVec = 8, 4, 2 or 1 elements): thread g converts vector g (one head) of
/// the rows laid end to end; row = g / vecs_per_side = 2 * token + (0 for k, 1 for v).
template <typename T, int kVec>
__global__ void __launch_bounds__(DowncastFp8FlatConfig::kThreads)
    downcast_fp8_flat_kernel(const DowncastFp8FlatParams fp) {
  static_assert(kVec <= 8, "downcast_fp8_flat_kernel: one 16-byte load per vector at most");
  using load_vec = device::AlignedVector<T, kVec>;
  const DowncastFp8Params& p = fp.base;
  device::pdl_wait_primary();  // before the first global load (see the file comment)
  device::pdl_launch_dependents();
  const uint32_t step = gridDim.x * blockDim.x;  // <= 2^28: g + step < 2^32
  for (uint32_t g = blockIdx.x * blockDim.x + threadIdx.x; g < fp.total; g += step) {
    const uint32_t row = fp.row_divider.divide(g);
    const uint32_t col = g - row * fp.vecs_per_side;
    const uint32_t head = fp.head_divider.divide(col);
    const uint32_t head_vec = col - head * fp.vecs_per_head;
    const int64_t token = row >> 1;
    const bool is_v = row & 1;
    // Field by field (not a reference to one side): keeps the params in constant space.
    const void* src_base = is_v ? p.v.src : p.k.src;
    void* dst_base = is_v ? p.v.dst : p.k.dst;
    const float* scale_ptr = is_v ? p.v.scale : p.k.scale;
    const int64_t src_ts = is_v ? p.v.src_token_stride : p.k.src_token_stride;
    const int64_t src_hs = is_v ? p.v.src_head_stride : p.k.src_head_stride;
    const int64_t dst_ts = is_v ? p.v.dst_token_stride : p.k.dst_token_stride;
    const int64_t dst_hs = is_v ? p.v.dst_head_stride : p.k.dst_head_stride;

    // Loads, all issued before any use: scale, loc, the source vector
    const float s = *scale_ptr;
    const int64_t slot = destination_row(p, token);
    const auto* src = static_cast<const T*>(src_base) + token * src_ts + head * src_hs;
    const load_vec x = load_issued_here<load_vec>(src, head_vec);

    // Convert
    float y[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) y[i] = static_cast<float>(x[i]);
    float largest = 0.0f;  // fmaxf skips a NaN element (whose quotient is NaN on either path)
#pragma unroll
    for (int i = 0; i < kVec; ++i) largest = fmaxf(largest, fabsf(y[i]));
    if (s >= 0x1p-40f && s <= 0x1p40f && largest <= 0x1p60f) {  // false for a NaN scale
      const float r = division_reciprocal(s);
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        // q with the sign of x (s > 0): exact for every element the fast path takes (file comment);
        // only a zero quotient can come out as +0 instead of -0, and the OR sets its sign back.
        const float q = divide_by_reciprocal(y[i], s, r);
        y[i] = __uint_as_float(__float_as_uint(q) | (__float_as_uint(y[i]) & 0x80000000u));
      }
    } else {  // an inf or |x| > 2^60 in the vector, or a scale outside [2^-40, 2^40]
#pragma unroll
      for (int i = 0; i < kVec; ++i) y[i] = __fdiv_rn(y[i], s);
    }
    if (slot >= 0) {
      void* dst = device::pointer::offset(dst_base, slot * dst_ts + head * dst_hs);
      pack_e4m3<kVec>(y).store(dst, head_vec);
    }
  }
}

/// Lean kernel (16-element vectors): the flat layout, launch and load order (two 16-byte loads and
/// one 16-byte store per thread; every load before any compute) in fewer instructions per vector,
/// with a register bound for 8 resident blocks per SM (32 registers, no local memory: the e4m3
/// words are packed before the slot test, so only four of them stay live across it). At this width
/// the flat kernel's instruction issue, not memory, is what bounds it (docs/perf_notes.md,
/// downcast_fp8). The bytes are bit for bit the flat kernel's conversion:
///   - |x| is clamped to 2^60 (sign and NaN kept: min.NaN.xorsign.abs; bf16 sources as bf16x2, fp16
///     ones on the fp32 values) instead of tested: an element above 2^60 (or an inf) has |x / s| >
///     2^20 for s <= 2^40, so its byte is +-448 (0x7E / 0xFE) on both the exact division and the
///     clamped one; elements up to 2^60 are unchanged. Only the scale range (s in [2^-40, 2^40],
///     once per thread) chooses between the fast steps and __fdiv_rn.
///   - The residual is negated: ne = fma(s, q0, -x), q = fma(-r, ne, q0). RN is odd-symmetric, so ne
///     = -e exactly and q equals the flat kernel's q wherever that is nonzero; for x = -0 these
///     steps give -0 (s * -0 + +0 = +0, then -r * +0 + -0 = -0), for x = +0 +0, and a zero q0 (x r
///     underflowed) gives q = RN(r x), signed as x. So no sign OR: three FP32 instructions per
///     element.
///   - bf16 widening by shift / mask (one instruction per element); the e4m3 words come from two
///     cvt.rn.satfinite.e4m3x2, the NaN fix-up in three instructions per word, one 16-byte store.
///   - The slot test: loc against [loc_lo, loc_hi] computed on the host (exact, 128-bit), two 64-bit
///     compares; the row is then loc * mult + offset in wrapping 64-bit arithmetic (exact in range).
///     loc's dtype is a template parameter (no runtime select of the load).
struct DowncastFp8LeanParams {
  DowncastFp8FlatParams flat;
  int64_t loc_lo;  // loc * mult + offset lies in [0, num_slots) exactly for loc in [loc_lo, loc_hi]
  int64_t loc_hi;  // loc_lo > loc_hi: for no loc
};

/// Launch facts of the lean kernel.
struct DowncastFp8LeanConfig {
  static constexpr uint32_t kThreads = 256;
  static constexpr int kMinBlocks = 8;  // per SM: 65536 / (256 * 8) = 32 registers at most
};

/// Elements of x (two bf16 or fp16 in a word) with |x| > 2^60 become +-2^60; NaN stays NaN.
template <typename T>
SGL_DEVICE uint32_t clamp_pair_magnitude(uint32_t w) {
  if constexpr (std::is_same_v<T, bf16_t>) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 860
    uint32_t c;
    asm("min.NaN.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(c) : "r"(w), "r"(0x5D805D80u));  // 2^60, 2^60
    return c;
#else
    uint32_t c = w;
#pragma unroll
    for (int h = 0; h < 32; h += 16) {
      const uint32_t m = (w >> h) & 0x7FFFu;  // |x| bits; above 0x7F80: NaN
      if (m > 0x5D80u && m <= 0x7F80u) c = (c & ~(0x7FFFu << h)) | (0x5D80u << h);
    }
    return c;
#endif
  } else {
    return w;  // fp16: |x| <= 65504 or inf; clamped as fp32 (clamp_magnitude)
  }
}

/// fp32 x with |x| > 2^60 -> +-2^60; NaN stays NaN.
SGL_DEVICE float clamp_magnitude(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 860
  float c;
  asm("min.NaN.xorsign.abs.f32 %0, %1, %2;" : "=f"(c) : "f"(x), "f"(0x1p60f));
  return c;
#else
  return fabsf(x) > 0x1p60f ? copysignf(0x1p60f, x) : x;
#endif
}

/// The two elements of word w of a source vector, widened to fp32 (exact).
template <typename T>
SGL_DEVICE float2 widen_pair(uint32_t w) {
  if constexpr (std::is_same_v<T, bf16_t>) {
    return float2{__uint_as_float(w << 16), __uint_as_float(w & 0xFFFF0000u)};
  } else {
    const __half2 h = *reinterpret_cast<const __half2*>(&w);
    return __half22float2(h);
  }
}

/// Four fp32 values -> four e4m3 bytes (RNE, satfinite; NaN -> 0x7F) in a word, first in the low byte.
SGL_DEVICE uint32_t e4m3_word(float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t w;  // cvt.e4m3x2 d, hi, lo: the second source goes to the low byte
  asm("{\n .reg .b16 lo, hi;\n cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
      " mov.b32 %0, {lo, hi};\n}"
      : "=r"(w)
      : "f"(a), "f"(b), "f"(c), "f"(d));
  // canonical_nan_bytes in three instructions: w & ~(((w & 0x7F7F7F7F) + 0x01010101) & 0x80808080)
  const uint32_t t = (w & 0x7F7F7F7Fu) + 0x01010101u;
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0x70;" : "=r"(r) : "r"(w), "r"(t), "r"(0x80808080u));  // a & ~(b & c)
  return r;
#else
  const auto lo = static_cast<uint32_t>(__nv_cvt_float2_to_fp8x2(float2{a, b}, __NV_SATFINITE, __NV_E4M3));
  const auto hi = static_cast<uint32_t>(__nv_cvt_float2_to_fp8x2(float2{c, d}, __NV_SATFINITE, __NV_E4M3));
  return canonical_nan_bytes(lo | (hi << 16));
#endif
}

/// The e4m3 word of source words w0, w1 (four elements) divided by s with the fast steps
/// (lean kernel comment): |x| clamped to 2^60, q0 = x r, q = fma(-r, fma(s, q0, -x), q0).
template <typename T>
SGL_DEVICE uint32_t lean_fast_word(uint32_t w0, uint32_t w1, float s, float r) {
  float y[4];
  const uint32_t w[2] = {w0, w1};
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const float2 x = widen_pair<T>(clamp_pair_magnitude<T>(w[j]));
    const float x0 = std::is_same_v<T, bf16_t> ? x.x : clamp_magnitude(x.x);
    const float x1 = std::is_same_v<T, bf16_t> ? x.y : clamp_magnitude(x.y);
    const float q0 = __fmul_rn(x0, r), q1 = __fmul_rn(x1, r);
    y[2 * j] = __fmaf_rn(-r, __fmaf_rn(s, q0, -x0), q0);
    y[2 * j + 1] = __fmaf_rn(-r, __fmaf_rn(s, q1, -x1), q1);
  }
  return e4m3_word(y[0], y[1], y[2], y[3]);
}

/// The same word with __fdiv_rn per element (scales outside [2^-40, 2^40], NaN).
template <typename T>
SGL_DEVICE uint32_t lean_slow_word(uint32_t w0, uint32_t w1, float s) {
  const float2 a = widen_pair<T>(w0), b = widen_pair<T>(w1);
  return e4m3_word(__fdiv_rn(a.x, s), __fdiv_rn(a.y, s), __fdiv_rn(b.x, s), __fdiv_rn(b.y, s));
}

template <typename T, bool kInt32Loc>
__global__ void __launch_bounds__(DowncastFp8LeanConfig::kThreads, DowncastFp8LeanConfig::kMinBlocks)
    downcast_fp8_lean_kernel(const DowncastFp8LeanParams lp) {
  constexpr int kVec = 16;
  using raw_vec = device::AlignedVector<uint32_t, 4>;  // 8 elements of T
  const DowncastFp8FlatParams& fp = lp.flat;
  const DowncastFp8Params& p = fp.base;
  device::pdl_wait_primary();  // before the first global load (see the file comment)
  device::pdl_launch_dependents();
  const uint32_t step = gridDim.x * blockDim.x;  // <= 2^28: g + step < 2^32
  for (uint32_t g = blockIdx.x * blockDim.x + threadIdx.x; g < fp.total; g += step) {
    const uint32_t row = fp.row_divider.divide(g);
    const uint32_t col = g - row * fp.vecs_per_side;
    const uint32_t head = fp.head_divider.divide(col);
    const uint32_t head_vec = col - head * fp.vecs_per_head;
    const int64_t token = row >> 1;
    const bool is_v = row & 1;
    const void* src_base = is_v ? p.v.src : p.k.src;
    const float* scale_ptr = is_v ? p.v.scale : p.k.scale;
    const int64_t src_ts = is_v ? p.v.src_token_stride : p.k.src_token_stride;
    const int64_t src_hs = is_v ? p.v.src_head_stride : p.k.src_head_stride;

    // Loads, all issued before any use: scale, loc, the two halves of the source vector
    const float s = *scale_ptr;
    const int64_t loc = kInt32Loc ? int64_t{static_cast<const int32_t*>(p.loc)[token * p.loc_stride]}
                                  : static_cast<const int64_t*>(p.loc)[token * p.loc_stride];
    const auto* src = static_cast<const T*>(src_base) + token * src_ts + head * src_hs + int64_t{head_vec} * kVec;
    const raw_vec a = load_issued_here<raw_vec>(src, 0);
    const raw_vec b = load_issued_here<raw_vec>(src + 8, 0);
    uint32_t w[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w[i] = a[i];
      w[4 + i] = b[i];
    }

    // Convert (the documented bits; kernel comment) into 4 words of e4m3 bytes, packed before the
    // slot test so that only they stay live
    raw_vec q;
    if (s >= 0x1p-40f && s <= 0x1p40f) {  // false for a NaN scale
      const float r = division_reciprocal(s);
#pragma unroll
      for (int i = 0; i < 4; ++i) q[i] = lean_fast_word<T>(w[2 * i], w[2 * i + 1], s, r);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) q[i] = lean_slow_word<T>(w[2 * i], w[2 * i + 1], s);
    }
    if (loc >= lp.loc_lo && loc <= lp.loc_hi) {
      // exact in range: the 64-bit wrap-around of unsigned arithmetic cancels
      const auto slot = static_cast<int64_t>(
          static_cast<uint64_t>(loc) * static_cast<uint64_t>(p.mult) + static_cast<uint64_t>(p.offset));
      void* dst_base = is_v ? p.v.dst : p.k.dst;
      const int64_t dst_ts = is_v ? p.v.dst_token_stride : p.k.dst_token_stride;
      const int64_t dst_hs = is_v ? p.v.dst_head_stride : p.k.dst_head_stride;
      q.store(device::pointer::offset(dst_base, slot * dst_ts + head * dst_hs), head_vec);
    }
  }
}

/// floor(n / d) for d != 0.
inline __int128 floor_div128(__int128 n, __int128 d) {
  const __int128 q = n / d;
  return (n % d != 0 && ((n < 0) != (d < 0))) ? q - 1 : q;
}

/// The loc values [lo, hi] whose row loc * mult + offset lies in [0, num_slots) (exact), clipped to
/// int64; lo > hi when there are none.
inline void downcast_fp8_loc_range(const DowncastFp8Params& p, int64_t& lo, int64_t& hi) {
  constexpr __int128 kMin = std::numeric_limits<int64_t>::min(), kMax = std::numeric_limits<int64_t>::max();
  const __int128 a = -static_cast<__int128>(p.offset), b = static_cast<__int128>(p.num_slots) - 1 - p.offset;
  __int128 l = 1, h = 0;  // none
  if (p.mult == 0) {
    if (a <= 0 && 0 <= b) l = kMin, h = kMax;
  } else if (p.mult > 0) {
    l = -floor_div128(-a, p.mult), h = floor_div128(b, p.mult);  // mult * loc in [a, b]
  } else {
    l = -floor_div128(-b, p.mult), h = floor_div128(a, p.mult);
  }
  l = std::max(l, kMin), h = std::min(h, kMax);
  if (l > h) l = 1, h = 0;
  lo = static_cast<int64_t>(l), hi = static_cast<int64_t>(h);
}

/// Widest vector (8, 4, 2 or 1 elements) that head_dim, every data pointer and every stride of a
/// dim of more than one element is a multiple of (sources in elements of 2 bytes, outputs in bytes).
inline int downcast_fp8_vector(const DowncastFp8Params& p, int64_t head_dim, int64_t num_heads) {
  const auto address = [](const void* ptr, int64_t unit) {
    return static_cast<uint64_t>(reinterpret_cast<std::uintptr_t>(ptr)) / static_cast<uint64_t>(unit);
  };
  uint64_t bits = 8 | static_cast<uint64_t>(head_dim);
  for (const DowncastSide* s : {&p.k, &p.v}) {
    bits |= address(s->src, 2) | address(s->dst, 1);
    if (p.num_tokens > 1) bits |= static_cast<uint64_t>(s->src_token_stride);
    if (p.num_slots > 1) bits |= static_cast<uint64_t>(s->dst_token_stride);
    if (num_heads > 1) bits |= static_cast<uint64_t>(s->src_head_stride | s->dst_head_stride);
  }
  return static_cast<int>(bits & (~bits + 1));  // the lowest set bit: at most 8
}

/// Flat kernel's vector: the widest of 16, 8, 4, 2, 1 elements that head_dim, the output addresses
/// and output strides (bytes) allow, and that the sources allow in 16-byte loads: sources aligned to
/// 8 elements (16 bytes) take any width, narrower ones limit it to their own alignment.
inline int downcast_fp8_flat_vector(const DowncastFp8Params& p, int64_t head_dim, int64_t num_heads) {
  const auto address = [](const void* ptr, int64_t unit) {
    return static_cast<uint64_t>(reinterpret_cast<std::uintptr_t>(ptr)) / static_cast<uint64_t>(unit);
  };
  uint64_t src_bits = 8, dst_bits = 16 | static_cast<uint64_t>(head_dim);
  for (const DowncastSide* s : {&p.k, &p.v}) {
    src_bits |= address(s->src, 2);
    dst_bits |= address(s->dst, 1);
    if (p.num_tokens > 1) src_bits |= static_cast<uint64_t>(s->src_token_stride);
    if (p.num_slots > 1) dst_bits |= static_cast<uint64_t>(s->dst_token_stride);
    if (num_heads > 1) {
      src_bits |= static_cast<uint64_t>(s->src_head_stride);
      dst_bits |= static_cast<uint64_t>(s->dst_head_stride);
    }
  }
  const int src_vec = static_cast<int>(src_bits & (~src_bits + 1));  // at most 8
  const int dst_vec = static_cast<int>(dst_bits & (~dst_bits + 1));  // at most 16
  return src_vec < 8 ? std::min(src_vec, dst_vec) : dst_vec;
}

/// The flat-layout parameters of `p` for `vec`-element vectors (the lean and flat kernels): false
/// when the 32-bit vector ids do not cover the rows (2^31 vectors or more).
inline bool make_flat_params(
    const DowncastFp8Params& p, int64_t head_dim, int64_t num_heads, int64_t vec, DowncastFp8FlatParams& fp) {
  using Config = DowncastFp8FlatConfig;
  const int64_t vecs_per_head = head_dim / vec;
  const int64_t vecs_per_side = num_heads * vecs_per_head;
  if (vecs_per_side >= Config::kMaxVecs || 2 * p.num_tokens >= Config::kMaxVecs / vecs_per_side) return false;
  fp = DowncastFp8FlatParams{};
  fp.base = p;
  fp.vecs_per_head = static_cast<uint32_t>(vecs_per_head);
  fp.vecs_per_side = static_cast<uint32_t>(vecs_per_side);
  fp.total = static_cast<uint32_t>(2 * p.num_tokens * vecs_per_side);
  fp.row_divider = RowDivider::make(fp.vecs_per_side);
  fp.head_divider = RowDivider::make(fp.vecs_per_head);
  return true;
}

/// Launches the flat kernel for `fp`, built for `vec` (8, 4, 2 or 1) elements per vector.
template <typename T>
void launch_downcast_fp8_flat(const DowncastFp8FlatParams& fp, int vec, DLDevice device) {
  using namespace host;
  using Config = DowncastFp8FlatConfig;
  const int64_t blocks =
      std::clamp<int64_t>(div_ceil(int64_t{fp.total}, int64_t{Config::kThreads}), 1, Config::kMaxBlocks);
  const auto launch = [&](auto kernel) {
    LaunchKernel(static_cast<uint32_t>(blocks), Config::kThreads, device).enable_pdl()(kernel, fp);
  };
  switch (vec) {
    case 8:
      return launch(downcast_fp8_flat_kernel<T, 8>);
    case 4:
      return launch(downcast_fp8_flat_kernel<T, 4>);
    case 2:
      return launch(downcast_fp8_flat_kernel<T, 2>);
    default:
      return launch(downcast_fp8_flat_kernel<T, 1>);
  }
}

/// Launches the lean kernel for `fp`, built for 16-element vectors.
template <typename T>
void launch_downcast_fp8_lean(const DowncastFp8FlatParams& fp, DLDevice device) {
  using namespace host;
  using Config = DowncastFp8LeanConfig;
  DowncastFp8LeanParams lp{};
  lp.flat = fp;
  downcast_fp8_loc_range(fp.base, lp.loc_lo, lp.loc_hi);
  const int64_t blocks =
      std::clamp<int64_t>(div_ceil(int64_t{fp.total}, int64_t{Config::kThreads}), 1, DowncastFp8FlatConfig::kMaxBlocks);
  const auto kernel = fp.base.int32_loc ? downcast_fp8_lean_kernel<T, true> : downcast_fp8_lean_kernel<T, false>;
  LaunchKernel(static_cast<uint32_t>(blocks), Config::kThreads, device).enable_pdl()(kernel, lp);
}

/// Verifies `t` as [rows, num_heads, head_dim] with the last stride 1 and the others free.
inline void verify_heads(
    tvm::ffi::TensorView t,
    const char* name,
    host::SymbolicSize& rows,
    host::SymbolicSize& heads,
    host::SymbolicSize& dim,
    host::SymbolicSize& token_stride,
    host::SymbolicSize& head_stride,
    host::SymbolicDType& dtype,
    host::SymbolicDevice& device) {
  host::TensorMatcher({rows, heads, dim})
      .with_strides({token_stride, head_stride, 1})
      .with_dtype(dtype)
      .with_device(device)
      .verify(t, name);
}

/// downcast_fp8(k, v, k_out, v_out, k_scale, v_scale, loc, mult, offset).
///
/// T: fp16_t or bf16_t. k, v [num_tokens, num_heads, head_dim] of T; k_out, v_out [num_slots,
/// num_heads, head_dim] uint8 or fp8 e4m3 (the bytes); token and head strides free, last stride 1.
/// k_scale, v_scale [1] float32; loc [num_tokens] int32 or int64, any stride. One CUDA device; the
/// outputs share no memory with any input. Throws PanicError (Python RuntimeError) before any launch
/// on a mismatch; nothing is launched for 0 tokens, 0 slots or empty rows. The kernel: lean for
/// 16-element vectors, flat for narrower ones, legacy for 2^31 vectors or more (file comment).
template <typename T>
void downcast_fp8(
    tvm::ffi::TensorView k,
    tvm::ffi::TensorView v,
    tvm::ffi::TensorView k_out,
    tvm::ffi::TensorView v_out,
    tvm::ffi::TensorView k_scale,
    tvm::ffi::TensorView v_scale,
    tvm::ffi::TensorView loc,
    int64_t mult,
    int64_t offset) {
  using namespace host;
  using Config = DowncastFp8Config;

  // Validate
  SymbolicSize num_tokens{"num_tokens"}, num_heads{"num_heads"}, head_dim{"head_dim"}, num_slots{"num_slots"};
  SymbolicSize k_ts{"k_token_stride"}, k_hs{"k_head_stride"}, v_ts{"v_token_stride"}, v_hs{"v_head_stride"};
  SymbolicSize ko_ts{"k_out_token_stride"}, ko_hs{"k_out_head_stride"};
  SymbolicSize vo_ts{"v_out_token_stride"}, vo_hs{"v_out_head_stride"}, loc_stride{"loc_stride"};
  SymbolicDType src_dtype, out_dtype, loc_dtype;
  src_dtype.set_options<T>();
  out_dtype.set_options<uint8_t, fp8_e4m3_t>();
  loc_dtype.set_options<int32_t, int64_t>();
  SymbolicDevice device_;
  device_.set_options<kDLCUDA>();
  verify_heads(k, "k", num_tokens, num_heads, head_dim, k_ts, k_hs, src_dtype, device_);
  verify_heads(v, "v", num_tokens, num_heads, head_dim, v_ts, v_hs, src_dtype, device_);
  verify_heads(k_out, "k_out", num_slots, num_heads, head_dim, ko_ts, ko_hs, out_dtype, device_);
  verify_heads(v_out, "v_out", num_slots, num_heads, head_dim, vo_ts, vo_hs, out_dtype, device_);
  TensorMatcher({1}).with_dtype<float>().with_device(device_).verify(k_scale, "k_scale").verify(v_scale, "v_scale");
  TensorMatcher({num_tokens}).with_strides({loc_stride}).with_dtype(loc_dtype).with_device(device_).verify(loc, "loc");
  const tvm::ffi::TensorView* inputs[] = {&k, &v, &loc, &k_scale, &v_scale};
  const char* input_names[] = {"k", "v", "loc", "k_scale", "v_scale"};
  for (int i = 0; i < 5; ++i) {
    verify_no_partial_overlap(k_out, "k_out", *inputs[i], input_names[i], /*allow_same=*/false);
    verify_no_partial_overlap(v_out, "v_out", *inputs[i], input_names[i], /*allow_same=*/false);
  }
  verify_no_partial_overlap(k_out, "k_out", v_out, "v_out", /*allow_same=*/false);
  verify_no_self_overlap(k_out, "k_out");
  verify_no_self_overlap(v_out, "v_out");

  // Unwrap
  DowncastFp8Params p{};
  p.k = DowncastSide{
      k.data_ptr(),
      k_out.data_ptr(),
      static_cast<const float*>(k_scale.data_ptr()),
      k_ts.unwrap(),
      k_hs.unwrap(),
      ko_ts.unwrap(),
      ko_hs.unwrap()};
  p.v = DowncastSide{
      v.data_ptr(),
      v_out.data_ptr(),
      static_cast<const float*>(v_scale.data_ptr()),
      v_ts.unwrap(),
      v_hs.unwrap(),
      vo_ts.unwrap(),
      vo_hs.unwrap()};
  p.loc = loc.data_ptr();
  p.loc_stride = loc_stride.unwrap();
  p.num_tokens = num_tokens.unwrap();
  p.num_slots = num_slots.unwrap();
  p.mult = mult;
  p.offset = offset;
  p.int32_loc = loc_dtype.is_type<int32_t>();
  const int64_t heads = num_heads.unwrap(), dim = head_dim.unwrap();
  const DLDevice device = device_.unwrap();
  if (p.num_tokens == 0 || p.num_slots == 0 || heads == 0 || dim == 0) return;

  // Configure and launch: lean (16-element vectors) or flat while 32-bit vector ids cover the rows
  const int flat_vec = downcast_fp8_flat_vector(p, dim, heads);
  DowncastFp8FlatParams fp;
  if (make_flat_params(p, dim, heads, flat_vec, fp)) {
    if (flat_vec == 16) return launch_downcast_fp8_lean<T>(fp, device);
    return launch_downcast_fp8_flat<T>(fp, flat_vec, device);
  }

  // Legacy kernel. Configure: the vector width; rows of a block; more rows per thread past one wave
  const int vec = downcast_fp8_vector(p, dim, heads);
  const int64_t vecs_per_row = heads * (dim / vec);
  RuntimeCheck(
      vecs_per_row < (int64_t{1} << 31),
      "downcast_fp8: num_heads * head_dim = ",
      heads * dim,
      " elements per token: expected fewer than 2^31 vectors of ",
      vec);
  p.vecs_per_head = static_cast<uint32_t>(dim / vec);
  p.vecs_per_row = static_cast<uint32_t>(vecs_per_row);
  p.span = static_cast<uint32_t>(std::min<int64_t>(vecs_per_row, Config::kThreads));
  p.rows_per_pass = Config::kThreads / p.span;
  p.chunks_per_row = static_cast<uint32_t>(div_ceil(vecs_per_row, int64_t{Config::kThreads}));
  const int64_t num_rows = 2 * p.num_tokens;
  const int64_t resident = int64_t{runtime::get_sm_count(device.device_id)} * Config::kResidentThreads;
  const bool one_wave = num_rows * vecs_per_row <= resident;
  p.rows_per_thread = one_wave ? 1 : Config::kMaxRowsPerThread;
  const int64_t blocks = div_ceil(num_rows, int64_t{p.rows_per_pass} * p.rows_per_thread) * p.chunks_per_row;
  RuntimeCheck(
      blocks < (int64_t{1} << 31),
      "downcast_fp8: ",
      p.num_tokens,
      " tokens of ",
      heads * dim,
      " elements need ",
      blocks,
      " blocks: expected fewer than 2^31");

  // Launch
  const auto launch = [&](auto kernel) {
    LaunchKernel(static_cast<uint32_t>(blocks), Config::kThreads, device)(kernel, p);
  };
  switch (vec) {
    case 8:
      return launch(downcast_fp8_kernel<T, 8>);
    case 4:
      return launch(downcast_fp8_kernel<T, 4>);
    case 2:
      return launch(downcast_fp8_kernel<T, 2>);
    default:
      return launch(downcast_fp8_kernel<T, 1>);
  }
}

}  // namespace
