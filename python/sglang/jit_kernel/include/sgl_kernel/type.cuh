// Per-type traits for device code: conversions, math dispatch and packed (x2) types.
//
//   dtype_trait<T>       static conversion (`from`) and math (abs/sqrt/rsqrt/exp/sin/cos/max/min)
//   packed_t<T>          two-element packed type: fp16_t -> fp16x2_t, bf16_t -> bf16x2_t, fp32_t -> fp32x2_t
//   device::cast<To>(v)  conversion through dtype_trait<To>::from (round to nearest even)
//
// Supported T: fp32_t, fp16_t, bf16_t, fp32x2_t, fp16x2_t, bf16x2_t (conversion + math) and
// fp8_e4m3_t, fp8_e5m2_t, fp8x2_e4m3_t, fp8x2_e5m2_t (conversion only; do math in fp32).
// Any other T fails to compile (dtype_trait is undefined for it).
#pragma once

#include <sgl_kernel/utils.cuh>  // For fp16_t, bf16_t, fp32_t, fp8 aliases, packed aliases, SGL_DEVICE

#include <type_traits>

/// Traits of element type T; only the specialisations below exist. Members (all static, device):
///   `using packed_type`          the 2-element packed type (for packed T: T itself)
///   `using scalar_type`          the element type (for scalar T: T itself)
///   `from(x)`                    convert x (a supported scalar/packed type, or an arithmetic value) to T;
///                                float -> narrower rounds to nearest even (fp8 saturates to finite)
///   `abs/sqrt/rsqrt/exp/sin/cos(x)`, `max/min(x, y)`   math in T (element-wise for packed T)
template <typename T>
struct dtype_trait;

template <>
struct dtype_trait<fp32_t> {
  using packed_type = fp32x2_t;
  using scalar_type = fp32_t;

  static SGL_DEVICE fp32_t from(fp32_t x) { return x; }
  static SGL_DEVICE fp32_t from(fp16_t x) { return __half2float(x); }
  static SGL_DEVICE fp32_t from(bf16_t x) { return __bfloat162float(x); }
  static SGL_DEVICE fp32_t from(fp8_e4m3_t x) { return static_cast<float>(x); }
  static SGL_DEVICE fp32_t from(fp8_e5m2_t x) { return static_cast<float>(x); }
  template <typename U>
    requires std::is_arithmetic_v<U>
  static SGL_DEVICE fp32_t from(U x) {
    return static_cast<fp32_t>(x);
  }

  static SGL_DEVICE fp32_t abs(fp32_t x) { return fabsf(x); }
  /// Correctly rounded (IEEE) square root.
  static SGL_DEVICE fp32_t sqrt(fp32_t x) { return __fsqrt_rn(x); }
  /// Hardware approximation (MUFU.RSQ, ~2 ulp), the usual choice for normalisation.
  static SGL_DEVICE fp32_t rsqrt(fp32_t x) { return rsqrtf(x); }
  /// Full-range expf (accurate for large |x|, unlike __expf).
  static SGL_DEVICE fp32_t exp(fp32_t x) { return expf(x); }
  /// Full-range sinf/cosf: accurate for large arguments (rotary positions), unlike __sinf/__cosf.
  static SGL_DEVICE fp32_t sin(fp32_t x) { return sinf(x); }
  static SGL_DEVICE fp32_t cos(fp32_t x) { return cosf(x); }
  static SGL_DEVICE fp32_t max(fp32_t x, fp32_t y) { return fmaxf(x, y); }
  static SGL_DEVICE fp32_t min(fp32_t x, fp32_t y) { return fminf(x, y); }
};

template <>
struct dtype_trait<fp16_t> {
  using packed_type = fp16x2_t;
  using scalar_type = fp16_t;

  static SGL_DEVICE fp16_t from(fp16_t x) { return x; }
  static SGL_DEVICE fp16_t from(fp32_t x) { return __float2half_rn(x); }
  static SGL_DEVICE fp16_t from(bf16_t x) { return __float2half_rn(__bfloat162float(x)); }
  static SGL_DEVICE fp16_t from(fp8_e4m3_t x) { return static_cast<__half>(x); }
  static SGL_DEVICE fp16_t from(fp8_e5m2_t x) { return static_cast<__half>(x); }
  template <typename U>
    requires std::is_arithmetic_v<U>
  static SGL_DEVICE fp16_t from(U x) {
    return __float2half_rn(static_cast<float>(x));
  }

  static SGL_DEVICE fp16_t abs(fp16_t x) { return __habs(x); }
  static SGL_DEVICE fp16_t sqrt(fp16_t x) { return hsqrt(x); }
  static SGL_DEVICE fp16_t rsqrt(fp16_t x) { return hrsqrt(x); }
  static SGL_DEVICE fp16_t exp(fp16_t x) { return hexp(x); }
  static SGL_DEVICE fp16_t sin(fp16_t x) { return hsin(x); }
  static SGL_DEVICE fp16_t cos(fp16_t x) { return hcos(x); }
  static SGL_DEVICE fp16_t max(fp16_t x, fp16_t y) { return __hmax(x, y); }
  static SGL_DEVICE fp16_t min(fp16_t x, fp16_t y) { return __hmin(x, y); }
};

template <>
struct dtype_trait<bf16_t> {
  using packed_type = bf16x2_t;
  using scalar_type = bf16_t;

  static SGL_DEVICE bf16_t from(bf16_t x) { return x; }
  static SGL_DEVICE bf16_t from(fp32_t x) { return __float2bfloat16_rn(x); }
  static SGL_DEVICE bf16_t from(fp16_t x) { return __float2bfloat16_rn(__half2float(x)); }
  static SGL_DEVICE bf16_t from(fp8_e4m3_t x) { return __float2bfloat16_rn(static_cast<float>(x)); }
  static SGL_DEVICE bf16_t from(fp8_e5m2_t x) { return __float2bfloat16_rn(static_cast<float>(x)); }
  template <typename U>
    requires std::is_arithmetic_v<U>
  static SGL_DEVICE bf16_t from(U x) {
    return __float2bfloat16_rn(static_cast<float>(x));
  }

  static SGL_DEVICE bf16_t abs(bf16_t x) { return __habs(x); }
  static SGL_DEVICE bf16_t sqrt(bf16_t x) { return hsqrt(x); }
  static SGL_DEVICE bf16_t rsqrt(bf16_t x) { return hrsqrt(x); }
  static SGL_DEVICE bf16_t exp(bf16_t x) { return hexp(x); }
  static SGL_DEVICE bf16_t sin(bf16_t x) { return hsin(x); }
  static SGL_DEVICE bf16_t cos(bf16_t x) { return hcos(x); }
  static SGL_DEVICE bf16_t max(bf16_t x, bf16_t y) { return __hmax(x, y); }
  static SGL_DEVICE bf16_t min(bf16_t x, bf16_t y) { return __hmin(x, y); }
};

template <>
struct dtype_trait<fp32x2_t> {
  using packed_type = fp32x2_t;
  using scalar_type = fp32_t;
  using S = dtype_trait<fp32_t>;

  static SGL_DEVICE fp32x2_t from(fp32x2_t x) { return x; }
  static SGL_DEVICE fp32x2_t from(fp16x2_t x) { return __half22float2(x); }
  static SGL_DEVICE fp32x2_t from(bf16x2_t x) { return __bfloat1622float2(x); }
  static SGL_DEVICE fp32x2_t from(fp8x2_e4m3_t x) { return static_cast<float2>(x); }
  static SGL_DEVICE fp32x2_t from(fp8x2_e5m2_t x) { return static_cast<float2>(x); }

  static SGL_DEVICE fp32x2_t abs(fp32x2_t x) { return {S::abs(x.x), S::abs(x.y)}; }
  static SGL_DEVICE fp32x2_t sqrt(fp32x2_t x) { return {S::sqrt(x.x), S::sqrt(x.y)}; }
  static SGL_DEVICE fp32x2_t rsqrt(fp32x2_t x) { return {S::rsqrt(x.x), S::rsqrt(x.y)}; }
  static SGL_DEVICE fp32x2_t exp(fp32x2_t x) { return {S::exp(x.x), S::exp(x.y)}; }
  static SGL_DEVICE fp32x2_t sin(fp32x2_t x) { return {S::sin(x.x), S::sin(x.y)}; }
  static SGL_DEVICE fp32x2_t cos(fp32x2_t x) { return {S::cos(x.x), S::cos(x.y)}; }
  static SGL_DEVICE fp32x2_t max(fp32x2_t x, fp32x2_t y) { return {S::max(x.x, y.x), S::max(x.y, y.y)}; }
  static SGL_DEVICE fp32x2_t min(fp32x2_t x, fp32x2_t y) { return {S::min(x.x, y.x), S::min(x.y, y.y)}; }
};

template <>
struct dtype_trait<fp16x2_t> {
  using packed_type = fp16x2_t;
  using scalar_type = fp16_t;

  static SGL_DEVICE fp16x2_t from(fp16x2_t x) { return x; }
  static SGL_DEVICE fp16x2_t from(fp32x2_t x) { return __float22half2_rn(x); }
  static SGL_DEVICE fp16x2_t from(bf16x2_t x) { return __float22half2_rn(__bfloat1622float2(x)); }
  static SGL_DEVICE fp16x2_t from(fp8x2_e4m3_t x) { return static_cast<__half2>(x); }
  static SGL_DEVICE fp16x2_t from(fp8x2_e5m2_t x) { return static_cast<__half2>(x); }

  static SGL_DEVICE fp16x2_t abs(fp16x2_t x) { return __habs2(x); }
  static SGL_DEVICE fp16x2_t sqrt(fp16x2_t x) { return h2sqrt(x); }
  static SGL_DEVICE fp16x2_t rsqrt(fp16x2_t x) { return h2rsqrt(x); }
  static SGL_DEVICE fp16x2_t exp(fp16x2_t x) { return h2exp(x); }
  static SGL_DEVICE fp16x2_t sin(fp16x2_t x) { return h2sin(x); }
  static SGL_DEVICE fp16x2_t cos(fp16x2_t x) { return h2cos(x); }
  static SGL_DEVICE fp16x2_t max(fp16x2_t x, fp16x2_t y) { return __hmax2(x, y); }
  static SGL_DEVICE fp16x2_t min(fp16x2_t x, fp16x2_t y) { return __hmin2(x, y); }
};

template <>
struct dtype_trait<bf16x2_t> {
  using packed_type = bf16x2_t;
  using scalar_type = bf16_t;

  static SGL_DEVICE bf16x2_t from(bf16x2_t x) { return x; }
  static SGL_DEVICE bf16x2_t from(fp32x2_t x) { return __float22bfloat162_rn(x); }
  static SGL_DEVICE bf16x2_t from(fp16x2_t x) { return __float22bfloat162_rn(__half22float2(x)); }
  static SGL_DEVICE bf16x2_t from(fp8x2_e4m3_t x) { return __float22bfloat162_rn(static_cast<float2>(x)); }
  static SGL_DEVICE bf16x2_t from(fp8x2_e5m2_t x) { return __float22bfloat162_rn(static_cast<float2>(x)); }

  static SGL_DEVICE bf16x2_t abs(bf16x2_t x) { return __habs2(x); }
  static SGL_DEVICE bf16x2_t sqrt(bf16x2_t x) { return h2sqrt(x); }
  static SGL_DEVICE bf16x2_t rsqrt(bf16x2_t x) { return h2rsqrt(x); }
  static SGL_DEVICE bf16x2_t exp(bf16x2_t x) { return h2exp(x); }
  static SGL_DEVICE bf16x2_t sin(bf16x2_t x) { return h2sin(x); }
  static SGL_DEVICE bf16x2_t cos(bf16x2_t x) { return h2cos(x); }
  static SGL_DEVICE bf16x2_t max(bf16x2_t x, bf16x2_t y) { return __hmax2(x, y); }
  static SGL_DEVICE bf16x2_t min(bf16x2_t x, bf16x2_t y) { return __hmin2(x, y); }
};

/// Conversion-only traits for FP8 (E4M3 / E5M2): `from` rounds to nearest even and saturates
/// to the largest finite value (__NV_SATFINITE), matching torch's .to(float8_*) for in-range values.
template <typename Fp8, typename Fp8x2>
struct dtype_trait_fp8 {
  using packed_type = Fp8x2;
  using scalar_type = Fp8;

  static SGL_DEVICE Fp8 from(Fp8 x) { return x; }
  static SGL_DEVICE Fp8 from(fp32_t x) { return Fp8(x); }
  static SGL_DEVICE Fp8 from(fp16_t x) { return Fp8(x); }
  static SGL_DEVICE Fp8 from(bf16_t x) { return Fp8(x); }
  template <typename U>
    requires std::is_arithmetic_v<U>
  static SGL_DEVICE Fp8 from(U x) {
    return Fp8(static_cast<float>(x));
  }
};

template <typename Fp8x2>
struct dtype_trait_fp8x2 {
  using packed_type = Fp8x2;

  static SGL_DEVICE Fp8x2 from(Fp8x2 x) { return x; }
  static SGL_DEVICE Fp8x2 from(fp32x2_t x) { return Fp8x2(x); }
  static SGL_DEVICE Fp8x2 from(fp16x2_t x) { return Fp8x2(x); }
  static SGL_DEVICE Fp8x2 from(bf16x2_t x) { return Fp8x2(x); }
};

template <>
struct dtype_trait<fp8_e4m3_t> : dtype_trait_fp8<fp8_e4m3_t, fp8x2_e4m3_t> {};
template <>
struct dtype_trait<fp8_e5m2_t> : dtype_trait_fp8<fp8_e5m2_t, fp8x2_e5m2_t> {};
template <>
struct dtype_trait<fp8x2_e4m3_t> : dtype_trait_fp8x2<fp8x2_e4m3_t> {
  using scalar_type = fp8_e4m3_t;
};
template <>
struct dtype_trait<fp8x2_e5m2_t> : dtype_trait_fp8x2<fp8x2_e5m2_t> {
  using scalar_type = fp8_e5m2_t;
};

/// Two-element packed type of T (fp16_t -> fp16x2_t, bf16_t -> bf16x2_t, fp32_t -> fp32x2_t,
/// fp8_e4m3_t -> fp8x2_e4m3_t, fp8_e5m2_t -> fp8x2_e5m2_t). Use for paired math and conversions.
template <typename T>
using packed_t = typename dtype_trait<T>::packed_type;

namespace device {

/// Converts `value` (type From) to To via dtype_trait<To>::from; identity when To == From.
/// Scalars and packed pairs: e.g. cast<fp32x2_t, bf16x2_t>(v) uses __bfloat1622float2 and
/// cast<bf16x2_t>(f2) uses __float22bfloat162_rn. Float -> narrower rounds to nearest even.
/// Template params: To must have a dtype_trait; From any type accepted by dtype_trait<To>::from.
template <typename To, typename From>
SGL_DEVICE To cast(const From& value) {
  if constexpr (std::is_same_v<To, From>) {
    return value;
  } else {
    return dtype_trait<To>::from(value);
  }
}

}  // namespace device
