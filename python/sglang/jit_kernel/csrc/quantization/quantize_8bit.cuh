// Shared pieces of the 8-bit quantizers (per_token_group_quant_8bit, per_token_quant_fp8,
// per_tensor_quant_fp8, and the fused norm, activation and KV-store quantizers: norm_quant.cuh,
// per_token_group_quant.cuh, store_cache_quant.cuh): the scale of a block of values, the
// quantization of one value, and the chunk every kernel moves (one vector access when aligned,
// element accesses otherwise).
//
// The arithmetic, which the tests reproduce bit for bit in fp32:
//   s     = clamp(max(amax, eps) / q_type_max, FLT_MIN, FLT_MAX)       (IEEE fp32 division)
//   s     = 2^ceil(log2(s)), at most 2^127                             (ue8m0 only)
//   q     = round(clamp(x * (1 / s), q_min, q_max))                    (fp32; 1 / s IEEE division)
// `round` is the output type's conversion: fp8 e4m3 round-to-nearest-even (saturating), int8
// round-to-nearest-even. The FLT_MIN floor keeps s > 0 for any eps >= 0 (no 0 / 0 = NaN); the
// FLT_MAX cap keeps s finite when the block holds inf. NaN inputs are ignored by the maximum and
// give NaN (fp8) or 0 (int8) in their own position.
#pragma once

#include <sgl_kernel/utils.cuh>  // For SGL_DEVICE, fp8_e4m3_t, bf16_t
#include <sgl_kernel/vec.cuh>    // For AlignedVector

#include <cfloat>
#include <cstdint>
#include <type_traits>

namespace device::quant {

/// The largest finite value of the 8-bit output type, the q_type_max of the scale: 448 for fp8
/// e4m3, 127 for int8.
template <typename TOut>
inline constexpr float kTypeMax = std::is_same_v<TOut, int8_t> ? 127.0f : 448.0f;

/// The scale of a block whose largest magnitude is `amax` (NaN-ignoring): see the file comment.
/// With `ue8m0` the scale is rounded up to a power of two (an exact exponent byte).
SGL_DEVICE float block_scale(float amax, float eps, float type_max, bool ue8m0) {
  float s = fminf(fmaxf(__fdiv_rn(fmaxf(amax, eps), type_max), FLT_MIN), FLT_MAX);
  if (ue8m0) {
    // s is a normal float here: exponent field 1..254. A non-zero mantissa rounds it up one binade.
    const uint32_t bits = __float_as_uint(s);
    uint32_t exponent = bits >> 23;
    if ((bits & 0x7fffffu) != 0) exponent += 1;
    exponent = exponent > 254u ? 254u : exponent;
    s = __uint_as_float(exponent << 23);
  }
  return s;
}

/// The exponent byte (ue8m0) of a power-of-two scale from block_scale(..., ue8m0 = true).
SGL_DEVICE uint8_t scale_exponent(float s) { return static_cast<uint8_t>(__float_as_uint(s) >> 23); }

/// Writes the scale of group `group` of a row whose scales start at `row_scales` (one lane per group
/// calls it): fp32 at element group * group_stride, or with `ue8m0` its exponent byte at byte
/// group % 4 of int32 word group / 4 (words group_stride apart); the lane of the row's last group
/// (num_groups - 1) zeroes the bytes of its word past it.
SGL_DEVICE void store_row_group_scale(
    void* row_scales, int64_t group, float scale, int64_t group_stride, int64_t num_groups, bool ue8m0) {
  if (!ue8m0) {
    static_cast<float*>(row_scales)[group * group_stride] = scale;
    return;
  }
  auto* word = static_cast<uint8_t*>(row_scales) + 4 * ((group >> 2) * group_stride);
  word[group & 3] = scale_exponent(scale);
  if (group == num_groups - 1) {
    for (int64_t b = (group & 3) + 1; b < 4; ++b) word[b] = 0;
  }
}

/// The multiplier of a static per-tensor scale: 1 / scale[0] (the correctly rounded fp32 reciprocal)
/// when the scale is given on the device, else `inv_scale` (the caller's own multiplier). Reading the
/// scale in the kernel keeps a captured CUDA graph correct when the scale changes between replays.
SGL_DEVICE float static_inverse_scale(const float* scale, float inv_scale) {
  return scale != nullptr ? __frcp_rn(*scale) : inv_scale;
}

/// Quantizes one fp32 value: clamp(x * inv_scale, q_min, q_max) rounded to TOut (fp8_e4m3_t or
/// int8_t). NaN stays NaN for fp8 (e4m3 has a NaN) and becomes 0 for int8.
template <typename TOut>
SGL_DEVICE TOut quantize(float x, float inv_scale, float q_min, float q_max) {
  const float y = __fmul_rn(x, inv_scale);
  // fmaxf / fminf would turn NaN into q_min: NaN is passed on (fp8) or made 0 (int8) instead.
  const float clamped = fminf(fmaxf(y, q_min), q_max);
  if constexpr (std::is_same_v<TOut, int8_t>) {
    // __float2int_rn: round half to even; the clamp keeps the result in int8 for bounds within it.
    return static_cast<int8_t>(__float2int_rn(y != y ? 0.0f : clamped));
  } else {
    static_assert(std::is_same_v<TOut, fp8_e4m3_t>, "quantize: TOut must be fp8_e4m3_t or int8_t");
    return fp8_e4m3_t(y != y ? y : clamped);
  }
}

/// kN consecutive elements of T read or written as one kN * sizeof(T)-byte access (16 for input
/// chunks) when kAligned, element by element otherwise (a data pointer or row stride that is not aligned).
/// Element access through operator[].
template <typename T, int kN, bool kAligned>
struct Chunk {
  AlignedVector<T, kN> vec;

  /// Elements ptr[index * kN .. index * kN + kN - 1].
  SGL_DEVICE void load(const T* ptr, int64_t index) {
    if constexpr (kAligned) {
      vec.load(ptr, index);
    } else {
#pragma unroll
      for (int i = 0; i < kN; ++i) vec[i] = ptr[index * kN + i];
    }
  }

  /// The first `count` elements of chunk `index` (all kN when count >= kN); the others are `fill`.
  SGL_DEVICE void load_partial(const T* ptr, int64_t index, int64_t count, T fill) {
#pragma unroll
    for (int i = 0; i < kN; ++i) vec[i] = i < count ? ptr[index * kN + i] : fill;
  }

  SGL_DEVICE void store(T* ptr, int64_t index) const {
    if constexpr (kAligned) {
      vec.store(ptr, index);
    } else {
#pragma unroll
      for (int i = 0; i < kN; ++i) ptr[index * kN + i] = vec[i];
    }
  }

  /// Stores the first `count` elements of chunk `index` (all kN when count >= kN).
  SGL_DEVICE void store_partial(T* ptr, int64_t index, int64_t count) const {
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      if (i < count) ptr[index * kN + i] = vec[i];
    }
  }

  SGL_DEVICE T& operator[](int i) { return vec[i]; }
  SGL_DEVICE const T& operator[](int i) const { return vec[i]; }
};

/// The elements of a chunk in fp32 (exact). bf16 pairs are unpacked from their 32-bit word with
/// one shift or mask each (static_cast takes a byte permute and a multiply for the high half).
template <typename T, int kN, bool kAligned>
SGL_DEVICE void chunk_to_float(const Chunk<T, kN, kAligned>& chunk, float (&f)[kN]) {
  if constexpr (std::is_same_v<T, bf16_t> && kN % 2 == 0) {
#pragma unroll
    for (int i = 0; i < kN; i += 2) {
      uint32_t word;
      __builtin_memcpy(&word, &chunk.vec.data[i], sizeof(word));
      f[i] = __uint_as_float(word << 16);
      f[i + 1] = __uint_as_float(word & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) f[i] = static_cast<float>(chunk[i]);
  }
}

/// Largest |x| of fp32 values (NaN-ignoring, like fmaxf).
template <int kN>
SGL_DEVICE float values_absmax(const float (&f)[kN], float amax) {
#pragma unroll
  for (int i = 0; i < kN; ++i) amax = fmaxf(amax, fabsf(f[i]));
  return amax;
}

/// Largest |x| of a chunk in fp32 (NaN-ignoring, like fmaxf).
template <typename T, int kN, bool kAligned>
SGL_DEVICE float chunk_absmax(const Chunk<T, kN, kAligned>& chunk, float amax) {
  float f[kN];
  chunk_to_float(chunk, f);
  return values_absmax(f, amax);
}

/// Four fp32 values rounded to fp8 e4m3 (round to nearest even, satfinite: the conversion of
/// fp8_e4m3_t(float)), packed little-endian: v0 in the lowest byte.
SGL_DEVICE uint32_t fp8x4_satfinite(float v0, float v1, float v2, float v3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t word;
  // cvt's first source goes to the upper byte of its pair; mov packs the two pairs without masks.
  asm("{\n .reg .b16 lo, hi;\n cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
      " mov.b32 %0, {lo, hi};\n}"
      : "=r"(word)
      : "f"(v0), "f"(v1), "f"(v2), "f"(v3));
  return word;
#else
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v0, v1), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(v2, v3), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
#endif
}

/// Quantizes kN fp32 values into a chunk of TOut (see quantize). kClamp false is allowed only for
/// fp8 with q_min <= -448 and q_max >= 448: the satfinite conversion then gives the clamp's result
/// for every input (|y| > 448 and +-inf -> +-448, NaN -> NaN, -0 -> -0), so the values are only
/// scaled and converted in pairs (one cvt.rn.satfinite.e4m3x2 per two values).
template <typename TOut, bool kClamp, int kN, bool kAligned>
SGL_DEVICE Chunk<TOut, kN, kAligned> quantize_values(const float (&f)[kN], float inv_scale, float q_min, float q_max) {
  Chunk<TOut, kN, kAligned> out;
  if constexpr (!kClamp) {
    static_assert(std::is_same_v<TOut, fp8_e4m3_t> && kN % 4 == 0, "quantize_values: the unclamped path is fp8");
#pragma unroll
    for (int i = 0; i < kN; i += 4) {
      // One 32-bit write per four bytes (a byte-wise copy costs a mask and shift per byte).
      reinterpret_cast<uint32_t*>(out.vec.data)[i / 4] = fp8x4_satfinite(
          __fmul_rn(f[i], inv_scale),
          __fmul_rn(f[i + 1], inv_scale),
          __fmul_rn(f[i + 2], inv_scale),
          __fmul_rn(f[i + 3], inv_scale));
    }
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) out[i] = quantize<TOut>(f[i], inv_scale, q_min, q_max);
  }
  return out;
}

/// Quantizes a chunk of T into a chunk of TOut (see quantize and quantize_values).
template <typename TOut, bool kClamp = true, typename T, int kN, bool kAligned>
SGL_DEVICE Chunk<TOut, kN, kAligned> quantize_chunk(
    const Chunk<T, kN, kAligned>& chunk, float inv_scale, float q_min, float q_max) {
  float f[kN];
  chunk_to_float(chunk, f);
  return quantize_values<TOut, kClamp, kN, kAligned>(f, inv_scale, q_min, q_max);
}

/// Chunk `index` of a row of `num_cols` elements: a full chunk when kAligned (the row length is then a
/// multiple of kN), otherwise the elements that exist, the rest filled with 0 (neutral for |x| max).
template <typename T, int kN, bool kAligned>
SGL_DEVICE void load_row_chunk(Chunk<T, kN, kAligned>& chunk, const T* row, int64_t index, int64_t num_cols) {
  if constexpr (kAligned) {
    chunk.load(row, index);
  } else {
    chunk.load_partial(row, index, num_cols - index * kN, T(0.0f));
  }
}

/// Stores chunk `index` of a row of `num_cols` elements (only the elements that exist).
template <typename T, int kN, bool kAligned>
SGL_DEVICE void store_row_chunk(const Chunk<T, kN, kAligned>& chunk, T* row, int64_t index, int64_t num_cols) {
  if constexpr (kAligned) {
    chunk.store(row, index);
  } else {
    chunk.store_partial(row, index, num_cols - index * kN);
  }
}

}  // namespace device::quant

namespace host::quant {

/// Whether `address` (a pointer or a byte stride) is a multiple of `bytes`.
inline bool is_aligned(const void* address, int64_t bytes) {
  return reinterpret_cast<std::uintptr_t>(address) % static_cast<std::uintptr_t>(bytes) == 0;
}
inline bool is_aligned(int64_t byte_stride, int64_t bytes) { return byte_stride % bytes == 0; }

}  // namespace host::quant
