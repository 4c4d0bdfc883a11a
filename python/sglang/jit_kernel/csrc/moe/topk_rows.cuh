// topk_rows: the MoE routing engine (topk_softmax, topk_sigmoid, grouped_topk): one warp per token
// row scores its experts and picks the top k, ties to the lower expert index.
//
// Layout: expert e of a row lives in lane e % 32, slot e / 32, so every load of a warp reads 32
// consecutive logits (coalesced for any expert count, stride and alignment). Rows of up to
// 32 * kSlots experts keep their scores in registers (kSlots tiers 2..32, i.e. up to 1024 experts);
// wider rows (kSlots == 0) recompute each score from the row on every pass (L1-resident), so any
// expert count works.
//
// Selection is exact and deterministic: a score is turned into an order-preserving 32-bit key
// (order_key), a (key, expert) pair into a 64-bit code whose order is the selection order (higher
// key first, then the lower expert), and the i-th winner is the largest code below the (i-1)-th.
// Each step is one lane-local scan and two warp-wide integer reductions (__reduce_max_sync: the
// largest key, then among the lanes holding it the lowest expert); no state is written back, so
// slots need no dynamic indexing. Sums (softmax denominator, renormalisation) are warp butterflies
// or sequential in selection order: the same input gives the same bits on every run.
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, SymbolicSize, SymbolicDevice, data_ptr, verify_no_partial_overlap
#include <sgl_kernel/utils.h>   // For RuntimeCheck, div_ceil

#include <sgl_kernel/utils.cuh>  // For LaunchKernel, SGL_DEVICE, kWarpThreads, pdl_wait_primary, pdl_launch_dependents
#include <sgl_kernel/warp.cuh>   // For warp::reduce_max, warp::reduce_sum

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

namespace moe_routing {

/// How a logit becomes the weight written and the key the top-k is chosen on.
enum Scoring : int32_t {
  kSoftmax = 0,  // weight = key = softmax over the row of (softcap(x) + bias)
  kSigmoid = 1,  // weight = sigmoid(x), key = weight + bias
};

/// Kernel arguments of topk_rows_kernel. Strides in elements of their own tensor; every last dim
/// is contiguous.
struct TopkRowsParams {
  const void* gating;      // [num_tokens, num_experts], row stride gating_stride
  const float* bias;       // [num_experts], or nullptr
  float* weights;          // [num_tokens, topk], row stride weights_stride
  int32_t* ids;            // [num_tokens, topk], row stride ids_stride
  int64_t num_tokens;      // rows
  int64_t gating_stride;   // elements of the gating dtype
  int64_t weights_stride;  // elements (fp32)
  int64_t ids_stride;      // elements (int32)
  int32_t num_experts;     // E >= 1
  int32_t topk;            // 1 <= k <= (experts eligible after group selection)
  int32_t num_groups;      // 1: no grouping; else <= 32 groups of group_size experts (sigmoid only)
  int32_t group_size;      // num_experts / num_groups
  int32_t topk_group;      // groups kept (num_groups > 1)
  int32_t scoring;         // Scoring
  float softcap;           // > 0: x <- softcap * tanh(x / softcap) first (softmax only)
  float renorm_eps;        // added to the sum of the chosen weights when renormalising
  float scale;             // multiplies every written weight (after renormalising)
  bool renormalize;        // weight_i <- weight_i / (sum of the k chosen weights + renorm_eps)
};

/// Launch facts: kWarps rows per block of kThreads threads; rows past the grid cap are looped over.
struct TopkRowsConfig {
  static constexpr uint32_t kWarps = 4;
  static constexpr uint32_t kThreads = kWarps * device::kWarpThreads;
  static constexpr int64_t kMaxBlocks = 1 << 20;
};

/// An order-preserving key of a float: a < b  <=>  order_key(a) < order_key(b), -0 == +0; NaN maps
/// to 1, below every number; 0 is left for "not a candidate".
SGL_DEVICE uint32_t order_key(float v) {
  if (v != v) return 1u;
  const uint32_t bits = __float_as_uint(v + 0.0f);  // -0 + 0 = +0
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

/// The selection code of (key, expert e): larger code = chosen earlier (higher key, then lower e).
/// Key 0 (not a candidate) gives code 0, below every candidate.
SGL_DEVICE uint64_t select_code(uint32_t key, int32_t e) {
  return key == 0 ? 0ull : (uint64_t{key} << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(e));
}

/// Expert of a nonzero select_code.
SGL_DEVICE int32_t code_expert(uint64_t code) {
  return static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(code));
}

/// The row's logit of expert e as the scoring reads it: NaN read as -inf, then (softmax) the
/// softcap and the bias.
template <typename T>
SGL_DEVICE float read_logit(const TopkRowsParams& p, const T* row, int32_t e) {
  float v = static_cast<float>(row[e]);
  if (v != v) v = -INFINITY;
  if (p.scoring == kSoftmax) {
    if (p.softcap > 0.0f) v = p.softcap * tanhf(v / p.softcap);
    if (p.bias != nullptr) v += p.bias[e];
  }
  return v;
}

/// sigmoid in fp32: 1 / (1 + exp(-v)); -inf -> 0, +inf -> 1.
SGL_DEVICE float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

/// Row statistics of the softmax: the maximum logit and the sum of exp(logit - max).
struct SoftmaxStats {
  float max;
  float sum;
};

/// (weight, key) of expert e from its logit v.
SGL_DEVICE void score(
    const TopkRowsParams& p, const SoftmaxStats& stats, float v, int32_t e, float& weight, uint32_t& key) {
  if (p.scoring == kSoftmax) {
    weight = expf(v - stats.max) / stats.sum;
    key = order_key(weight);
  } else {
    weight = sigmoid(v);
    key = order_key(p.bias != nullptr ? weight + p.bias[e] : weight);
  }
}

/// Bit g set: group g is among the topk_group best of the row (num_groups <= 32), a group scored by
/// the sum of its two largest biased sigmoids (its largest one when group_size == 1; NaN as -inf),
/// ties to the lower group. Lane g scores group g from the row (recomputed: L1-resident).
template <typename T>
SGL_DEVICE uint32_t select_groups(const TopkRowsParams& p, const T* row, uint32_t lane) {
  uint32_t key = 0;
  if (lane < static_cast<uint32_t>(p.num_groups)) {
    float first = -INFINITY, second = -INFINITY;
    const int32_t begin = static_cast<int32_t>(lane) * p.group_size;
#pragma unroll 8
    for (int32_t e = begin; e < begin + p.group_size; ++e) {
      float s = sigmoid(read_logit(p, row, e)) + (p.bias != nullptr ? p.bias[e] : 0.0f);
      if (s != s) s = -INFINITY;
      if (s > first) {
        second = first;
        first = s;
      } else if (s > second) {
        second = s;
      }
    }
    key = order_key(p.group_size >= 2 ? first + second : first);
  }
  uint32_t chosen = 0;
  for (int32_t i = 0; i < p.topk_group; ++i) {
    const uint32_t top = __reduce_max_sync(0xFFFFFFFFu, key);
    const uint32_t ties = __ballot_sync(0xFFFFFFFFu, key == top);
    const uint32_t winner = __ffs(ties) - 1;  // the lowest group holding the top score
    chosen |= 1u << winner;
    if (lane == winner) key = 0;
  }
  return chosen;
}

/// The k winners of a row, written to weights/ids: `scan(prev, best, best_weight)` leaves in
/// best the lane's largest select_code below prev (0 if none) and in best_weight its weight.
/// Called by all 32 lanes of the warp.
template <typename Scan>
SGL_DEVICE void select_and_write(const TopkRowsParams& p, int64_t row, uint32_t lane, Scan&& scan) {
  float* weights = p.weights + row * p.weights_stride;
  int32_t* ids = p.ids + row * p.ids_stride;
  const bool single_pass = p.topk <= static_cast<int32_t>(device::kWarpThreads);
  uint64_t prev = ~0ull;
  float sum = 0.0f;
  float my_weight = 0.0f;  // of winner i, kept by lane i % 32
  int32_t my_id = 0;
  for (int32_t i = 0; i < p.topk; ++i) {
    uint64_t best = 0;
    float best_weight = 0.0f;
    scan(prev, best, best_weight);
    const uint32_t best_key = static_cast<uint32_t>(best >> 32);
    const uint32_t top_key = __reduce_max_sync(0xFFFFFFFFu, best_key);
    const uint32_t top_low = __reduce_max_sync(0xFFFFFFFFu, best_key == top_key ? static_cast<uint32_t>(best) : 0u);
    prev = (uint64_t{top_key} << 32) | top_low;
    const int32_t expert = code_expert(prev);
    const float weight = __shfl_sync(0xFFFFFFFFu, best_weight, static_cast<uint32_t>(expert) % device::kWarpThreads);
    sum += weight;
    const uint32_t slot = static_cast<uint32_t>(i) % device::kWarpThreads;
    if (lane == slot) {
      my_weight = weight;
      my_id = expert;
    }
    if (!single_pass && (slot == device::kWarpThreads - 1 || i == p.topk - 1) && lane <= slot) {
      const int32_t out = i - static_cast<int32_t>(slot) + static_cast<int32_t>(lane);
      weights[out] = my_weight;
      ids[out] = my_id;
    }
  }
  const float denom = p.renormalize ? sum + p.renorm_eps : 1.0f;
  if (single_pass) {
    if (lane < static_cast<uint32_t>(p.topk)) {
      weights[lane] = my_weight / denom * p.scale;
      ids[lane] = my_id;
    }
  } else if (p.renormalize || p.scale != 1.0f) {
    // Each lane rescales the entries it wrote itself (program order: no fence needed).
    for (int32_t i = static_cast<int32_t>(lane); i < p.topk; i += device::kWarpThreads) {
      weights[i] = weights[i] / denom * p.scale;
    }
  }
}

/// One warp per row (grid-stride over rows). kSlots > 0: the row's scores in registers, experts
/// e = slot * 32 + lane < 32 * kSlots; kSlots == 0: any expert count, scores recomputed per pass.
template <typename T, int kSlots>
__global__ void __launch_bounds__(TopkRowsConfig::kThreads) topk_rows_kernel(const TopkRowsParams p) {
  const uint32_t lane = threadIdx.x % device::kWarpThreads;
  const int64_t first_row = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / device::kWarpThreads;
  const int64_t row_step = int64_t{gridDim.x} * blockDim.x / device::kWarpThreads;
  device::pdl_wait_primary();
  device::pdl_launch_dependents();

  for (int64_t row = first_row; row < p.num_tokens; row += row_step) {
    const T* logits = static_cast<const T*>(p.gating) + row * p.gating_stride;
    const uint32_t groups = p.num_groups > 1 ? select_groups(p, logits, lane) : 0xFFFFFFFFu;
    const auto eligible = [&](int32_t e) { return p.num_groups <= 1 || ((groups >> (e / p.group_size)) & 1u) != 0; };

    if constexpr (kSlots > 0) {
      float v[kSlots];
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int32_t e = s * static_cast<int32_t>(device::kWarpThreads) + static_cast<int32_t>(lane);
        v[s] = e < p.num_experts ? read_logit(p, logits, e) : -INFINITY;
      }
      SoftmaxStats stats{0.0f, 1.0f};
      if (p.scoring == kSoftmax) {
        float m = v[0];
#pragma unroll
        for (int s = 1; s < kSlots; ++s) m = fmaxf(m, v[s]);
        stats.max = device::warp::reduce_max<float>(m);
        float local = 0.0f;
#pragma unroll
        for (int s = 0; s < kSlots; ++s) {
          const int32_t e = s * static_cast<int32_t>(device::kWarpThreads) + static_cast<int32_t>(lane);
          if (e < p.num_experts) local += expf(v[s] - stats.max);
        }
        stats.sum = device::warp::reduce_sum<float>(local);
      }
      float weight[kSlots];
      uint64_t code[kSlots];
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int32_t e = s * static_cast<int32_t>(device::kWarpThreads) + static_cast<int32_t>(lane);
        uint32_t key = 0;
        weight[s] = 0.0f;
        if (e < p.num_experts) score(p, stats, v[s], e, weight[s], key);
        code[s] = e < p.num_experts && eligible(e) ? select_code(key, e) : 0ull;
      }
      select_and_write(p, row, lane, [&](uint64_t prev, uint64_t& best, float& best_weight) {
#pragma unroll
        for (int s = 0; s < kSlots; ++s) {
          if (code[s] < prev && code[s] > best) {
            best = code[s];
            best_weight = weight[s];
          }
        }
      });
    } else {
      SoftmaxStats stats{0.0f, 1.0f};
      if (p.scoring == kSoftmax) {
        float m = -INFINITY;
        for (int32_t e = lane; e < p.num_experts; e += device::kWarpThreads) m = fmaxf(m, read_logit(p, logits, e));
        stats.max = device::warp::reduce_max<float>(m);
        float local = 0.0f;
        for (int32_t e = lane; e < p.num_experts; e += device::kWarpThreads) {
          local += expf(read_logit(p, logits, e) - stats.max);
        }
        stats.sum = device::warp::reduce_sum<float>(local);
      }
      select_and_write(p, row, lane, [&](uint64_t prev, uint64_t& best, float& best_weight) {
        for (int32_t e = lane; e < p.num_experts; e += device::kWarpThreads) {
          if (!eligible(e)) continue;
          float weight;
          uint32_t key;
          score(p, stats, read_logit(p, logits, e), e, weight, key);
          const uint64_t c = select_code(key, e);
          if (c < prev && c > best) {
            best = c;
            best_weight = weight;
          }
        }
      });
    }
  }
}

/// Launches topk_rows_kernel with the smallest register tier holding num_experts (or the
/// recomputing one past 1024 experts). num_tokens > 0.
template <typename T>
void launch_topk_rows(const TopkRowsParams& params, DLDevice device) {
  using namespace host;
  const int32_t e = params.num_experts;
  const auto kernel = e <= 64     ? topk_rows_kernel<T, 2>
                      : e <= 128  ? topk_rows_kernel<T, 4>
                      : e <= 256  ? topk_rows_kernel<T, 8>
                      : e <= 512  ? topk_rows_kernel<T, 16>
                      : e <= 1024 ? topk_rows_kernel<T, 32>
                                  : topk_rows_kernel<T, 0>;
  const int64_t blocks = div_ceil(params.num_tokens, int64_t{TopkRowsConfig::kWarps});
  const auto grid = static_cast<uint32_t>(std::min<int64_t>(blocks, TopkRowsConfig::kMaxBlocks));
  LaunchKernel(grid, TopkRowsConfig::kThreads, device).enable_pdl(true)(kernel, params);
}

}  // namespace moe_routing

namespace moe_routing {

/// The validated tensors of a routing call, unwrapped into TopkRowsParams (scoring, softcap,
/// grouping, renormalisation and scale left for the caller to fill). gating_output
/// [num_tokens, num_experts] of T, topk_weights fp32 and topk_ids int32 [num_tokens, topk], all
/// with contiguous last dims and any row strides, on one CUDA device; correction_bias fp32
/// contiguous [num_experts], or [0] for none. Outputs may not overlap each other or the inputs.
/// Throws PanicError (Python RuntimeError) naming the tensor on a mismatch.
template <typename T>
TopkRowsParams unwrap_topk_rows(
    tvm::ffi::TensorView topk_weights,
    tvm::ffi::TensorView topk_ids,
    tvm::ffi::TensorView gating_output,
    tvm::ffi::TensorView correction_bias,
    DLDevice& device) {
  using namespace host;

  // Validate
  SymbolicSize num_tokens{"num_tokens"};
  SymbolicSize num_experts{"num_experts"};
  SymbolicSize topk{"topk"};
  SymbolicSize bias_len{"correction_bias_len"};
  SymbolicSize gating_stride{"gating_stride"};
  SymbolicSize weights_stride{"weights_stride"};
  SymbolicSize ids_stride{"ids_stride"};
  SymbolicDevice device_;
  device_.set_options<kDLCUDA>();
  TensorMatcher({num_tokens, num_experts})  //
      .with_strides({gating_stride, 1})
      .with_dtype<T>()
      .with_device<kDLCUDA>(device_)
      .verify(gating_output, "gating_output");
  TensorMatcher({num_tokens, topk})  //
      .with_strides({weights_stride, 1})
      .with_dtype<float>()
      .with_device<kDLCUDA>(device_)
      .verify(topk_weights, "topk_weights");
  TensorMatcher({num_tokens, topk})  //
      .with_strides({ids_stride, 1})
      .with_dtype<int32_t>()
      .with_device<kDLCUDA>(device_)
      .verify(topk_ids, "topk_ids");
  TensorMatcher({bias_len})  //
      .with_dtype<float>()
      .with_device<kDLCUDA>(device_)
      .verify(correction_bias, "correction_bias");
  RuntimeCheck(
      num_experts.unwrap() >= 1 && num_experts.unwrap() < (int64_t{1} << 31),
      "gating_output: num_experts must be in [1, 2^31), got ",
      num_experts.unwrap());
  RuntimeCheck(
      topk.unwrap() >= 1 && topk.unwrap() <= num_experts.unwrap(),
      "topk_weights: topk must be in [1, num_experts = ",
      num_experts.unwrap(),
      "], got ",
      topk.unwrap());
  RuntimeCheck(
      bias_len.unwrap() == 0 || bias_len.unwrap() == num_experts.unwrap(),
      "correction_bias: length must be num_experts = ",
      num_experts.unwrap(),
      " (or 0 for none), got ",
      bias_len.unwrap());
  verify_no_self_overlap(topk_weights, "topk_weights");
  verify_no_self_overlap(topk_ids, "topk_ids");
  verify_no_partial_overlap(topk_weights, "topk_weights", topk_ids, "topk_ids", /*allow_same=*/false);
  verify_no_partial_overlap(topk_weights, "topk_weights", gating_output, "gating_output", /*allow_same=*/false);
  verify_no_partial_overlap(topk_ids, "topk_ids", gating_output, "gating_output", /*allow_same=*/false);
  verify_no_partial_overlap(topk_weights, "topk_weights", correction_bias, "correction_bias", /*allow_same=*/false);
  verify_no_partial_overlap(topk_ids, "topk_ids", correction_bias, "correction_bias", /*allow_same=*/false);

  // Unwrap
  device = device_.unwrap();
  return TopkRowsParams{
      .gating = data_ptr<const void>(gating_output),
      .bias = bias_len.unwrap() > 0 ? data_ptr<const float>(correction_bias) : nullptr,
      .weights = data_ptr<float>(topk_weights),
      .ids = data_ptr<int32_t>(topk_ids),
      .num_tokens = num_tokens.unwrap(),
      .gating_stride = gating_stride.unwrap(),
      .weights_stride = weights_stride.unwrap(),
      .ids_stride = ids_stride.unwrap(),
      .num_experts = static_cast<int32_t>(num_experts.unwrap()),
      .topk = static_cast<int32_t>(topk.unwrap()),
      .num_groups = 1,
      .group_size = static_cast<int32_t>(num_experts.unwrap()),
      .topk_group = 1,
      .scoring = kSoftmax,
      .softcap = 0.0f,
      .renorm_eps = 0.0f,
      .scale = 1.0f,
      .renormalize = false,
  };
}

}  // namespace moe_routing
