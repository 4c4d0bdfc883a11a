// CTA-level (thread block) reductions: device::cta::reduce_max / reduce_sum / reduce_max_nonneg.
#pragma once

#include <sgl_kernel/utils.cuh>  // For SGL_DEVICE, kWarpThreads
#include <sgl_kernel/warp.cuh>   // For warp::reduce_max, warp::reduce_sum

#include <cstdint>

namespace device::cta {

namespace detail {

/// Shared two-level reduction: warp reduce, per-warp partials to smem, warp 0 reduces them.
/// kNonneg (fp32 maxima only): warp::reduce_max_nonneg at both levels.
template <bool kIsMax, typename T, bool kNonneg = false>
SGL_DEVICE void reduce_to_smem(T value, T* smem, T identity) {
  const uint32_t lane = threadIdx.x % kWarpThreads;
  const uint32_t warp_id = threadIdx.x / kWarpThreads;
  const uint32_t num_warps = (blockDim.x + kWarpThreads - 1) / kWarpThreads;
  if constexpr (kNonneg) {
    value = warp::reduce_max_nonneg(value);
  } else if constexpr (kIsMax) {
    value = warp::reduce_max<T>(value);
  } else {
    value = warp::reduce_sum<T>(value);
  }
  if (lane == 0) smem[warp_id] = value;
  __syncthreads();
  if (warp_id == 0) {
    value = lane < num_warps ? smem[lane] : identity;
    if constexpr (kNonneg) {
      value = warp::reduce_max_nonneg(value);
    } else if constexpr (kIsMax) {
      value = warp::reduce_max<T>(value);
    } else {
      value = warp::reduce_sum<T>(value);
    }
    // Every lane of warp 0 has read its partial before the shuffles above, so lane 0 may overwrite smem[0].
    if (lane == 0) smem[0] = value;
  }
}

}  // namespace detail

/// Maximum of `value` over all threads of the (1D) CTA, written to smem[0].
///
/// Template params: T as for warp::reduce_max (fp32_t, fp16_t, bf16_t, ...).
/// Inputs: `smem` shared memory of at least blockDim.x / 32 elements of T; `min_value` an identity
/// for max (e.g. -INFINITY, or 0 for non-negative data such as absolute values).
/// Constraints: 1D block (threadIdx.x only), blockDim.x a multiple of 32 (<= 1024); every thread of
/// the CTA calls it (it contains __syncthreads()).
/// Sync owed: the result lands in smem[0], written by thread 0 after the call's internal barrier;
/// call __syncthreads() before any thread reads smem[0], and again before `smem` is reused.
/// Example: 256 threads holding threadIdx.x -> after __syncthreads(), smem[0] == 255 for everyone.
template <typename T>
SGL_DEVICE void reduce_max(T value, T* smem, T min_value) {
  detail::reduce_to_smem<true>(value, smem, min_value);
}

/// Maximum of a non-negative, non-NaN fp32 `value` (an absolute maximum) over all threads of the
/// (1D) CTA, written to smem[0]: reduce_max(value, smem, 0.0f) with one redux.sync per level
/// instead of five shuffles (warp::reduce_max_nonneg; exact, the same value).
/// Inputs, constraints and sync owed: as reduce_max (smem of at least blockDim.x / 32 floats).
/// Example: 256 threads holding float(threadIdx.x) -> after __syncthreads(), smem[0] == 255.0f.
SGL_DEVICE void reduce_max_nonneg(float value, float* smem) {
  detail::reduce_to_smem<true, float, true>(value, smem, 0.0f);
}

/// Sum of `value` over all threads of the (1D) CTA, written to smem[0].
///
/// Template params: T as for warp::reduce_sum (fp32_t recommended for accuracy).
/// Inputs: `smem` shared memory of at least blockDim.x / 32 elements of T; `zero` the additive
/// identity (default T{}, i.e. 0).
/// Constraints and sync owed: same as reduce_max (1D block, blockDim.x a multiple of 32, all threads
/// call it; __syncthreads() before reading smem[0] and before reusing smem).
/// Example: 256 threads holding 1.0f -> after __syncthreads(), smem[0] == 256.0f for everyone.
template <typename T>
SGL_DEVICE void reduce_sum(T value, T* smem, T zero = T{}) {
  detail::reduce_to_smem<false>(value, smem, zero);
}

}  // namespace device::cta
