// Shared pieces of the 8-bit activation quantizers (per_token_group_quant_8bit, per_token_quant_fp8,
// per_tensor_quant_fp8): the scale of a block of values, the quantization of one value, and the
// 16-byte input chunk every kernel moves (one vector load when aligned, element loads otherwise).
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

#include <sgl_kernel/utils.cuh>  // For SGL_DEVICE, fp8_e4m3_t, fp32_t
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
SGL_DEVICE uint8_t scale_exponent(float s) {
  return static_cast<uint8_t>(__float_as_uint(s) >> 23);
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

/// kN consecutive elements of T read or written as one 16-byte (kN * sizeof(T)) access when
/// kAligned, element by element otherwise (a data pointer or row stride that is not aligned).
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

/// Largest |x| of a chunk in fp32 (NaN-ignoring, like fmaxf).
template <typename T, int kN, bool kAligned>
SGL_DEVICE float chunk_absmax(const Chunk<T, kN, kAligned>& chunk, float amax) {
#pragma unroll
  for (int i = 0; i < kN; ++i) amax = fmaxf(amax, fabsf(static_cast<float>(chunk[i])));
  return amax;
}

/// Quantizes a chunk of T into a chunk of TOut (see quantize).
template <typename TOut, typename T, int kN, bool kAligned>
SGL_DEVICE Chunk<TOut, kN, kAligned> quantize_chunk(const Chunk<T, kN, kAligned>& chunk, float inv_scale, float q_min,
                                                    float q_max) {
  Chunk<TOut, kN, kAligned> out;
#pragma unroll
  for (int i = 0; i < kN; ++i) out[i] = quantize<TOut>(static_cast<float>(chunk[i]), inv_scale, q_min, q_max);
  return out;
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
inline bool is_aligned(int64_t byte_stride, int64_t bytes) {
  return byte_stride % bytes == 0;
}

}  // namespace host::quant
