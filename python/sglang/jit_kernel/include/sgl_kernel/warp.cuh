// Warp-level reductions: device::warp::reduce_sum / reduce_max (butterfly __shfl_xor_sync), and
// reduce_max_nonneg (one redux.sync on the bit patterns of non-negative floats).
#pragma once

#include <sgl_kernel/math.cuh>   // For math::max
#include <sgl_kernel/utils.cuh>  // For SGL_DEVICE, kWarpThreads

#include <cstdint>

namespace device::warp {

/// Sum of `value` over each group of kNumLanes consecutive lanes (default: the whole warp).
///
/// Template params: T a type __shfl_xor_sync accepts and `+` adds (fp32_t, fp16_t, bf16_t,
/// fp16x2_t, bf16x2_t, int32/uint32/int64/uint64/double); kNumLanes a power of two in [1, 32].
/// Result: every lane gets its group's total (butterfly reduction, no lane is special).
/// Sync: all 32 lanes of the warp must call it together (full mask); no __syncwarp() is owed
/// afterwards. Summation order differs per lane count, so fp results may differ in the last bits
/// from a serial sum (all lanes of a group get bit-identical results).
/// Example: lanes 0..31 holding their lane id: every lane gets 496; with kNumLanes = 16 lanes
/// 0..15 get 120 and lanes 16..31 get 376.
template <typename T, uint32_t kNumLanes = kWarpThreads>
SGL_DEVICE T reduce_sum(T value) {
  static_assert(
      kNumLanes >= 1 && kNumLanes <= kWarpThreads && (kNumLanes & (kNumLanes - 1)) == 0,
      "kNumLanes must be a power of two in [1, 32]");
#pragma unroll
  for (uint32_t mask = kNumLanes / 2; mask > 0; mask >>= 1) {
    value = value + __shfl_xor_sync(0xffffffffu, value, mask, kWarpThreads);
  }
  return value;
}

/// Maximum of `value` over each group of kNumLanes consecutive lanes (default: the whole warp),
/// using math::max (dtype_trait<T>::max, so NaN-ignoring for fp32).
///
/// Template params: T with a dtype_trait and __shfl_xor_sync support (fp32_t, fp16_t, bf16_t,
/// fp16x2_t, bf16x2_t); kNumLanes a power of two in [1, 32].
/// Result: every lane gets its group's maximum. Sync: all 32 lanes must call it together.
/// Example: lanes 0..31 holding their lane id: every lane gets 31; with kNumLanes = 8 lanes
/// 0..7 get 7, lanes 8..15 get 15, and so on.
template <typename T, uint32_t kNumLanes = kWarpThreads>
SGL_DEVICE T reduce_max(T value) {
  static_assert(
      kNumLanes >= 1 && kNumLanes <= kWarpThreads && (kNumLanes & (kNumLanes - 1)) == 0,
      "kNumLanes must be a power of two in [1, 32]");
#pragma unroll
  for (uint32_t mask = kNumLanes / 2; mask > 0; mask >>= 1) {
    value = math::max<T>(value, __shfl_xor_sync(0xffffffffu, value, mask, kWarpThreads));
  }
  return value;
}

/// Maximum over the whole warp of a non-negative float that is not NaN (an absolute maximum built
/// with fmaxf from 0, for example): such floats order as their bit patterns do as unsigned
/// integers, so one redux.sync (__reduce_max_sync, compute capability 8.0+) replaces reduce_max's
/// five dependent shuffle levels. Exact: the same value reduce_max returns for such inputs (+inf
/// included). A negative or NaN input gives an unspecified result.
/// Sync: all 32 lanes of the warp must call it together (full mask).
/// Example: lanes 0..31 holding float(lane): every lane gets 31.0f.
SGL_DEVICE float reduce_max_nonneg(float value) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(value)));
#else
  return reduce_max<float>(value);
#endif
}

}  // namespace device::warp
