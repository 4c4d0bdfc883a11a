// Type-dispatched device math: device::math::{max, min, abs, sqrt, rsqrt, exp, sin, cos}.
//
// Each forwards to dtype_trait<T> (see type.cuh for precision notes: fp32 rsqrt is the hardware
// approximation, sqrt/exp/sin/cos are the accurate full-range versions). T: fp32_t, fp16_t,
// bf16_t and their packed x2 types (element-wise).
#pragma once

#include <sgl_kernel/type.cuh>   // For dtype_trait
#include <sgl_kernel/utils.cuh>  // For SGL_DEVICE

namespace device::math {

/// Larger of a and b (NaN-ignoring like fmaxf for fp32).
template <typename T>
SGL_DEVICE T max(T a, T b) {
  return dtype_trait<T>::max(a, b);
}

/// Smaller of a and b (NaN-ignoring like fminf for fp32).
template <typename T>
SGL_DEVICE T min(T a, T b) {
  return dtype_trait<T>::min(a, b);
}

/// |x|.
template <typename T>
SGL_DEVICE T abs(T x) {
  return dtype_trait<T>::abs(x);
}

/// Square root of x.
template <typename T>
SGL_DEVICE T sqrt(T x) {
  return dtype_trait<T>::sqrt(x);
}

/// 1 / sqrt(x).
template <typename T>
SGL_DEVICE T rsqrt(T x) {
  return dtype_trait<T>::rsqrt(x);
}

/// e^x.
template <typename T>
SGL_DEVICE T exp(T x) {
  return dtype_trait<T>::exp(x);
}

/// sin(x), x in radians.
template <typename T>
SGL_DEVICE T sin(T x) {
  return dtype_trait<T>::sin(x);
}

/// cos(x), x in radians.
template <typename T>
SGL_DEVICE T cos(T x) {
  return dtype_trait<T>::cos(x);
}

}  // namespace device::math
