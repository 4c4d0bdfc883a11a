// topk_rows: the MoE routing engine (topk_softmax, topk_sigmoid, grouped_topk): a warp scores the
// experts of a token row (of several rows in the multirow kernel) and picks the top k, ties to the
// lower expert index. Two engines: the first (v1), described here, and engine v2 (a lane owns a
// run of consecutive experts; its section below, from topk_rows_v2).
//
// Engine v1 layout: expert e of a row lives in lane e % 32, slot e / 32, so every load of a warp reads 32
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

// For TensorMatcher, SymbolicSize, SymbolicDevice, data_ptr, verify_no_partial_overlap,
// verify_no_self_overlap
#include <sgl_kernel/tensor.h>
#include <sgl_kernel/utils.h>  // For RuntimeCheck, div_ceil

#include <sgl_kernel/utils.cuh>  // For LaunchKernel, SGL_DEVICE, kWarpThreads, pdl_wait_primary, pdl_launch_dependents
#include <sgl_kernel/warp.cuh>   // For warp::reduce_max, warp::reduce_sum

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <type_traits>
#include <utility>

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
  bool vec;                // engine v2: every row start is aligned for the run vector loads
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

/// 1 / d correctly rounded, the bits of the IEEE division 1.0f / d, for d in [1, 2^125] (the caller
/// checks the range): the approximate reciprocal and the two fused corrections of the compiler's
/// division fast path (for a numerator of 1), without its range check and the branch to the slow
/// path that the check guards. (Host builds divide.)
SGL_DEVICE float reciprocal_in_range(float d) {
#ifdef __CUDA_ARCH__
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  r = fmaf(r, fmaf(r, -d, 1.0f), r);
  return fmaf(r, fmaf(r, -d, 1.0f), r);
#else
  return 1.0f / d;
#endif
}

/// sig[s] = sigmoid(v[s]) for a run, the same bits: when every 1 + exp(-v) lies in [1, 2^125] (v >
/// about -86.6, NaN excluded) by reciprocal_in_range, else by the division. One range test per run,
/// so the compiler interleaves the run's sigmoids (the division's per-value slow-path branch would
/// make each its own block).
template <int kPer>
SGL_DEVICE void sigmoid_run(const float (&v)[kPer], float (&sig)[kPer]) {
  float d[kPer];
  bool in_range = true;
#pragma unroll
  for (int s = 0; s < kPer; ++s) {
    d[s] = 1.0f + expf(-v[s]);
    in_range = in_range & (d[s] <= 0x1p125f);
  }
  if (in_range) {
#pragma unroll
    for (int s = 0; s < kPer; ++s) sig[s] = reciprocal_in_range(d[s]);
  } else {
#pragma unroll
    for (int s = 0; s < kPer; ++s) sig[s] = 1.0f / d[s];
  }
}

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

// ---------------------------------------------------------------------------------------------
// Engine v2 (rows of <= 1024 experts, topk <= 32, groups made of whole runs; the engine above
// takes every other shape).
//
// Layout: lane l owns the kPer consecutive experts [l * kPer, l * kPer + kPer) (a "run"), loaded
// with 16-byte vector loads when every row start is aligned (vec), so a group of consecutive
// experts lies in consecutive lanes. Selection keys are 32-bit order keys of a score whose order is
// the selection order: the logit itself where the weight is a monotone function of it (softmax:
// softcap(x) + bias; sigmoid without bias: x), else sigmoid(x) + bias. Choosing on the logit is
// exact: two logits whose fp32 probabilities round equal are still ordered as the exact
// probabilities are. Each lane keeps the best (key, slot) of its run (ties to the lower slot);
// a step is one __reduce_max_sync of the lane bests and one ballot: the lowest lane holding the
// top key holds the lowest expert with it (runs are ordered), so ties go to the lower expert
// with one integer reduction per step. The winner lane records its expert in shared memory,
// clears that slot and rescans its run (a depth-log2(kPer) tree). After k steps lane i < k reads
// winner i, reloads its logit (L1-resident) and computes its weight; sums are warp butterflies
// (deterministic). Grouped routing (runs never straddle groups: group_size % kPer == 0 and
// group_size / kPer a power of two) scores a group by the top-2 of its runs merged over its lanes
// (butterfly), keeps topk_group groups by topk_group reduce+ballot steps, and clears the keys of
// the other groups' lanes. The sorted kernels (top-8, full rows of 128 / 256 experts, and DeepSeek-V3's
// grouping) sort each lane's keys packed with their expert and take a step per warp maximum
// (lookahead_rows, kSorted).
// ---------------------------------------------------------------------------------------------

/// Inverse of order_key for keys >= 2 (key 1, NaN, decodes to NaN).
SGL_DEVICE float order_key_value(uint32_t key) {
  if (key == 1u) return __uint_as_float(0x7FC00000u);
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key);
}

/// The vector type of `kBytes` (2, 4, 8 or 16) bytes.
template <int kBytes>
struct VecOf;
template <>
struct VecOf<2> {
  using type = uint16_t;
};
template <>
struct VecOf<4> {
  using type = uint32_t;
};
template <>
struct VecOf<8> {
  using type = uint2;
};
template <>
struct VecOf<16> {
  using type = uint4;
};

/// Bytes of the widest load a run of kPer elements of T is read with (the host's alignment test).
template <typename T, int kPer>
constexpr int run_vec_bytes() {
  constexpr int bytes = kPer * static_cast<int>(sizeof(T));
  return bytes >= 16 ? 16 : bytes;
}

/// The run of `lane` as floats (NaN read as -inf); experts >= num_experts read as -inf.
template <typename T, int kPer>
SGL_DEVICE void load_run(const TopkRowsParams& p, const T* row, int32_t base, float (&x)[kPer]) {
  constexpr int kVecBytes = run_vec_bytes<T, kPer>();
  constexpr int kPerVec = kVecBytes / static_cast<int>(sizeof(T));
  using Vec = typename VecOf<kVecBytes>::type;
  if (p.vec && base + kPer <= p.num_experts) {
    alignas(16) T tmp[kPer];
#pragma unroll
    for (int j = 0; j < kPer / kPerVec; ++j) {
      reinterpret_cast<Vec*>(tmp)[j] = reinterpret_cast<const Vec*>(row + base)[j];
    }
#pragma unroll
    for (int s = 0; s < kPer; ++s) x[s] = static_cast<float>(tmp[s]);
  } else {
#pragma unroll
    for (int s = 0; s < kPer; ++s) x[s] = base + s < p.num_experts ? static_cast<float>(row[base + s]) : -INFINITY;
  }
#pragma unroll
  for (int s = 0; s < kPer; ++s) {
    if (x[s] != x[s]) x[s] = -INFINITY;
  }
}

/// The best (key, slot) of a run, ties to the lower slot (a tree: the right half wins only when
/// strictly greater).
template <int kPer>
SGL_DEVICE void run_best(const uint32_t (&key)[kPer], uint32_t& best_key, int32_t& best_slot) {
  uint32_t k[kPer];
  int32_t i[kPer];
#pragma unroll
  for (int s = 0; s < kPer; ++s) {
    k[s] = key[s];
    i[s] = s;
  }
#pragma unroll
  for (int width = 1; width < kPer; width *= 2) {
#pragma unroll
    for (int s = 0; s + width < kPer; s += 2 * width) {
      const bool right = k[s + width] > k[s];
      k[s] = right ? k[s + width] : k[s];
      i[s] = right ? i[s + width] : i[s];
    }
  }
  best_key = k[0];
  best_slot = i[0];
}

/// The weight written for expert e of the row (its logit reloaded: L1-resident), from the softmax
/// statistics (softmax) or the sigmoid.
template <typename T>
SGL_DEVICE float v2_weight(const TopkRowsParams& p, const T* row, int32_t e, float row_max, float row_sum) {
  float x = static_cast<float>(row[e]);
  if (x != x) x = -INFINITY;
  if (p.scoring == kSoftmax) {
    if (p.softcap > 0.0f) x = p.softcap * tanhf(x / p.softcap);
    if (p.bias != nullptr) x += p.bias[e];
    return expf(x - row_max) / row_sum;
  }
  return sigmoid(x);
}

/// One warp per row (grid-stride), runs of kPer experts per lane; topk <= 32; num_experts <= 32 *
/// kPer; grouped rows with the run conditions above (the host checks them). The kernel of rows of
/// 257..1024 experts (runs of 16 or 32, too long for the lookahead kernel's two copies of a run):
/// the winners' experts go through shared memory.
template <typename T, int kPer>
__global__ void __launch_bounds__(TopkRowsConfig::kThreads) topk_rows_v2_kernel(const TopkRowsParams p) {
  __shared__ int32_t winners[TopkRowsConfig::kWarps][device::kWarpThreads];
  const uint32_t lane = threadIdx.x % device::kWarpThreads;
  const uint32_t warp = threadIdx.x / device::kWarpThreads;
  const int64_t first_row = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / device::kWarpThreads;
  const int64_t row_step = int64_t{gridDim.x} * blockDim.x / device::kWarpThreads;
  const int32_t base = static_cast<int32_t>(lane) * kPer;
  device::pdl_wait_primary();
  device::pdl_launch_dependents();

  for (int64_t row = first_row; row < p.num_tokens; row += row_step) {
    const T* logits = static_cast<const T*>(p.gating) + row * p.gating_stride;
    float x[kPer];
    load_run<T, kPer>(p, logits, base, x);

    // Keys (and, with a bias, the biased sigmoids the grouping scores).
    uint32_t key[kPer];
    float biased[kPer];  // sigmoid with bias: sigmoid(x) + bias, NaN as -inf
#pragma unroll
    for (int s = 0; s < kPer; ++s) {
      const int32_t e = base + s;
      const bool valid = e < p.num_experts;
      biased[s] = -INFINITY;
      if (p.scoring == kSoftmax) {
        float v = x[s];
        if (p.softcap > 0.0f) v = p.softcap * tanhf(v / p.softcap);
        if (valid && p.bias != nullptr) v += p.bias[e];
        x[s] = v;
        key[s] = valid ? order_key(v) : 0u;
      } else if (p.bias != nullptr) {
        const float sb = valid ? sigmoid(x[s]) + p.bias[e] : -INFINITY;
        key[s] = valid ? order_key(sb) : 0u;
        biased[s] = sb != sb ? -INFINITY : sb;
      } else {
        key[s] = valid ? order_key(x[s]) : 0u;  // sigmoid is monotone: choose on the logit
      }
    }

    // Grouped (sigmoid only): keep the topk_group best groups, clear the keys of the others.
    if (p.num_groups > 1) {
      const int32_t lanes_per_group = p.group_size / kPer;  // a power of two, >= 1
      float first = -INFINITY, second = -INFINITY;
#pragma unroll
      for (int s = 0; s < kPer; ++s) {
        const float v = p.bias != nullptr ? biased[s] : (base + s < p.num_experts ? sigmoid(x[s]) : -INFINITY);
        second = fmaxf(second, fminf(first, v));
        first = fmaxf(first, v);
      }
      for (int32_t m = 1; m < lanes_per_group; m *= 2) {  // merge the top-2 of the group's lanes
        const float o1 = __shfl_xor_sync(0xFFFFFFFFu, first, m);
        const float o2 = __shfl_xor_sync(0xFFFFFFFFu, second, m);
        second = fmaxf(fminf(first, o1), fmaxf(second, o2));
        first = fmaxf(first, o1);
      }
      const int32_t group = static_cast<int32_t>(lane) / lanes_per_group;
      uint32_t gkey = group < p.num_groups ? order_key(p.group_size >= 2 ? first + second : first) : 0u;
      bool kept = false;
      for (int32_t i = 0; i < p.topk_group; ++i) {  // the lowest lane holding the top: the lower group
        const uint32_t top = __reduce_max_sync(0xFFFFFFFFu, gkey);
        const uint32_t holders = __ballot_sync(0xFFFFFFFFu, gkey == top);
        const int32_t winner_group = (__ffs(holders) - 1) / lanes_per_group;
        if (group == winner_group) {
          kept = true;
          gkey = 0u;
        }
      }
      if (!kept) {
#pragma unroll
        for (int s = 0; s < kPer; ++s) key[s] = 0u;
      }
    }

    uint32_t best_key;
    int32_t best_slot;
    run_best<kPer>(key, best_key, best_slot);
    uint32_t top = __reduce_max_sync(0xFFFFFFFFu, best_key);

    // Softmax statistics (independent of the selection steps below: overlapped).
    float row_max = 0.0f, row_sum = 1.0f;
    if (p.scoring == kSoftmax) {
      row_max = order_key_value(top);  // the largest logit (top is the first step's key)
      float local = 0.0f;
#pragma unroll
      for (int s = 0; s < kPer; ++s) {
        if (base + s < p.num_experts) local += expf(x[s] - row_max);
      }
      row_sum = device::warp::reduce_sum<float>(local);
    }

    // k selection steps.
    int32_t id = 0;
    for (int32_t i = 0; i < p.topk; ++i) {
      const uint32_t holders = __ballot_sync(0xFFFFFFFFu, best_key == top);
      if (lane == static_cast<uint32_t>(__ffs(holders) - 1)) {
        winners[warp][i] = base + best_slot;
#pragma unroll
        for (int s = 0; s < kPer; ++s) {
          if (s == best_slot) key[s] = 0u;
        }
        run_best<kPer>(key, best_key, best_slot);
      }
      if (i + 1 < p.topk) top = __reduce_max_sync(0xFFFFFFFFu, best_key);
    }
    __syncwarp();

    // Weights and output.
    float weight = 0.0f;
    if (lane < static_cast<uint32_t>(p.topk)) {
      id = winners[warp][lane];
      weight = v2_weight(p, logits, id, row_max, row_sum);
    }
    __syncwarp();  // the next row's winners overwrite these
    if (p.renormalize) weight = weight / (device::warp::reduce_sum<float>(weight) + p.renorm_eps);
    if (lane < static_cast<uint32_t>(p.topk)) {
      p.weights[row * p.weights_stride + lane] = weight * p.scale;
      p.ids[row * p.ids_stride + lane] = id;
    }
  }
}

/// The best (key, slot) of a run once slot `taken` is cleared, and the run with it cleared (`rest`):
/// the lookahead kernel's next candidate of a lane, computed before it knows whether it won the
/// step (what run_best gives after the winner clears its slot, so the same state evolves).
template <int kPer>
SGL_DEVICE void run_best_without(
    const uint32_t (&key)[kPer], int32_t taken, uint32_t (&rest)[kPer], uint32_t& best_key, int32_t& best_slot) {
#pragma unroll
  for (int s = 0; s < kPer; ++s) rest[s] = s == taken ? 0u : key[s];
  run_best<kPer>(rest, best_key, best_slot);
}

/// order_key(v) where `valid`, else 0, in selects and bit operations (order_key's early return
/// and a select around it compile to a branch per slot).
SGL_DEVICE uint32_t order_key_if(bool valid, float v) {
  const uint32_t bits = __float_as_uint(v + 0.0f);                                              // -0 + 0 = +0
  const uint32_t flip = static_cast<uint32_t>(static_cast<int32_t>(bits) >> 31) | 0x80000000u;  // ~ or | sign
  const uint32_t key = v != v ? 1u : bits ^ flip;
  return valid ? key : 0u;
}

/// v[slot] without dynamic register indexing (a select per slot).
template <int kPer>
SGL_DEVICE float run_pick(const float (&v)[kPer], int32_t slot) {
  float picked = v[0];
#pragma unroll
  for (int s = 1; s < kPer; ++s) picked = s == slot ? v[s] : picked;
  return picked;
}

/// Sorts a run's keys into decreasing order in place (a sorting network: 5 compare-exchanges for 4
/// keys, 19 for 8; every exchange a max and a min, no branch). The sorted kernels' keys are distinct.
template <int kPer>
SGL_DEVICE void sort_descending(uint32_t (&key)[kPer]) {
  static_assert(kPer == 4 || kPer == 8, "the networks of 4 and 8 keys");
  constexpr int kPairs4[][2] = {{0, 1}, {2, 3}, {0, 2}, {1, 3}, {1, 2}};
  constexpr int kPairs8[][2] = {
      {0, 2},
      {1, 3},
      {4, 6},
      {5, 7},
      {0, 4},
      {1, 5},
      {2, 6},
      {3, 7},
      {0, 1},
      {2, 3},
      {4, 5},
      {6, 7},
      {2, 4},
      {3, 5},
      {1, 4},
      {3, 6},
      {1, 2},
      {3, 4},
      {5, 6}};
  const auto exchange = [&](int a, int b) {
    const uint32_t high = key[a] > key[b] ? key[a] : key[b];
    const uint32_t low = key[a] > key[b] ? key[b] : key[a];
    key[a] = high;
    key[b] = low;
  };
  if constexpr (kPer == 4) {
#pragma unroll
    for (const auto& pair : kPairs4) exchange(pair[0], pair[1]);
  } else {
#pragma unroll
    for (const auto& pair : kPairs8) exchange(pair[0], pair[1]);
  }
}

/// The lookahead kernel's options as its params give them (topk_rows_v2_lookahead_kernel, the
/// generic kernel): every option a uniform run-time branch, k a run-time loop count.
/// (The grouping test is `kMayGroup && p.num_groups > 1` in the body and the steps' loop carries
/// `#pragma unroll(kStepUnroll)`, 1 here: in these forms the options layer compiles to the same
/// code as the options written inline.)
struct LookaheadRuntimeOptions {
  static constexpr bool kFixedTopk = false;
  static constexpr int kStepUnroll = 1;
  static constexpr bool kMayGroup = true;
  static SGL_DEVICE bool softmax(const TopkRowsParams& p) { return p.scoring == kSoftmax; }
  static SGL_DEVICE bool has_bias(const TopkRowsParams& p) { return p.bias != nullptr; }
  static SGL_DEVICE bool softcap(const TopkRowsParams& p) { return p.softcap > 0.0f; }
  static SGL_DEVICE bool renormalize(const TopkRowsParams& p) { return p.renormalize; }
  static SGL_DEVICE int32_t topk(const TopkRowsParams& p) { return p.topk; }
  static SGL_DEVICE float scaled(const TopkRowsParams& p, float weight) { return weight * p.scale; }
  static SGL_DEVICE int32_t num_groups(const TopkRowsParams& p) { return p.num_groups; }
  static SGL_DEVICE int32_t group_size(const TopkRowsParams& p) { return p.group_size; }
  static SGL_DEVICE int32_t topk_group(const TopkRowsParams& p) { return p.topk_group; }
};

/// k of the specialised lookahead kernels (the common decode top-k).
inline constexpr int32_t kSpecialTopk = 8;

/// The options of a specialised lookahead kernel, fixed at compile time: scoring, renormalize, a
/// bias, a softcap (softmax only), k = kSpecialTopk, no grouping, scale 1. The values behind them
/// (the bias pointer, softcap, renorm_eps) still come from the params.
template <int kScoring, bool kRenormalize, bool kBias, bool kSoftcap>
struct LookaheadFixedOptions {
  static_assert(kScoring == kSoftmax || !kSoftcap, "the softcap is softmax only");
  static constexpr bool kFixedTopk = true;
  static constexpr int kStepUnroll = kSpecialTopk;  // the 8 steps fully unrolled: every i a constant
  static constexpr bool kMayGroup = false;
  static SGL_DEVICE bool softmax(const TopkRowsParams&) { return kScoring == kSoftmax; }
  static SGL_DEVICE bool has_bias(const TopkRowsParams&) { return kBias; }
  static SGL_DEVICE bool softcap(const TopkRowsParams&) { return kSoftcap; }
  static SGL_DEVICE bool renormalize(const TopkRowsParams&) { return kRenormalize; }
  static SGL_DEVICE int32_t topk(const TopkRowsParams&) { return kSpecialTopk; }
  static SGL_DEVICE float scaled(const TopkRowsParams&, float weight) { return weight; }  // w * 1 == w
  static SGL_DEVICE int32_t num_groups(const TopkRowsParams&) { return 1; }
  static SGL_DEVICE int32_t group_size(const TopkRowsParams& p) { return p.num_experts; }
  static SGL_DEVICE int32_t topk_group(const TopkRowsParams&) { return 1; }
};

/// The grouped routing of the specialised lookahead kernels: DeepSeek-V3's shape (256 experts in 8
/// groups of 32, 4 groups kept, top-8, sigmoid scores; R1, V3.1 and Kimi K2 route the same way).
inline constexpr int32_t kSpecialNumGroups = 8;
inline constexpr int32_t kSpecialGroupSize = 32;
inline constexpr int32_t kSpecialTopkGroup = 4;

/// The options of a specialised grouped kernel: sigmoid scoring, k = kSpecialTopk, kNumGroups
/// groups of kGroupSize experts with kTopkGroup kept, renormalize and a bias fixed at compile time;
/// the scale (routed_scaling_factor), the bias values and renorm_eps from the params. The group
/// merges unroll with constant lane masks and the groups are kept by rank (one round of kNumGroups
/// shuffles, the sorted path): no division by the lanes per group at run time, constant trip
/// counts, which the compiler unrolls, as the 8 expert steps do.
template <int kNumGroups, int kGroupSize, int kTopkGroup, bool kRenormalize, bool kBias>
struct LookaheadGroupedOptions {
  static_assert(kNumGroups > 1 && kTopkGroup >= 1 && kTopkGroup <= kNumGroups, "a grouped shape");
  static constexpr int32_t kGroups = kNumGroups;  // the compile-time shape (the sorted kernels' group ranks)
  static constexpr int32_t kGroupExperts = kGroupSize;
  static constexpr bool kFixedTopk = true;
  static constexpr int kStepUnroll = kSpecialTopk;
  static constexpr bool kMayGroup = true;
  static SGL_DEVICE bool softmax(const TopkRowsParams&) { return false; }
  static SGL_DEVICE bool has_bias(const TopkRowsParams&) { return kBias; }
  static SGL_DEVICE bool softcap(const TopkRowsParams&) { return false; }
  static SGL_DEVICE bool renormalize(const TopkRowsParams&) { return kRenormalize; }
  static SGL_DEVICE int32_t topk(const TopkRowsParams&) { return kSpecialTopk; }
  static SGL_DEVICE float scaled(const TopkRowsParams& p, float weight) { return weight * p.scale; }
  static SGL_DEVICE int32_t num_groups(const TopkRowsParams&) { return kNumGroups; }
  static SGL_DEVICE int32_t group_size(const TopkRowsParams&) { return kGroupSize; }
  static SGL_DEVICE int32_t topk_group(const TopkRowsParams&) { return kTopkGroup; }
};

/// Engine v2, the lookahead kernel (rows of <= 256 experts, runs of kPer <= 8): the experts and
/// weight bits of topk_rows_v2_kernel's selection on a shorter dependent chain per row.
/// - Scoring options are uniform branches around loops over the whole run (no per-slot branch), and
///   the bias run is loaded next to the logits: a run's kPer chains are one block the compiler
///   interleaves. Softcap and bias use __fmul_rn / __fadd_rn, the roundings of topk_rows_v2_kernel
///   (which keeps them apart in branches), whatever the compiler would contract here.
/// - Each step first computes the lane's next candidate (its run without the current best), which
///   needs no warp result, so the chain of a step is reduction -> ballot -> one select -> reduction;
///   a lane knows it won from the ballot and the lanes below it (no bit reversal / find-first on the
///   chain; the winner's lane index only feeds the shuffles).
/// - The softmax denominator's butterfly runs one stage per step (the stages left when topk < 5 run
///   after the steps), in reduce_sum's order.
/// - Lane i keeps winner i's key, which order_key_value turns back into the logit it was made of
///   (softmax: after softcap and bias; sigmoid without bias), so the weight needs no second read of
///   the row. Sigmoid with a bias (key = sigmoid + bias) takes the winner's logit by a shuffle.
/// - The renormalising butterfly skips its stages of mask >= topk: they add the +0 weights of lanes
///   >= topk to lanes < topk (weights are never -0), which leaves them unchanged.
/// - Grouped rows test "the lowest lane holding the top group key is in my group" from the ballot
///   (no division by the lanes per group).
///
/// The body is lookahead_rows, shared with the specialised kernels below: `Options` says where each
/// option comes from (LookaheadRuntimeOptions, the params, for this kernel).
template <typename T, int kPer, typename Options, bool kSorted = false>
SGL_DEVICE void lookahead_rows(const TopkRowsParams& p) {
  static_assert(kPer <= 8, "the lookahead kernel keeps two copies of a run's keys per step");
  constexpr uint32_t kFull = 0xFFFFFFFFu;
  const uint32_t lane = threadIdx.x % device::kWarpThreads;
  const uint32_t lanes_below = (1u << lane) - 1u;  // ballot bits of the lanes below this one
  const int64_t first_row = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / device::kWarpThreads;
  const int64_t row_step = int64_t{gridDim.x} * blockDim.x / device::kWarpThreads;
  const int32_t base = static_cast<int32_t>(lane) * kPer;
  const bool softmax = Options::softmax(p);
  const bool has_bias = Options::has_bias(p);
  device::pdl_wait_primary();
  device::pdl_launch_dependents();

  for (int64_t row = first_row; row < p.num_tokens; row += row_step) {
    const T* logits = static_cast<const T*>(p.gating) + row * p.gating_stride;
    float x[kPer];  // the run's logits, NaN and experts past the row as -inf
    load_run<T, kPer>(p, logits, base, x);
    bool valid[kPer];
    float bias[kPer];  // 0 past the row and without a bias
#pragma unroll
    for (int s = 0; s < kPer; ++s) {
      valid[s] = kSorted || base + s < p.num_experts;  // the sorted kernels take full rows only
      bias[s] = 0.0f;
    }
    if (has_bias) {
#pragma unroll
      for (int s = 0; s < kPer; ++s) {
        if (valid[s]) bias[s] = p.bias[base + s];
      }
    }

    // Keys. Softmax: x becomes softcap(x) + bias on the row (past the row it stays -inf, so its
    // exp(x - max) is +0: the sums below need no test). Sigmoid: sig = sigmoid(x) where a bias or the
    // grouping needs it, score = sig + bias (NaN as -inf) for the group scores.
    uint32_t key[kPer];
    float sig[kPer];
    float score[kPer];
#pragma unroll
    for (int s = 0; s < kPer; ++s) {
      sig[s] = 0.0f;
      score[s] = -INFINITY;
    }
    if (softmax) {
      if (Options::softcap(p)) {
#pragma unroll
        for (int s = 0; s < kPer; ++s) {
          const float capped = __fmul_rn(p.softcap, tanhf(x[s] / p.softcap));
          x[s] = valid[s] ? capped : x[s];
        }
      }
      if (has_bias) {
#pragma unroll
        for (int s = 0; s < kPer; ++s) x[s] = __fadd_rn(x[s], bias[s]);
      }
#pragma unroll
      for (int s = 0; s < kPer; ++s) key[s] = order_key_if(valid[s], x[s]);
    } else {
      if (has_bias || (Options::kMayGroup && Options::num_groups(p) > 1)) sigmoid_run<kPer>(x, sig);
      if (has_bias) {
#pragma unroll
        for (int s = 0; s < kPer; ++s) {
          const float sb = __fadd_rn(sig[s], bias[s]);
          key[s] = order_key_if(valid[s], sb);
          score[s] = valid[s] && sb == sb ? sb : -INFINITY;
        }
      } else {
#pragma unroll
        for (int s = 0; s < kPer; ++s) {
          key[s] = order_key_if(valid[s], x[s]);  // sigmoid is monotone: choose on the logit
          score[s] = valid[s] ? sig[s] : -INFINITY;
        }
      }
    }

    // Grouped (sigmoid only): keep the topk_group best groups, clear the keys of the others.
    if (Options::kMayGroup && Options::num_groups(p) > 1) {
      const int32_t lanes_per_group = Options::group_size(p) / kPer;  // a power of two, >= 1
      float first = -INFINITY, second = -INFINITY;
#pragma unroll
      for (int s = 0; s < kPer; ++s) {
        second = fmaxf(second, fminf(first, score[s]));
        first = fmaxf(first, score[s]);
      }
      for (int32_t m = 1; m < lanes_per_group; m *= 2) {  // merge the top-2 of the group's lanes
        const float o1 = __shfl_xor_sync(kFull, first, m);
        const float o2 = __shfl_xor_sync(kFull, second, m);
        second = fmaxf(fminf(first, o1), fmaxf(second, o2));
        first = fmaxf(first, o1);
      }
      const uint32_t group_lane = lane & ~static_cast<uint32_t>(lanes_per_group - 1);  // its first lane
      const uint32_t below_group = (1u << group_lane) - 1u;
      const uint32_t in_group = lanes_per_group >= 32 ? kFull : ((1u << lanes_per_group) - 1u) << group_lane;
      const int32_t group = static_cast<int32_t>(group_lane) / lanes_per_group;
      uint32_t gkey =
          group < Options::num_groups(p) ? order_key(Options::group_size(p) >= 2 ? first + second : first) : 0u;
      bool kept = false;
      if constexpr (kSorted && Options::kMayGroup) {
        // The sorted (grouped, fixed-shape) kernels: a group is kept when fewer than topk_group groups
        // rank above it (a larger key, or the same key and a lower group): the set the steps below
        // keep, from one round of independent shuffles instead of topk_group dependent steps.
        constexpr int32_t kGroups = Options::kGroups;
        constexpr int32_t kGroupLanes = Options::kGroupExperts / kPer;
        static_assert(kGroups * kGroupLanes == static_cast<int32_t>(device::kWarpThreads), "groups fill the warp");
        int32_t above = 0;
#pragma unroll
        for (int32_t g = 0; g < kGroups; ++g) {
          const uint32_t other = __shfl_sync(kFull, gkey, static_cast<uint32_t>(g * kGroupLanes));
          above += other > gkey || (other == gkey && g < group) ? 1 : 0;
        }
        kept = above < Options::topk_group(p);
      } else {
        for (int32_t i = 0; i < Options::topk_group(p); ++i) {  // the lowest lane holding the top: the lower group
          const uint32_t top = __reduce_max_sync(kFull, gkey);
          const uint32_t holders = __ballot_sync(kFull, gkey == top);
          const bool won = (holders & below_group) == 0 && (holders & in_group) != 0;
          kept = kept || won;
          gkey = won ? 0u : gkey;
        }
      }
#pragma unroll
      for (int s = 0; s < kPer; ++s) key[s] = kept ? key[s] : 0u;
    }

    // The row's largest key (top) and the lane's best (key, slot); the sorted kernels need only the
    // maximum first and find the lane's best where they fall back to the steps.
    uint32_t best_key = 0u;
    int32_t best_slot = 0;
    uint32_t top;
    if constexpr (kSorted) {
      uint32_t lane_max = key[0];
#pragma unroll
      for (int s = 1; s < kPer; ++s) lane_max = key[s] > lane_max ? key[s] : lane_max;
      top = __reduce_max_sync(kFull, lane_max);
    } else {
      run_best<kPer>(key, best_key, best_slot);
      top = __reduce_max_sync(kFull, best_key);
    }

    // Softmax statistics: the max is the first step's key; the lane's share of the denominator here,
    // its butterfly inside the steps.
    float row_max = 0.0f, row_sum = 0.0f;
    if (softmax) {
      row_max = order_key_value(top);
#pragma unroll
      for (int s = 0; s < kPer; ++s) row_sum += expf(x[s] - row_max);
    }

    // k selection steps; lane i keeps winner i (its expert, key and, sigmoid with a bias, logit).
    // Lanes >= topk keep the first key and logit 0: finite weights, so their divisions take the
    // fast path (a NaN would send them, and so the warp, through the division's slow path).
    int32_t id = 0;
    uint32_t my_key = top;
    float my_logit = 0.0f;

    // Sorted kernels: distinct packed keys (the key's high bits, the inverted expert in the low bits
    // kLow) sorted per lane; a step is one warp maximum of the lanes' heads, whose low bits
    // name the winner, and the winner lane's shift. The packed order is the selection order wherever
    // no two keys share their high bits; that holds for the k winners and the next key when their 9
    // packed keys differ in the high bits (then keys of equal high bits never meet), which the warp
    // checks (a uniform test of the step results). Otherwise (near ties, equal keys, -inf rows) it
    // runs the steps below on the unchanged keys.
    // Lane i < k reloads winner i's logit (L1-resident) for its key or weight, as the steps keep it.
    bool sorted_done = false;
    if constexpr (kSorted) {
      static_assert(Options::kFixedTopk && (kPer == 4 || kPer == 8), "k fixed, runs of 4 or 8 experts");
      constexpr int kTopk = kSpecialTopk;
      constexpr uint32_t kLow = static_cast<uint32_t>(kPer) * device::kWarpThreads - 1u;  // the expert bits
      uint32_t list[kPer];
#pragma unroll
      for (int s = 0; s < kPer; ++s) list[s] = (key[s] | kLow) ^ static_cast<uint32_t>(base + s);
      sort_descending<kPer>(list);
      uint32_t tops[kTopk + 1];  // the k + 1 largest packed keys
      tops[0] = __reduce_max_sync(kFull, list[0]);
#pragma unroll
      for (int i = 0; i < kTopk; ++i) {
        const bool mine = list[0] == tops[i];
#pragma unroll
        for (int j = 0; j + 1 < kPer; ++j) list[j] = mine ? list[j + 1] : list[j];
        list[kPer - 1] = mine ? 0u : list[kPer - 1];
        tops[i + 1] = __reduce_max_sync(kFull, list[0]);
      }
      // Lane i's winner (lanes >= k: winner 0, a finite weight not written) and its logit, loaded
      // before the check (a full row: every packed key names an expert of the row); the softmax
      // denominator's butterfly (reduce_sum's order) before it too, for either path.
      uint32_t packed = tops[0];
#pragma unroll
      for (int i = 1; i < kTopk; ++i) packed = lane == static_cast<uint32_t>(i) ? tops[i] : packed;
      const int32_t sorted_id = static_cast<int32_t>((packed & kLow) ^ kLow);
      float v = static_cast<float>(logits[sorted_id]);
      if (softmax) {
#pragma unroll
        for (uint32_t mask = device::kWarpThreads / 2; mask > 0; mask >>= 1) {
          row_sum = row_sum + __shfl_xor_sync(kFull, row_sum, mask);
        }
      }
      bool distinct = true;
#pragma unroll
      for (int i = 0; i < kTopk; ++i) distinct = distinct & ((tops[i] ^ tops[i + 1]) > kLow);
      if (distinct) {
        sorted_done = true;
        id = sorted_id;
        if (v != v) v = -INFINITY;
        if (softmax) {
          if (Options::softcap(p)) v = __fmul_rn(p.softcap, tanhf(v / p.softcap));
          if (has_bias) v = __fadd_rn(v, p.bias[id]);
          my_key = order_key_if(true, v);
        } else if (has_bias) {
          my_logit = v;
        } else {
          my_key = order_key_if(true, v);
        }
      }
    }

    const auto steps = [&](auto pick_logit) {
      // The lane's next candidate (its run without its current best), for the first step; each
      // step computes the next one right after issuing its reduction, which it does not wait for.
      uint32_t rest[kPer];
      uint32_t next_key;
      int32_t next_slot;
      run_best_without<kPer>(key, best_slot, rest, next_key, next_slot);
#pragma unroll(Options::kStepUnroll)
      for (int32_t i = 0; i < Options::topk(p); ++i) {
        const bool holds = best_key == top;
        const uint32_t holders = __ballot_sync(kFull, holds);
        const bool mine = holds && (holders & lanes_below) == 0;
        const uint32_t winner = static_cast<uint32_t>(__ffs(holders) - 1);
        const int32_t expert = __shfl_sync(kFull, base + best_slot, winner);
        float logit = 0.0f;
        if constexpr (decltype(pick_logit)::value) logit = __shfl_sync(kFull, run_pick<kPer>(x, best_slot), winner);
        best_key = mine ? next_key : best_key;
        uint32_t next_top = top;
        if (!Options::kFixedTopk || i + 1 < Options::topk(p)) {  // the last one unused: no branch at run time
          next_top = __reduce_max_sync(kFull, best_key);
        }
        best_slot = mine ? next_slot : best_slot;
#pragma unroll
        for (int s = 0; s < kPer; ++s) key[s] = mine ? rest[s] : key[s];
        run_best_without<kPer>(key, best_slot, rest, next_key, next_slot);
        const bool record = lane == static_cast<uint32_t>(i);
        id = record ? expert : id;
        my_key = record ? top : my_key;
        my_logit = record ? logit : my_logit;
        const uint32_t mask = 16u >> i;  // i < 32: 16, 8, 4, 2, 1, then 0 (no stage)
        // A fixed k issues no shuffle for the 0 stages, nor (sigmoid: row_sum is unused) any; the
        // sorted kernels ran the butterfly before.
        if (!kSorted && (!Options::kFixedTopk || (softmax && mask != 0))) {
          const float other = __shfl_xor_sync(kFull, row_sum, mask);
          row_sum = mask != 0 ? row_sum + other : row_sum;
        }
        top = next_top;
      }
    };
    if (!sorted_done) {
      if constexpr (kSorted) run_best<kPer>(key, best_key, best_slot);
      if (!softmax && has_bias) {
        steps(std::true_type{});
      } else {
        steps(std::false_type{});
      }
      for (uint32_t mask = Options::topk(p) < 5 ? 16u >> Options::topk(p) : 0u; mask > 0; mask >>= 1) {
        row_sum = row_sum + __shfl_xor_sync(kFull, row_sum, mask);
      }
    }

    // Weights and output (lanes >= topk hold weight +0 for the renormalising sum).
    float weight;
    if (softmax) {
      weight = expf(order_key_value(my_key) - row_max) / row_sum;
    } else {
      weight = sigmoid(has_bias ? my_logit : order_key_value(my_key));
    }
    weight = lane < static_cast<uint32_t>(Options::topk(p)) ? weight : 0.0f;
    if (Options::renormalize(p)) {
      float total = weight;
      for (uint32_t mask = device::kWarpThreads / 2; mask > 0; mask >>= 1) {
        if (mask < static_cast<uint32_t>(Options::topk(p))) total = total + __shfl_xor_sync(kFull, total, mask);
      }
      // Lanes >= topk hold partial sums (0 possibly, a 0 / 0): they divide by 1 instead.
      weight = weight / (lane < static_cast<uint32_t>(Options::topk(p)) ? total + p.renorm_eps : 1.0f);
    }
    if (lane < static_cast<uint32_t>(Options::topk(p))) {
      p.weights[row * p.weights_stride + lane] = Options::scaled(p, weight);
      p.ids[row * p.ids_stride + lane] = id;
    }
  }
}

template <typename T, int kPer>
__global__ void __launch_bounds__(TopkRowsConfig::kThreads) topk_rows_v2_lookahead_kernel(const TopkRowsParams p) {
  lookahead_rows<T, kPer, LookaheadRuntimeOptions>(p);
}

/// Engine v2, the lookahead kernel specialised for the common decode call: k = 8 and the options
/// (scoring, renormalize, bias, softcap) fixed at compile time, no grouping, scale 1. The launcher
/// takes it for rows of <= 256 experts whose call matches one instantiation (topk_softmax /
/// topk_sigmoid at top-8, and grouped_topk with one group and scale 1) and the generic lookahead
/// kernel for anything else. The same body
/// (lookahead_rows), so the same operations in the same order on every value: the generic kernel's
/// experts and weight bits (the tests' *_batch_invariant compare its sorted and unsorted forms, a row
/// alone and in a large batch).
///
/// What it removes from the generic kernel: the uniform branches on the scoring, bias, softcap,
/// grouping and renormalize flags (each a test of a param and a branch region the scheduler cannot
/// cross: the option-free code of a call is one straight block here); the steps' run-time loop (8
/// steps fully unrolled: no loop counter, the step index a constant, so "lane i records winner i" and
/// the denominator's butterfly stage of step i are immediates, the 3 empty stages (steps 5..7) issue
/// no shuffle, and the last step issues no unused reduction; sigmoid rows issue no denominator
/// butterfly at all); the stage tests of the renormalising butterfly (masks 4, 2, 1 only) and of the
/// post-step butterfly (none at k = 8); the multiply by scale. What it keeps: the param struct, the
/// grid-stride row loop, row strides, the aligned / scalar load choice (p.vec) and the tail masks of
/// rows shorter than 32 * kPer.
///
/// kSorted (full rows of 128 or 256 experts, from kSortedMinTokens rows; see sorted_special_kernel):
/// lookahead_rows' sorted path, each lane's packed keys sorted once, then 8 steps of a maximum and a
/// shift, the steps above where the packed order could differ from the keys' (the same bits either
/// way).
template <typename T, int kPer, int kScoring, bool kRenormalize, bool kBias, bool kSoftcap, bool kSorted = false>
__global__ void __launch_bounds__(TopkRowsConfig::kThreads) topk_rows_v2_special_kernel(const TopkRowsParams p) {
  lookahead_rows<T, kPer, LookaheadFixedOptions<kScoring, kRenormalize, kBias, kSoftcap>, kSorted>(p);
}

/// The specialised lookahead kernel of grouped routing at DeepSeek-V3's shape (LookaheadGroupedOptions:
/// 8 groups of 32 of 256 experts, 4 kept, top-8, sigmoid; renormalize and a bias fixed at compile
/// time, any scale), on the sorted path (a group is kept by its rank, the experts chosen by the
/// sorted steps). The same body as the generic kernel, so its experts and weight bits. What it
/// removes besides the specialised kernels' option branches: the run-time loops of the group merges
/// (2 shuffle stages here) and of the group ranking, and the division of the lane by the lanes per
/// group.
template <typename T, int kPer, bool kRenormalize, bool kBias>
__global__ void __launch_bounds__(TopkRowsConfig::kThreads)
    topk_rows_v2_grouped_special_kernel(const TopkRowsParams p) {
  lookahead_rows<
      T,
      kPer,
      LookaheadGroupedOptions<kSpecialNumGroups, kSpecialGroupSize, kSpecialTopkGroup, kRenormalize, kBias>,
      /*kSorted=*/true>(p);
}

/// Engine v2 with several rows per warp (kLanes = 8 lanes per row, 4 rows per warp): the kernel of
/// fp32 rows of 128 experts from kMultirowMinTokens rows that the sorted kernels do not take (k < 8,
/// or a scale). Why: at many tokens one warp per row spends its issue slots on warp-wide steps that
/// choose one expert of one row each; here one warp instruction serves 32 / kLanes rows. Rows of
/// exactly 32 * kPer experts, k <= 8, no grouping, aligned rows (p.vec): the host checks them.
///
/// The bits of lookahead_rows (the generic kernel), row for row, whatever the batch: lane q of a row holds
/// the kRuns = 32 / kLanes runs of the generic kernel's lanes kRuns * q .. kRuns * q + kRuns - 1 (run j at
/// experts (kRuns * q + j) * kPer), so
/// - keys: the same functions of the same values (softcap, bias, order_key_if; every expert valid);
/// - the maximum key is exact in any order; the selection picks the largest key, ties to the lower
///   expert (a tree per run with the lower slot winning ties, runs in expert order, then a shuffle
///   reduction that takes the lower expert on equal keys), as the generic kernel's steps do;
/// - the softmax denominator: each run's sequential sum of its exp terms as the generic kernel's lane sums
///   them, then the generic kernel's butterfly (reduce_sum's masks 16, 8, .., 1 over its lanes): the masks
///   >= kRuns are shuffles over this kernel's lanes (mask / kRuns), the masks < kRuns pair runs
///   inside a lane, in the same order;
/// - lane i < k of the row keeps winner i (its key, expert and logit), so the weight, the
///   renormalising butterfly over winners (masks < k) and the scale are the generic kernel's.
template <typename T, int kPer>
__global__ void __launch_bounds__(TopkRowsConfig::kThreads) topk_rows_v2_multirow_kernel(const TopkRowsParams p) {
  constexpr int kLanes = 8;
  constexpr int kRuns = static_cast<int>(device::kWarpThreads) / kLanes;  // the generic kernel's lanes per lane
  constexpr int kRowsPerWarp = kRuns;
  constexpr int kExperts = kRuns * kPer;  // experts per lane
  constexpr uint32_t kFull = 0xFFFFFFFFu;
  const uint32_t lane = threadIdx.x % device::kWarpThreads;
  const int32_t sub = static_cast<int32_t>(lane % kLanes);  // the lane within its row
  const int64_t warp = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / device::kWarpThreads;
  const int64_t warp_step = int64_t{gridDim.x} * blockDim.x / device::kWarpThreads;
  const int32_t first = sub * kExperts;  // this lane's first expert
  const bool softmax = p.scoring == kSoftmax;
  const bool has_bias = p.bias != nullptr;
  device::pdl_wait_primary();
  device::pdl_launch_dependents();

  // Every lane runs every iteration (the shuffles name the whole warp); rows past the end compute
  // on the warp's first row and store nothing.
  for (int64_t warp_row = warp * kRowsPerWarp; warp_row < p.num_tokens; warp_row += warp_step * kRowsPerWarp) {
    const int64_t row = warp_row + static_cast<int64_t>(lane / kLanes);
    const bool live = row < p.num_tokens;
    const T* logits = static_cast<const T*>(p.gating) + (live ? row : warp_row) * p.gating_stride;
    float x[kRuns][kPer];
#pragma unroll
    for (int j = 0; j < kRuns; ++j) load_run<T, kPer>(p, logits, first + j * kPer, x[j]);
    uint32_t key[kRuns][kPer];
    if (softmax) {
      if (p.softcap > 0.0f) {
#pragma unroll
        for (int j = 0; j < kRuns; ++j) {
#pragma unroll
          for (int s = 0; s < kPer; ++s) x[j][s] = __fmul_rn(p.softcap, tanhf(x[j][s] / p.softcap));
        }
      }
      if (has_bias) {
#pragma unroll
        for (int j = 0; j < kRuns; ++j) {
#pragma unroll
          for (int s = 0; s < kPer; ++s) x[j][s] = __fadd_rn(x[j][s], p.bias[first + j * kPer + s]);
        }
      }
#pragma unroll
      for (int j = 0; j < kRuns; ++j) {
#pragma unroll
        for (int s = 0; s < kPer; ++s) key[j][s] = order_key_if(true, x[j][s]);
      }
    } else if (has_bias) {
#pragma unroll
      for (int j = 0; j < kRuns; ++j) {
#pragma unroll
        for (int s = 0; s < kPer; ++s) {
          key[j][s] = order_key_if(true, __fadd_rn(sigmoid(x[j][s]), p.bias[first + j * kPer + s]));
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < kRuns; ++j) {
#pragma unroll
        for (int s = 0; s < kPer; ++s) key[j][s] = order_key_if(true, x[j][s]);  // sigmoid is monotone
      }
    }

    // The lane's best (key, expert offset, logit): per run a tree with the lower slot winning ties,
    // then the runs in expert order (a later run wins only when strictly greater).
    const auto lane_best = [&](uint32_t& best_key, int32_t& best_at, float& best_logit) {
      best_key = 0u;
      best_at = 0;
      best_logit = 0.0f;
#pragma unroll
      for (int j = 0; j < kRuns; ++j) {
        uint32_t run_key;
        int32_t run_slot;
        run_best<kPer>(key[j], run_key, run_slot);
        const bool better = run_key > best_key;
        best_key = better ? run_key : best_key;
        best_at = better ? j * kPer + run_slot : best_at;
        if (better) best_logit = run_pick<kPer>(x[j], run_slot);
      }
    };
    uint32_t best_key;
    int32_t best_at;
    float best_logit;
    lane_best(best_key, best_at, best_logit);
    uint32_t top = best_key;
#pragma unroll
    for (int m = kLanes / 2; m > 0; m /= 2) {
      const uint32_t other = __shfl_xor_sync(kFull, top, m);
      top = other > top ? other : top;
    }

    float row_max = 0.0f, row_sum = 0.0f;
    if (softmax) {
      row_max = order_key_value(top);
      float q[kRuns];
#pragma unroll
      for (int j = 0; j < kRuns; ++j) {
        q[j] = 0.0f;
#pragma unroll
        for (int s = 0; s < kPer; ++s) q[j] += expf(x[j][s] - row_max);
      }
      // the generic kernel's masks 16 .. kRuns: over this kernel's lanes
#pragma unroll
      for (int m = kLanes / 2; m > 0; m /= 2) {
#pragma unroll
        for (int j = 0; j < kRuns; ++j) q[j] = q[j] + __shfl_xor_sync(kFull, q[j], m);
      }
      // its masks kRuns / 2 .. 1: runs j and j ^ m of the lane (every run ends with the same sum)
#pragma unroll
      for (int m = kRuns / 2; m > 0; m /= 2) {
        float t[kRuns];
#pragma unroll
        for (int j = 0; j < kRuns; ++j) t[j] = q[j] + q[j ^ m];
#pragma unroll
        for (int j = 0; j < kRuns; ++j) q[j] = t[j];
      }
      row_sum = q[0];
    }

    // k steps: the row's best (largest key, then lower expert) over its lanes; the lane holding it
    // clears it and finds its next best; lane i keeps winner i.
    int32_t my_id = 0;
    uint32_t my_key = top;
    float my_logit = 0.0f;
    for (int32_t i = 0; i < p.topk; ++i) {
      uint32_t k = best_key;
      int32_t e = first + best_at;
      float lg = best_logit;
#pragma unroll
      for (int m = kLanes / 2; m > 0; m /= 2) {
        const uint32_t ok = __shfl_xor_sync(kFull, k, m);
        const int32_t oe = __shfl_xor_sync(kFull, e, m);
        const float olg = __shfl_xor_sync(kFull, lg, m);
        const bool take = ok > k || (ok == k && oe < e);
        k = take ? ok : k;
        e = take ? oe : e;
        lg = take ? olg : lg;
      }
      if (sub == i) {
        my_id = e;
        my_key = k;
        my_logit = lg;
      }
      const int32_t at = e - first;  // in [0, kExperts) for the lane holding the winner
#pragma unroll
      for (int j = 0; j < kRuns; ++j) {
#pragma unroll
        for (int s = 0; s < kPer; ++s) key[j][s] = at == j * kPer + s ? 0u : key[j][s];
      }
      if (at >= 0 && at < kExperts) lane_best(best_key, best_at, best_logit);
    }

    float weight;
    if (softmax) {
      weight = expf(order_key_value(my_key) - row_max) / row_sum;
    } else {
      weight = sigmoid(has_bias ? my_logit : order_key_value(my_key));
    }
    weight = sub < p.topk ? weight : 0.0f;
    if (p.renormalize) {
      float total = weight;
#pragma unroll
      for (int m = 4; m > 0; m /= 2) {  // the generic kernel's masks < k (k <= 8)
        if (m < p.topk) total = total + __shfl_xor_sync(kFull, total, m);
      }
      weight = weight / (sub < p.topk ? total + p.renorm_eps : 1.0f);
    }
    if (live && sub < p.topk) {
      p.weights[row * p.weights_stride + sub] = p.scale != 1.0f ? weight * p.scale : weight;
      p.ids[row * p.ids_stride + sub] = my_id;
    }
  }
}

/// Rows from which fp32 rows of 128 experts run topk_rows_v2_multirow_kernel where the sorted
/// kernels do not take them (the crossover and why bf16 / fp16 rows and the other widths keep the
/// lookahead kernels: docs/perf_notes.md, Top-k routing).
inline constexpr int64_t kMultirowMinTokens = 4096;

/// Whether `params` runs topk_rows_v2_multirow_kernel: fp32 full aligned rows of 128 experts (runs
/// of 4), k <= 8, no grouping, from kMultirowMinTokens rows.
template <typename T, int kPer>
bool multirow_applies(const TopkRowsParams& params) {
  return std::is_same_v<T, float> && kPer == 4 && params.vec && params.num_groups <= 1 && params.topk <= 8 &&
         params.num_experts == kPer * static_cast<int32_t>(device::kWarpThreads) &&
         params.num_tokens >= kMultirowMinTokens;
}

/// The run length of engine v2 for a row of `num_experts` (0: engine v2 does not take it).
inline int32_t v2_run_length(const TopkRowsParams& params) {
  const int32_t e = params.num_experts;
  const int32_t per = e <= 32 ? 1 : e <= 64 ? 2 : e <= 128 ? 4 : e <= 256 ? 8 : e <= 512 ? 16 : e <= 1024 ? 32 : 0;
  if (per == 0 || params.topk > static_cast<int32_t>(device::kWarpThreads)) return 0;
  if (params.num_groups > 1) {
    if (params.group_size % per != 0) return 0;
    const int32_t lanes = params.group_size / per;
    if ((lanes & (lanes - 1)) != 0) return 0;
  }
  return per;
}

/// The routing op a launcher serves. Each op's module instantiates only the kernels its calls can
/// reach: the specialised kernels of its scoring (softmax: 8 option sets, sigmoid: 4) and, for
/// grouped_topk, the grouped ones. grouped_topk with one group routes as topk_sigmoid with a scale.
enum class RoutingOp { kSoftmax, kSigmoid, kGrouped };

/// The specialised lookahead kernel `index` = renormalize | bias << 1 | softcap << 2 of kScoring
/// (the softcap bit only for softmax: 8 softmax and 4 sigmoid kernels per T and kPer).
template <typename T, int kPer, int kScoring, bool kSorted, int... kIndex>
auto special_kernel_at(int index, std::integer_sequence<int, kIndex...>) {
  using Kernel = void (*)(TopkRowsParams);
  static const Kernel kernels[] = {topk_rows_v2_special_kernel<
      T,
      kPer,
      kScoring,
      (kIndex & 1) != 0,
      (kIndex & 2) != 0,
      (kIndex & 4) != 0,
      kSorted>...};
  return kernels[index];
}

/// The grouped specialised kernel `index` = renormalize | bias << 1.
template <typename T, int kPer, int... kIndex>
auto grouped_special_kernel_at(int index, std::integer_sequence<int, kIndex...>) {
  using Kernel = void (*)(TopkRowsParams);
  static const Kernel kernels[] = {
      topk_rows_v2_grouped_special_kernel<T, kPer, (kIndex & 1) != 0, (kIndex & 2) != 0>...};
  return kernels[index];
}

/// Whether grouped routing `params` has the shape of the grouped specialised kernels.
inline bool is_special_grouping(const TopkRowsParams& params) {
  return params.topk == kSpecialTopk && params.scoring == kSigmoid && params.num_groups == kSpecialNumGroups &&
         params.group_size == kSpecialGroupSize && params.topk_group == kSpecialTopkGroup &&
         params.num_experts == kSpecialNumGroups * kSpecialGroupSize;
}

/// The specialised lookahead kernel (kSorted: the sorted one) of `params` for op kOp, or nullptr
/// where none matches (k != 8, scale != 1 without grouping; grouping other than
/// is_special_grouping's): the caller then launches the generic kernel. The grouped specialised
/// kernels exist on the sorted path only (runs of 8: DeepSeek-V3's 256 experts).
template <typename T, RoutingOp kOp, int kPer, bool kSorted>
void (*special_kernel_of(const TopkRowsParams& params))(TopkRowsParams) {
  const int index = (params.renormalize ? 1 : 0) | (params.bias != nullptr ? 2 : 0);
  if constexpr (kOp == RoutingOp::kGrouped) {
    if (params.num_groups > 1) {
      if constexpr (kSorted && kPer == 8) {
        if (is_special_grouping(params)) {
          return grouped_special_kernel_at<T, kPer>(index, std::make_integer_sequence<int, 4>{});
        }
      }
      return nullptr;
    }
  }
  if (params.topk != kSpecialTopk || params.scale != 1.0f) return nullptr;
  if constexpr (kOp == RoutingOp::kSoftmax) {
    return special_kernel_at<T, kPer, kSoftmax, kSorted>(
        index | (params.softcap > 0.0f ? 4 : 0), std::make_integer_sequence<int, 8>{});
  } else {  // the kernels ignore the softcap of sigmoid rows
    return special_kernel_at<T, kPer, kSigmoid, kSorted>(index, std::make_integer_sequence<int, 4>{});
  }
}

/// Rows from which ungrouped calls take the sorted specialised kernels (grouped calls at
/// DeepSeek-V3's shape take them at any count; below it the lookahead kernels' shorter chain per
/// row wins, which only a full GPU hides: docs/perf_notes.md, topk routing).
inline constexpr int64_t kSortedMinTokens = 2048;

/// The sorted specialised kernel of `params`: full rows of 128 or 256 experts (runs of 4 or 8),
/// grouped calls or ungrouped ones from kSortedMinTokens rows, and a call a specialised kernel
/// matches; else nullptr.
template <typename T, RoutingOp kOp, int kPer>
void (*sorted_special_kernel(const TopkRowsParams& params))(TopkRowsParams) {
  if constexpr (kPer == 4 || kPer == 8) {
    if (params.num_experts == kPer * static_cast<int32_t>(device::kWarpThreads) &&
        (params.num_groups > 1 || params.num_tokens >= kSortedMinTokens)) {
      return special_kernel_of<T, kOp, kPer, true>(params);
    }
  }
  return nullptr;
}

/// Engine v2 for runs of kPer: rows of <= 256 experts take, in order, the sorted specialised kernel,
/// the several-rows kernel, the specialised lookahead kernel, the generic lookahead kernel, the
/// first that applies; rows of 257..1024 experts topk_rows_v2_kernel. Returns true (launched).
template <typename T, RoutingOp kOp, int kPer>
bool launch_topk_rows_v2(TopkRowsParams params, DLDevice device) {
  using namespace host;
  constexpr int kVecBytes = run_vec_bytes<T, kPer>();
  params.vec = reinterpret_cast<std::uintptr_t>(params.gating) % kVecBytes == 0 &&
               (params.gating_stride * static_cast<int64_t>(sizeof(T))) % kVecBytes == 0;
  const int64_t blocks = div_ceil(params.num_tokens, int64_t{TopkRowsConfig::kWarps});
  const auto grid = static_cast<uint32_t>(std::min<int64_t>(blocks, TopkRowsConfig::kMaxBlocks));
  const auto launch = [&](uint32_t g, void (*kernel)(TopkRowsParams)) {
    LaunchKernel(g, TopkRowsConfig::kThreads, device).enable_pdl(true)(kernel, params);
    return true;
  };
  if constexpr (kPer <= 8) {
    if (const auto sorted = sorted_special_kernel<T, kOp, kPer>(params)) return launch(grid, sorted);
    if constexpr (std::is_same_v<T, float> && kPer == 4) {
      if (multirow_applies<T, kPer>(params)) {
        constexpr int64_t kRowsPerBlock = int64_t{TopkRowsConfig::kWarps} * (device::kWarpThreads / 8);
        const auto multirow_grid = static_cast<uint32_t>(
            std::min<int64_t>(div_ceil(params.num_tokens, kRowsPerBlock), TopkRowsConfig::kMaxBlocks));
        return launch(multirow_grid, topk_rows_v2_multirow_kernel<T, kPer>);
      }
    }
    if (const auto special = special_kernel_of<T, kOp, kPer, false>(params)) return launch(grid, special);
    return launch(grid, topk_rows_v2_lookahead_kernel<T, kPer>);
  } else {
    return launch(grid, topk_rows_v2_kernel<T, kPer>);
  }
}

/// The engine and run length a routing module builds. Each op has six modules per gating dtype,
/// each loaded on the first call that needs it: engine v2 (rows of <= 1024 experts, topk <= 32,
/// groups of whole lane runs: the shapes of the models in use) by run length, i.e. by expert count
/// (kV2Run1: <= 32 experts, kV2Run2: <= 64, kV2Run4: <= 128, kV2Run8: <= 256, kV2Run16: <= 1024,
/// runs of 16 and 32), and kV1, the first engine, for every other shape. A first call compiles the
/// kernels of its expert count only (the callers pick the module: _moe.routing_engine).
enum class RoutingEngines { kV2Run1, kV2Run2, kV2Run4, kV2Run8, kV2Run16, kV1 };

/// The run lengths (v2_run_length) a kV2 module serves: kRun, and for kV2Run16 also 32.
template <RoutingEngines kEngines>
inline constexpr int kRunOfEngines = kEngines == RoutingEngines::kV2Run1   ? 1
                                     : kEngines == RoutingEngines::kV2Run2 ? 2
                                     : kEngines == RoutingEngines::kV2Run4 ? 4
                                     : kEngines == RoutingEngines::kV2Run8 ? 8
                                                                           : 16;

/// A kV2 module: launches engine v2 for shapes of its run lengths and returns true, else returns
/// false without launching. kV1: launches topk_rows_kernel with the smallest register tier holding
/// num_experts (or the recomputing one past 1024 experts) and returns true. num_tokens > 0.
template <typename T, RoutingOp kOp, RoutingEngines kEngines>
bool launch_topk_rows(const TopkRowsParams& params, DLDevice device) {
  using namespace host;
  if constexpr (kEngines != RoutingEngines::kV1) {
    constexpr int kRun = kRunOfEngines<kEngines>;
    const int run = v2_run_length(params);
    if (run == kRun) return launch_topk_rows_v2<T, kOp, kRun>(params, device);
    if constexpr (kRun == 16) {
      if (run == 32) return launch_topk_rows_v2<T, kOp, 32>(params, device);
    }
    return false;
  } else {
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
    return true;
  }
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
      .vec = false,
  };
}

}  // namespace moe_routing
