// Top-k routing floor probe (driver: probe_topk_floor.py): bare kernels shaped like engine v2 of
// topk_rows.cuh (one warp per row of E = 32 * kPer fp32 logits, lane l loading experts
// [l * kPer, l * kPer + kPer) with 16-byte loads after the PDL wait, 4 warps per CTA, lanes 0..7
// storing 8 fp32 weights and 8 int32 ids), each doing one more piece of the routing chain:
//   kStore    no load: the launch and the 8 + 8 stores
//   kLoad     + the row load (each lane's run maximum stored: the loads stay live)
//   kMax      + one warp max-reduction (__reduce_max_sync of order keys, as the first step)
//   kSteps    + k = 8 dependent steps of __reduce_max_sync and __ballot_sync, the winner lane
//             dropping its key (no rescan of its run)
//   kRescan   + the winner clears its slot and rescans its run (the real step, as the lookahead
//             kernel orders it; the ids are the real top-8)
//   kSoftmax  + the softmax statistics and weights, the lookahead kernel without its options
//             (no softcap, bias, groups, renormalisation; aligned rows; k = 8 at compile time):
//             the same bits as topk_softmax
// No strides, tails, options or validation: the driver checks what it can against topk_softmax.
// What the rows told: docs/perf_notes.md ("Top-k routing floor").
#pragma once
#include <sgl_kernel/tensor.h>  // For tvm::ffi::TensorView

#include <sgl_kernel/utils.cuh>  // For LaunchKernel, SGL_DEVICE, kWarpThreads, pdl_wait_primary, pdl_launch_dependents

#include <cmath>
#include <cstdint>

#include "../csrc/moe/topk_rows.cuh"  // For order_key_if, order_key_value, run_best, run_best_without

namespace {

enum ProbeMode : int64_t { kStore = 0, kLoad = 1, kMax = 2, kSteps = 3, kRescan = 4, kSoftmax = 5 };

constexpr int kProbeTopk = 8;
constexpr uint32_t kProbeWarps = 4;

/// Kernel arguments: gating [num_tokens, 32 * kPer] fp32 contiguous; weights, ids [num_tokens, 8].
struct TopkFloorParams {
  const float* gating;
  float* weights;
  int32_t* ids;
  int64_t num_tokens;
};

/// The routing steps of kSteps, kRescan and kSoftmax on a loaded run, and the stores.
template <int kPer, int kMode>
SGL_DEVICE void topk_floor_steps(float (&x)[kPer], float* weights, int32_t* ids, uint32_t lane) {
  constexpr uint32_t kFull = 0xFFFFFFFFu;
  const int32_t base = static_cast<int32_t>(lane) * kPer;
  uint32_t key[kPer];
#pragma unroll
  for (int s = 0; s < kPer; ++s) key[s] = moe_routing::order_key_if(true, x[s]);
  uint32_t best_key;
  int32_t best_slot;
  moe_routing::run_best<kPer>(key, best_key, best_slot);
  uint32_t top = __reduce_max_sync(kFull, best_key);
  const uint32_t lanes_below = (1u << lane) - 1u;
  const float row_max = moe_routing::order_key_value(top);
  float row_sum = 0.0f;
  if constexpr (kMode == kSoftmax) {
#pragma unroll
    for (int s = 0; s < kPer; ++s) row_sum += expf(x[s] - row_max);
  }

  uint32_t my_key = top;
  int32_t id = 0;
  if constexpr (kMode == kSteps) {
#pragma unroll
    for (int i = 0; i < kProbeTopk; ++i) {
      const uint32_t holders = __ballot_sync(kFull, best_key == top);
      const bool mine = best_key == top && (holders & lanes_below) == 0;
      id = lane == static_cast<uint32_t>(i) ? static_cast<int32_t>(__ffs(holders) - 1) : id;
      my_key = lane == static_cast<uint32_t>(i) ? top : my_key;
      best_key = mine ? 0u : best_key;
      top = __reduce_max_sync(kFull, best_key);
    }
  } else {
    uint32_t rest[kPer];
    uint32_t next_key;
    int32_t next_slot;
    moe_routing::run_best_without<kPer>(key, best_slot, rest, next_key, next_slot);
#pragma unroll
    for (int i = 0; i < kProbeTopk; ++i) {
      const bool holds = best_key == top;
      const uint32_t holders = __ballot_sync(kFull, holds);
      const bool mine = holds && (holders & lanes_below) == 0;
      const int32_t expert = __shfl_sync(kFull, base + best_slot, static_cast<uint32_t>(__ffs(holders) - 1));
      best_key = mine ? next_key : best_key;
      const uint32_t next_top = __reduce_max_sync(kFull, best_key);
      best_slot = mine ? next_slot : best_slot;
#pragma unroll
      for (int s = 0; s < kPer; ++s) key[s] = mine ? rest[s] : key[s];
      moe_routing::run_best_without<kPer>(key, best_slot, rest, next_key, next_slot);
      id = lane == static_cast<uint32_t>(i) ? expert : id;
      my_key = lane == static_cast<uint32_t>(i) ? top : my_key;
      if (kMode == kSoftmax && i < 5) row_sum = row_sum + __shfl_xor_sync(kFull, row_sum, 16u >> i);  // unrolled
      top = next_top;
    }
  }
  if (lane < kProbeTopk) {
    const float v = moe_routing::order_key_value(my_key);
    weights[lane] = kMode == kSoftmax ? expf(v - row_max) / row_sum : v;
    ids[lane] = id;
  }
}

/// A row of every mode but kStore: the load, then kLoad / kMax here or the steps.
template <int kPer, int kMode>
SGL_DEVICE void topk_floor_row(const float* row, float* weights, int32_t* ids, uint32_t lane) {
  constexpr uint32_t kFull = 0xFFFFFFFFu;
  const int32_t base = static_cast<int32_t>(lane) * kPer;
  float x[kPer];  // the lane's run, NaN as -inf
  const float* run = row + base;
#pragma unroll
  for (int j = 0; j < kPer / 4; ++j) {
    const float4 v = reinterpret_cast<const float4*>(run)[j];
    x[4 * j] = v.x;
    x[4 * j + 1] = v.y;
    x[4 * j + 2] = v.z;
    x[4 * j + 3] = v.w;
  }
#pragma unroll
  for (int s = 0; s < kPer; ++s) x[s] = x[s] != x[s] ? -INFINITY : x[s];

  if constexpr (kMode == kLoad || kMode == kMax) {
    float m = x[0];
#pragma unroll
    for (int s = 1; s < kPer; ++s) m = fmaxf(m, x[s]);
    if constexpr (kMode == kMax) m = moe_routing::order_key_value(__reduce_max_sync(kFull, moe_routing::order_key(m)));
    if (lane < kProbeTopk) {
      weights[lane] = m;
      ids[lane] = static_cast<int32_t>(lane);
    }
  } else {
    topk_floor_steps<kPer, kMode>(x, weights, ids, lane);
  }
}

/// One warp per row (rows past num_tokens return: the grid covers them exactly).
template <int kPer, int kMode>
__global__ void __launch_bounds__(kProbeWarps * 32) topk_floor_kernel(const TopkFloorParams p) {
  constexpr int kExperts = 32 * kPer;
  const uint32_t lane = threadIdx.x % device::kWarpThreads;
  const int64_t row = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / device::kWarpThreads;
  device::pdl_wait_primary();
  device::pdl_launch_dependents();
  if (row >= p.num_tokens) return;
  float* weights = p.weights + row * kProbeTopk;  // [8]
  int32_t* ids = p.ids + row * kProbeTopk;        // [8]
  if constexpr (kMode == kStore) {
    if (lane < kProbeTopk) {
      weights[lane] = static_cast<float>(lane);
      ids[lane] = static_cast<int32_t>(lane);
    }
  } else {
    topk_floor_row<kPer, kMode>(p.gating + row * kExperts, weights, ids, lane);
  }
}

template <int kPer>
void launch_topk_floor(const TopkFloorParams& params, int64_t mode, DLDevice device) {
  const auto grid = static_cast<uint32_t>((params.num_tokens + kProbeWarps - 1) / kProbeWarps);
  host::LaunchKernel launch(grid, kProbeWarps * 32, device);
  launch.enable_pdl(true);
  switch (mode) {
    case kStore:
      return launch(topk_floor_kernel<kPer, kStore>, params);
    case kLoad:
      return launch(topk_floor_kernel<kPer, kLoad>, params);
    case kMax:
      return launch(topk_floor_kernel<kPer, kMax>, params);
    case kSteps:
      return launch(topk_floor_kernel<kPer, kSteps>, params);
    case kRescan:
      return launch(topk_floor_kernel<kPer, kRescan>, params);
    default:
      return launch(topk_floor_kernel<kPer, kSoftmax>, params);
  }
}

/// weights, ids [num_tokens, 8] (fp32, int32) from gating [num_tokens, E] fp32, E in {128, 256},
/// all contiguous and 16-byte aligned, num_tokens > 0; mode: ProbeMode.
void topk_floor(tvm::ffi::TensorView weights, tvm::ffi::TensorView ids, tvm::ffi::TensorView gating, int64_t mode) {
  const TopkFloorParams params{
      .gating = static_cast<const float*>(gating.data_ptr()),
      .weights = static_cast<float*>(weights.data_ptr()),
      .ids = static_cast<int32_t*>(ids.data_ptr()),
      .num_tokens = gating.size(0),
  };
  if (gating.size(1) == 128) return launch_topk_floor<4>(params, mode, gating.device());
  return launch_topk_floor<8>(params, mode, gating.device());
}

}  // namespace
