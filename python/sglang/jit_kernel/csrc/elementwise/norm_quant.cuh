// RMSNorm (or fused residual add + RMSNorm) followed by 8-bit quantization of the normalised row,
// in one launch: rmsnorm_quant and fused_add_rmsnorm_quant.
//
//   residual[r, :] <- round(input[r, :] + residual[r, :])          (fused add only; fp32 add, one rounding)
//   y[r, :] = round(x[r, :] * (w * rstd)), rstd = rsqrt(sum(x[r, :]^2) * (1 / H) + eps)
//                                                                    (x = input, or the rounded sum)
//   normed[r, :] <- y[r, :]                                          (optional)
//   q[r, :] = quantize(float(y[r, :]))                               (quantize_8bit.cuh's arithmetic)
//
// Bit-identical to the unfused composition: y is rounded to T exactly as rmsnorm /
// fused_add_rmsnorm store it, and q, the scales, are per_token_group_quant_8bit's (per group),
// per_token_quant_fp8's (per token) or per_tensor_quant_fp8's static path (a given scale) applied
// to those rounded values. The norm part is that of rmsnorm's kernel (rmsnorm.cuh) and of the
// fused add's (norm_rows.cuh's norm_group_in_registers): the same geometry (choose_geometry of the
// op's NormKind with 16-byte vectors), the same loads, the same sum of squares in the same order
// and the same row_reduce_sum, hence the same rstd bit for bit. Only their store is replaced: the
// rounded vectors stay in registers and are quantized there. rmsnorm_quant launches of more CTAs
// than SMs at two vectors per reduction lane run that geometry with half the threads, each holding
// two of its reduction lanes (pair CTAs, row_reduce_sum_pairs: the same sums in the same order),
// which halves the per-row instructions per element of a kernel otherwise bound by their issue.
//
// Quant modes (runtime, uniform per launch):
//   kGroup   a scale per group_size consecutive values; a group is G = group_size / kVecN vectors,
//            G <= 32: G consecutive lanes of one vector slot (G <= threads per row), or every lane of
//            a row over G / tpr consecutive slots (short rows); reduced by shuffles.
//   kToken   a scale per row: the row maximum (row_reduce_max: shuffles, and one barrier for rows
//            wider than a warp).
//   kStatic  the given scale s (fp32 [1]): q = quantize(y * (1 / clamp(s, FLT_MIN, FLT_MAX))).
//
// Shapes this kernel does not take (the Python wrapper composes the two ops instead, which is the
// same result by definition): rows not aligned for 16-byte vectors (input / residual / weight data
// pointers, row strides, hidden_size * sizeof(T)), and rows longer than the register path holds
// (more than 2048 vectors: hidden_size > 16384 for fp16 / bf16).
//
// Bytes moved: rmsnorm_quant N*H*s + H*s + N*H + scales; fused add 3*N*H*s + H*s + N*H + scales
// (s = sizeof(T)); the optional normed output adds N*H*s.
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, SymbolicSize, SymbolicDevice, kAnySize, data_ptr
#include <sgl_kernel/utils.h>   // For RuntimeCheck, Panic

#include <sgl_kernel/runtime.cuh>  // For runtime::get_sm_count
#include <sgl_kernel/utils.cuh>    // For LaunchKernel, SGL_DEVICE, kWarpThreads, fp8_e4m3_t
#include <sgl_kernel/vec.cuh>      // For AlignedVector
#include <sgl_kernel/warp.cuh>     // For warp::reduce_max

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cstdint>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/optional.h>
#include <type_traits>

#include "../quantization/quantize_8bit.cuh"  // For quant::block_scale, quantize_values, kTypeMax, store_row_group_scale
#include "norm_rows.cuh"  // For NormParams, NormRows, choose_geometry, set_row_geometry, normalize, row_reduce_sum

namespace {

/// How the scale of a value is found (NormQuantParams::mode).
enum class QuantMode : int32_t { kGroup = 0, kToken = 1, kStatic = 2 };

/// Kernel arguments of norm_quant_kernel. The norm part is norm_rows' (rows[0] only; rows[0].out is
/// the optional normed output, nullptr when not written).
struct NormQuantParams {
  NormParams norm;
  void* output_q;             // [num_tokens, hidden_size] of TOut, row stride q_row_stride
  void* output_s;             // kGroup: fp32 [num_tokens, num_groups] (ue8m0: int32 words
                              //   [num_tokens, ceil(num_groups / 4)]); kToken: fp32 [num_tokens]
  const float* static_scale;  // kStatic: fp32 [1], read after the PDL wait
  int64_t q_row_stride;       // elements (bytes) of output_q
  int64_t s_row_stride;       // elements of output_s per token
  int64_t s_group_stride;     // elements of output_s per group (ue8m0: per word of four groups)
  int64_t num_groups;         // hidden_size / group_size (kGroup)
  int32_t mode;               // QuantMode
  int32_t log2_group_vecs;    // kGroup: log2(group_size / kVecN), G <= 32 vectors
  float quant_eps;            // floor of a block's maximum (block_scale)
  bool scale_ue8m0;           // power-of-two scales stored as exponent bytes (kGroup, fp8)
  bool q_vec_aligned;         // output_q rows allow kVecN-byte stores (else byte stores)
  bool normed_vec_aligned;    // the normed rows allow 16-byte stores (else element stores)
  int64_t prefetch_rows;      // sm_90+: a CTA's lane 0 prefetches into L2 the input (and residual)
                              //   row this many rows ahead of its own (0: none)
};

/// Maximum of `value` (>= 0, NaN-free: an absolute maximum) over the tpr threads of each row, as
/// row_reduce_sum sums: tpr <= 32 by shuffles inside the row's lanes; tpr > 32 warp maxima to
/// smem[warp], one __syncthreads(), then the row's warps again. Every thread of the CTA calls it
/// with the same tpr; `smem` (kMaxWarps floats) is reused by the next group only after the next
/// row_reduce_sum's barrier. Example: tpr = 8, lanes holding their lane id: lanes 0..7 get 7.
SGL_DEVICE float row_reduce_max(float value, int tpr, int slot, float* smem) {
  const uint32_t lane = threadIdx.x % device::kWarpThreads;
  if (tpr < static_cast<int>(device::kWarpThreads)) {
#pragma unroll
    for (int mask = device::kWarpThreads / 2; mask > 0; mask >>= 1) {
      if (mask < tpr) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, mask));
    }
    return value;
  }
  value = device::warp::reduce_max<float>(value);
  if (tpr == static_cast<int>(device::kWarpThreads)) return value;
  const int warps_per_row = tpr / static_cast<int>(device::kWarpThreads);
  if (lane == 0) smem[threadIdx.x / device::kWarpThreads] = value;
  __syncthreads();
  value = static_cast<int>(lane) < warps_per_row ? smem[slot * warps_per_row + lane] : 0.0f;
  return device::warp::reduce_max<float>(value);
}

/// row_reduce_sum for a pair CTA (norm_quant_kernel with kPair): thread t holds the reduction
/// lanes i and i + 16 (i = t % 16) of warp t / 16 of the CTA rmsnorm launches (twice as many
/// threads), and `value` is their two sums added: warp::reduce_sum's first step (fp32 addition
/// commutes, so the same bits). Then its four other steps inside each half-warp, the warp sums to
/// smem[t / 16], one __syncthreads(), and row_reduce_sum's tree of the row's partials
/// (sum_row_partials): the total is bit for bit rmsnorm's. tpr: the row's reduction lanes (a
/// multiple of 32).
SGL_DEVICE float row_reduce_sum_pairs(float value, int tpr, int slot, float* smem) {
  const int warps_per_row = tpr / static_cast<int>(device::kWarpThreads);
  float* const warp_partial = smem + threadIdx.x / 16;
  const int first_partial = slot * warps_per_row;
  const float4* const row_partials = reinterpret_cast<const float4*>(smem + first_partial);
  value = device::warp::reduce_sum<float, 16>(value);
  if (tpr == static_cast<int>(device::kWarpThreads)) return value;
  if ((threadIdx.x & 15) == 0) *warp_partial = value;
  __syncthreads();
  return sum_row_partials(row_partials, smem, first_partial, warps_per_row);
}

/// Stores kN values of T (one vector store of kN * sizeof(T) bytes when `aligned`, element stores
/// otherwise).
template <typename V>
SGL_DEVICE void store_vector(const V& v, void* row, int64_t index, bool aligned) {
  if (aligned) {
    v.store(row, index);
  } else {
    using T = std::remove_cv_t<std::remove_reference_t<decltype(v[0])>>;
    constexpr int kN = sizeof(V) / sizeof(T);
#pragma unroll
    for (int i = 0; i < kN; ++i) static_cast<T*>(row)[index * kN + i] = v[i];
  }
}

/// One group of rows: norm_group_in_registers' loads, fused add, sum of squares and rstd (the same
/// order of operations, so the same bits), the rounded normalised vectors kept in registers, then
/// the scale of each value's block and the quantized bytes.
template <typename T, typename TOut, NormKind kKind, int kVecs, bool kPair>
SGL_DEVICE void norm_quant_group(
    const NormQuantParams& p,
    const NormRows& rows,
    int64_t group,
    int slot,
    int lane,
    float* sum_smem,
    float* max_smem) {
  using namespace device::quant;
  constexpr int kVecN = 16 / sizeof(T);
  using vec_t = device::AlignedVector<T, kVecN>;
  // fp8 with bounds +-448 needs no clamp (the satfinite conversion saturates alike; quantize_values).
  constexpr bool kClamp = std::is_same_v<TOut, int8_t>;
  constexpr float kQMax = kTypeMax<TOut>;
  constexpr float kQMin = std::is_same_v<TOut, int8_t> ? -128.0f : -kQMax;
  const NormParams& params = p.norm;
  const int tpr = rows.threads_per_row;
  // Vectors a thread holds: kVecs, or with kPair kVecs for each of its two reduction lanes.
  constexpr int kSlots = kPair ? 2 * kVecs : kVecs;
  // The row's vector of slot k of the thread whose (first) reduction lane is l.
  const auto vec_index = [tpr](int l, int k) { return kPair ? l + (k / kVecs) * 16 + (k % kVecs) * tpr : l + k * tpr; };
  const int64_t row = group * rows.rows_per_cta + slot;
  const bool active = row < rows.num_rows;
  RowPointers<T> ptrs{};
  if (active) ptrs = row_pointers<T, kKind>(rows, row);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Lane 0 of each row asks L2 for the row prefetch_rows ahead (the launcher's distance: a row that
  // a CTA starting a fraction of a wave later reads), so its bytes are on chip when that CTA starts.
  // Rows are 16-byte aligned and a multiple of 16 bytes long (the launcher's layout check), as the
  // bulk prefetch requires.
  if (lane == 0 && active && p.prefetch_rows > 0 && row + p.prefetch_rows < rows.num_rows) {
    const int64_t ahead = row + p.prefetch_rows;
    const auto bytes = static_cast<uint32_t>(rows.num_vecs * 16);
    const T* input = static_cast<const T*>(rows.input) + ahead * rows.input_token_stride;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(input), "r"(bytes) : "memory");
    if constexpr (kKind == NormKind::kFusedAddRMSNorm) {
      const T* residual = static_cast<const T*>(rows.residual) + ahead * rows.residual_token_stride;
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(residual), "r"(bytes) : "memory");
    }
  }
#endif
  bool valid[kSlots];
#pragma unroll
  for (int j = 0; j < kSlots; ++j) valid[j] = active && vec_index(lane, j) < rows.num_vecs;

  // As norm_group_in_registers: up to two vectors the arithmetic runs unpredicated on zeros.
  constexpr bool kStraight = kVecs <= 2;
  vec_t x[kSlots], w[kSlots];
#pragma unroll
  for (int j = 0; j < kSlots; ++j) {
    x[j].fill(device::cast<T>(0.0f));
    w[j].fill(device::cast<T>(0.0f));
  }
  pdl_wait_then_release();
#pragma unroll
  for (int j = 0; j < kSlots; ++j) {
    if (valid[j]) x[j].load(ptrs.input, vec_index(lane, j));
  }
#pragma unroll
  for (int j = 0; j < kSlots; ++j) {
    if (valid[j]) w[j].load(rows.weight, vec_index(lane, j));
  }
  if constexpr (kKind == NormKind::kFusedAddRMSNorm) {
    static_assert(!kPair, "norm_quant: pair CTAs are rmsnorm_quant's");
    vec_t r[kVecs];
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      r[j].fill(device::cast<T>(0.0f));
      if (valid[j]) r[j].load(ptrs.residual, lane + j * tpr);
    }
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (kStraight || valid[j]) x[j] = add_rounded(x[j], r[j]);
      if (valid[j]) x[j].store(ptrs.residual, lane + j * tpr);
    }
  }
  // norm_group_in_registers' reduction, statement for statement (the same rstd bits). Duplicated on
  // purpose: a helper shared with norm_rows.cuh alters the SASS of a fused_add_rmsnorm build.
  float sum = 0.0f;
  if constexpr (kPair) {
    static_assert(kStraight, "norm_quant: pair CTAs hold at most two vectors per reduction lane");
    vec_t first[kVecs], second[kVecs];
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      first[j] = x[j];
      second[j] = x[kVecs + j];
    }
    sum = sum_squares_all(first) + sum_squares_all(second);
  } else if constexpr (kStraight) {
    sum = sum_squares_all(x);
  } else {
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (valid[j]) sum += sum_squares(x[j]);
    }
  }
  const float total = kPair ? row_reduce_sum_pairs(sum, tpr, slot, sum_smem) : row_reduce_sum(sum, tpr, slot, sum_smem);
  const float rstd = rsqrtf(total * rows.inv_hidden_size + params.eps);
  const RowScale row_factors = row_scale(rstd, params.weight_offset);

  // y = round(x * (w * rstd)) as rmsnorm stores it; its fp32 values (exact) and |y| maxima.
  float y[kSlots][kVecN];
  float amax[kSlots];
  T* const normed = rows.out == nullptr ? nullptr : static_cast<T*>(rows.out) + row * rows.out_token_stride;
#pragma unroll
  for (int j = 0; j < kSlots; ++j) {
    const vec_t rounded = normalize(x[j], w[j], row_factors, params.weight_offset, false, false);
    if (valid[j] && normed != nullptr) store_vector(rounded, normed, vec_index(lane, j), p.normed_vec_aligned);
#pragma unroll
    for (int i = 0; i < kVecN / 2; ++i) {
      const float2 f = pair_as_float2(rounded, i);
      y[j][2 * i] = f.x;
      y[j][2 * i + 1] = f.y;
    }
    // Vectors past the row end hold zeros (neutral for the maximum); their lanes still shuffle.
    amax[j] = valid[j] ? values_absmax(y[j], 0.0f) : 0.0f;
  }

  float inv_scale[kSlots];
  const auto mode = static_cast<QuantMode>(p.mode);
  if (mode == QuantMode::kGroup) {
    const int group_vecs = 1 << p.log2_group_vecs;
    if constexpr (!kPair) {
      // A group longer than a row's lanes spans group_vecs / tpr consecutive slots of every lane.
#pragma unroll
      for (int span = 2; span <= kVecs; span *= 2) {
        if (group_vecs >= span * tpr) {
#pragma unroll
          for (int j = 0; j < kVecs; j += span) {
            const float m = fmaxf(amax[j], amax[j + span / 2]);
#pragma unroll
            for (int i = 0; i < span; ++i) amax[j + i] = m;
          }
        }
      }
    }
    // A group's threads: a power of two <= 32, aligned inside a warp (pair CTAs: groups of at most
    // 16 vectors, each inside one of a thread's two reduction lanes; use_pair_ctas).
    const int lanes = kPair || group_vecs < tpr ? group_vecs : tpr;
#pragma unroll
    for (int mask = device::kWarpThreads / 2; mask > 0; mask >>= 1) {
      if (mask < lanes) {
#pragma unroll
        for (int j = 0; j < kSlots; ++j) amax[j] = fmaxf(amax[j], __shfl_xor_sync(0xffffffffu, amax[j], mask));
      }
    }
    void* const row_scales = active ? static_cast<uint8_t*>(p.output_s) + 4 * row * p.s_row_stride : nullptr;
    if (kSlots > 1 && lanes >= kSlots) {
      // Every thread of an aligned block of `lanes` threads holds the same kSlots slot maxima (one
      // group per slot, or one group shared by slots): thread l finds the scale of slot
      // own = l % kSlots only, and takes the other slots' inverse scales from its kSlots-aligned
      // neighbours (warp lanes base .. base + kSlots - 1; one division chain per thread instead of
      // kSlots). Thread base + j stores slot j's scale when slot j's vector of thread base starts a
      // group.
      const int own = lane & (kSlots - 1);
      float m = amax[0];
#pragma unroll
      for (int j = 1; j < kSlots; ++j) m = own == j ? amax[j] : m;
      const float scale = block_scale(m, p.quant_eps, kQMax, p.scale_ue8m0);
      const float inv = __fdiv_rn(1.0f, scale);
      const int base = static_cast<int>(threadIdx.x % device::kWarpThreads) & ~(kSlots - 1);
#pragma unroll
      for (int j = 0; j < kSlots; ++j) inv_scale[j] = __shfl_sync(0xffffffffu, inv, base + j);
      bool own_valid = valid[0];
#pragma unroll
      for (int j = 1; j < kSlots; ++j) own_valid = own == j ? valid[j] : own_valid;
      const auto first = static_cast<uint32_t>(vec_index(lane - own, own));  // slot own's vector of thread base
      if (own_valid && (first & (group_vecs - 1)) == 0)
        store_row_group_scale(
            row_scales, first >> p.log2_group_vecs, scale, p.s_group_stride, p.num_groups, p.scale_ue8m0);
    } else {
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
        const float scale = block_scale(amax[j], p.quant_eps, kQMax, p.scale_ue8m0);
        inv_scale[j] = __fdiv_rn(1.0f, scale);
        const auto index = static_cast<uint32_t>(vec_index(lane, j));
        if (valid[j] && (index & (group_vecs - 1)) == 0)
          store_row_group_scale(
              row_scales, index >> p.log2_group_vecs, scale, p.s_group_stride, p.num_groups, p.scale_ue8m0);
      }
    }
  } else if (mode == QuantMode::kToken) {
    float row_max = 0.0f;
#pragma unroll
    for (int j = 0; j < kSlots; ++j) row_max = fmaxf(row_max, amax[j]);
    // The maximum needs no order: a pair row is tpr / 2 threads.
    row_max = row_reduce_max(row_max, kPair ? tpr / 2 : tpr, slot, max_smem);
    const float scale = block_scale(row_max, p.quant_eps, kQMax, false);
#pragma unroll
    for (int j = 0; j < kSlots; ++j) inv_scale[j] = __fdiv_rn(1.0f, scale);
    if (active && lane == 0) static_cast<float*>(p.output_s)[row * p.s_row_stride] = scale;
  } else {
    const float inv = __fdiv_rn(1.0f, fminf(fmaxf(*p.static_scale, FLT_MIN), FLT_MAX));
#pragma unroll
    for (int j = 0; j < kSlots; ++j) inv_scale[j] = inv;
  }

  TOut* const q_row = static_cast<TOut*>(p.output_q) + row * p.q_row_stride;
#pragma unroll
  for (int j = 0; j < kSlots; ++j) {
    if (valid[j]) {
      const Chunk<TOut, kVecN, true> q = quantize_values<TOut, kClamp, kVecN, true>(y[j], inv_scale[j], kQMin, kQMax);
      store_vector(q.vec, q_row, vec_index(lane, j), p.q_vec_aligned);
    }
  }
}

/// Bytes of x one thread of norm_quant_kernel<T, ..., kVecs> holds.
template <typename T, int kVecs>
inline constexpr int kNormQuantThreadBytes = kVecs * 16;

/// Minimum resident CTAs of a build (__launch_bounds__): norm_rows_kernel's, capped at 4 CTAs of
/// 256 threads (64 registers: the quant epilogue's rounded row in fp32 and block maxima fit without
/// spills at up to four vectors per thread); the fused add with four vectors keeps norm_rows' 1, and
/// wide builds 1. The pair build (CTAs of at most 128 threads, four vectors a thread): 6 CTAs (80
/// registers).
template <NormKind kKind, int kVecs, bool kWide, bool kPair>
inline constexpr int kNormQuantMinBlocks =
    kPair ? 6 : std::min(NormConfig::bound_blocks(kKind, kVecs * 16, false, kWide, kVecs), kWide ? 1 : 4);

/// Normalises and quantizes every row of params.norm.rows[0]. Block: rows_per_cta * threads_per_row
/// threads (choose_geometry of kKind with 16-byte vectors), half that with kPair; grid: any size,
/// CTAs stride over groups of rows. kVecs: vectors per reduction lane (1, 2 or 4); kWide: the build
/// for CTAs of more than NormConfig::kBlockThreads threads. kPair (rmsnorm_quant, kVecs = 2; when:
/// use_pair_ctas): each thread holds two reduction lanes of rmsnorm's geometry, i and i + 16 of a
/// warp of it (row_reduce_sum_pairs), so the per-row work of a thread (its reduction steps, scale,
/// pointers) is spread over twice the elements, with the same bits. Register budgets:
/// kNormQuantMinBlocks.
template <typename T, typename TOut, NormKind kKind, int kVecs, bool kWide, bool kPair>
__global__ void __launch_bounds__(
    kPair ? NormConfig::kBlockThreads / 2
          : NormConfig::bound_threads(kKind, kNormQuantThreadBytes<T, kVecs>, false, kWide, kVecs),
    kNormQuantMinBlocks<kKind, kVecs, kWide, kPair>) norm_quant_kernel(const NormQuantParams p) {
  __shared__ alignas(16) float sum_partials[2][NormConfig::kMaxWarps];  // alternated per group
  __shared__ float max_partials[NormConfig::kMaxWarps];
  const NormRows& rows = p.norm.rows[0];
  const int tpr = rows.threads_per_row;
  const int tid = static_cast<int>(threadIdx.x);
  // The thread's (first) reduction lane in the CTA: its own id, or for pairs lane t % 16 of warp t / 16.
  const int first_lane = kPair ? (tid >> 4) * 32 + (tid & 15) : tid;
  const int slot = rows.rows_per_cta == 1 ? 0 : (rows.tpr_shift >= 0 ? first_lane >> rows.tpr_shift : first_lane / tpr);
  const int lane = first_lane - slot * tpr;
  int parity = 0;
  for (int64_t group = blockIdx.x; group < rows.num_groups; group += gridDim.x) {
    norm_quant_group<T, TOut, kKind, kVecs, kPair>(p, rows, group, slot, lane, sum_partials[parity], max_partials);
    parity ^= 1;
  }
}

// ---------------------------------------------------------------------------------------------
// Host side
// ---------------------------------------------------------------------------------------------

/// Whether an rmsnorm_quant launch of `geometry` takes the pair build: two vectors per reduction
/// lane; rows of 32 reduction lanes (a half-warp of pair threads each) or of a multiple of 64 (whole
/// warps of pair threads: a row of 96 would share a warp with the next row), in CTAs of an even
/// number of warps; no quant group wider than 16 vectors (group_vecs; 0 for per-token and static
/// scales); and more groups of rows than SMs. At most one CTA per SM (decode) the launch is
/// latency-bound, and a thread with one reduction lane has the shorter chain.
inline bool use_pair_ctas(const NormGeometry& geometry, int64_t group_vecs, int64_t row_groups, int64_t sm_count) {
  return geometry.vecs_per_thread == 2 && (geometry.threads_per_row == 32 || geometry.threads_per_row % 64 == 0) &&
         geometry.block_threads <= NormConfig::kBlockThreads && geometry.block_threads % 64 == 0 && group_vecs <= 16 &&
         row_groups > sm_count;
}

template <typename T, typename TOut, NormKind kKind, int kVecs>
void launch_norm_quant_bucket(
    const NormQuantParams& params, const NormGeometry& geometry, DLDevice device, bool pdl, bool pair) {
  const int64_t grid = std::min(params.norm.rows[0].num_groups, NormConfig::kMaxGridCtas);
  auto launch = [&](auto kernel, uint32_t threads) {
    host::LaunchKernel(static_cast<uint32_t>(grid), threads, device).enable_pdl(pdl)(kernel, params);
  };
  if constexpr (kKind == NormKind::kRMSNorm && kVecs == 2) {
    if (pair) return launch(norm_quant_kernel<T, TOut, kKind, kVecs, false, true>, geometry.block_threads / 2);
  }
  constexpr int kBytes = kNormQuantThreadBytes<T, kVecs>;
  if constexpr (NormConfig::max_threads(kKind, kBytes, false, kVecs) > NormConfig::kBlockThreads) {
    if (geometry.block_threads > NormConfig::kBlockThreads)
      return launch(norm_quant_kernel<T, TOut, kKind, kVecs, true, false>, geometry.block_threads);
  }
  launch(norm_quant_kernel<T, TOut, kKind, kVecs, false, false>, geometry.block_threads);
}

/// The launcher of both ops, exported per kKind: kRMSNorm is rmsnorm_quant (residual absent),
/// kFusedAddRMSNorm fused_add_rmsnorm_quant (residual <- round(input + residual) in place, then as
/// rmsnorm_quant on the rounded sum; input is read only unless normed is input).
/// input: [num_tokens, hidden_size] of T, last dim contiguous, any row stride (16-byte aligned
/// rows); residual: the same shape and dtype, its own row stride, disjoint from every other tensor;
/// weight: [hidden_size]; output_q: [num_tokens, hidden_size] of TOut, any row stride; output_s:
/// mode 0 (group) fp32 [num_tokens, hidden_size / group_size] (ue8m0: int32 [num_tokens,
/// ceil(num_groups / 4)]), any strides; mode 1 (token) fp32 [num_tokens]; mode 2 (static) the
/// scale, fp32 [1], read. normed: optional [num_tokens, hidden_size] of T (may be input). T = fp16_t
/// | bf16_t; TOut = fp8_e4m3_t | int8_t. Empty inputs return without a launch. Throws PanicError
/// (Python RuntimeError) naming the tensor on any mismatch.
template <typename T, typename TOut, NormKind kKind>
void norm_quant(
    tvm::ffi::TensorView input,
    tvm::ffi::Optional<tvm::ffi::TensorView> residual,
    tvm::ffi::TensorView weight,
    tvm::ffi::TensorView output_q,
    tvm::ffi::TensorView output_s,
    tvm::ffi::Optional<tvm::ffi::TensorView> normed,
    double eps,
    double quant_eps,
    int64_t mode,
    int64_t group_size,
    bool scale_ue8m0,
    int64_t enable_pdl) {
  using namespace host;
  static_assert(std::is_same_v<T, fp16_t> || std::is_same_v<T, bf16_t>, "norm_quant: T must be fp16_t or bf16_t");
  static_assert(
      std::is_same_v<TOut, fp8_e4m3_t> || std::is_same_v<TOut, int8_t>,
      "norm_quant: TOut must be fp8_e4m3_t or int8_t");
  static_assert(kKind == NormKind::kRMSNorm || kKind == NormKind::kFusedAddRMSNorm, "norm_quant: a row kind");
  constexpr int64_t kVecN = 16 / sizeof(T);
  const char* const op = kKind == NormKind::kRMSNorm ? "rmsnorm_quant" : "fused_add_rmsnorm_quant";
  RuntimeCheck(
      residual.has_value() == (kKind == NormKind::kFusedAddRMSNorm),
      op,
      ": residual: expected ",
      kKind == NormKind::kRMSNorm ? "none" : "a tensor");

  // Validate
  SymbolicSize num_tokens{"num_tokens"};
  SymbolicSize hidden_size{"hidden_size"};
  SymbolicSize q_row_stride{"q_row_stride"};
  SymbolicDevice device_;
  device_.set_options<kDLCUDA>();
  TensorMatcher({num_tokens, hidden_size})  //
      .with_strides({kAnySize, 1})
      .with_dtype<T>()
      .with_device<kDLCUDA>(device_)
      .verify(input, "input");
  TensorMatcher({hidden_size})  //
      .with_dtype<T>()
      .with_device<kDLCUDA>(device_)
      .verify(weight, "weight");
  TensorMatcher({num_tokens, hidden_size})  //
      .with_strides({q_row_stride, 1})
      .with_dtype<TOut>()
      .with_device<kDLCUDA>(device_)
      .verify(output_q, "output_q");
  if (residual.has_value()) {
    TensorMatcher({num_tokens, hidden_size})  //
        .with_strides({kAnySize, 1})
        .with_dtype<T>()
        .with_device<kDLCUDA>(device_)
        .verify(residual.value(), "residual");
  }
  if (normed.has_value()) {
    TensorMatcher({num_tokens, hidden_size})  //
        .with_strides({kAnySize, 1})
        .with_dtype<T>()
        .with_device<kDLCUDA>(device_)
        .verify(normed.value(), "output_normed");
  }
  const int64_t h = hidden_size.unwrap();
  const auto quant_mode = static_cast<QuantMode>(mode);
  RuntimeCheck(mode >= 0 && mode <= 2, op, ": quant mode must be 0 (group), 1 (token) or 2 (static), got ", mode);
  int64_t num_groups = 0;
  if (quant_mode == QuantMode::kGroup) {
    RuntimeCheck(
        group_size >= 16 && group_size <= 32 * kVecN && (group_size & (group_size - 1)) == 0,
        op,
        ": group_size value: expected a power of two in [16, ",
        32 * kVecN,
        "], got ",
        group_size);
    RuntimeCheck(
        h % group_size == 0,
        op,
        ": input shape: expected hidden_size a multiple of group_size=",
        group_size,
        ", got ",
        h);
    num_groups = h / group_size;
    SymbolicSize scale_cols{"scale_cols"};
    scale_cols.set_value(scale_ue8m0 ? div_ceil(num_groups, int64_t{4}) : num_groups);
    auto matcher = TensorMatcher({num_tokens, scale_cols}).with_strides({kAnySize, kAnySize});
    if (scale_ue8m0) {
      RuntimeCheck(std::is_same_v<TOut, fp8_e4m3_t>, op, ": output_q dtype: expected float8_e4m3fn with scale_ue8m0");
      matcher.with_dtype<int32_t>().with_device<kDLCUDA>(device_).verify(output_s, "output_s");
    } else {
      matcher.with_dtype<float>().with_device<kDLCUDA>(device_).verify(output_s, "output_s");
    }
  } else if (quant_mode == QuantMode::kToken) {
    TensorMatcher({num_tokens})  //
        .with_strides({kAnySize})
        .with_dtype<float>()
        .with_device<kDLCUDA>(device_)
        .verify(output_s, "output_s");
  } else {
    TensorMatcher({1}).with_dtype<float>().with_device<kDLCUDA>(device_).verify(output_s, "scale");
  }
  verify_no_self_overlap(output_q, "output_q");
  verify_no_partial_overlap(output_q, "output_q", input, "input", false);
  verify_no_partial_overlap(output_q, "output_q", weight, "weight", false);
  if (quant_mode != QuantMode::kStatic) {
    verify_no_self_overlap(output_s, "output_s");
    verify_no_partial_overlap(output_s, "output_s", input, "input", false);
    verify_no_partial_overlap(output_s, "output_s", weight, "weight", false);
    verify_no_partial_overlap(output_s, "output_s", output_q, "output_q", false);
  } else {
    // Every thread reads the static scale while output_q is written.
    verify_no_partial_overlap(output_q, "output_q", output_s, "scale", false);
  }
  if (residual.has_value()) {
    const tvm::ffi::TensorView& r = residual.value();
    verify_no_self_overlap(r, "residual");
    verify_no_partial_overlap(r, "residual", input, "input", false);
    verify_no_partial_overlap(r, "residual", weight, "weight", false);
    verify_no_partial_overlap(output_q, "output_q", r, "residual", false);
    verify_no_partial_overlap(output_s, "output_s", r, "residual", false);
  }
  if (normed.has_value()) {
    const tvm::ffi::TensorView& y = normed.value();
    verify_no_self_overlap(y, "output_normed");
    // In place over input: every element is read before the thread that reads it writes it.
    verify_no_partial_overlap(y, "output_normed", input, "input", true);
    verify_no_partial_overlap(y, "output_normed", weight, "weight", false);
    verify_no_partial_overlap(output_q, "output_q", y, "output_normed", false);
    verify_no_partial_overlap(output_s, "output_s", y, "output_normed", false);
    if (residual.has_value()) verify_no_partial_overlap(y, "output_normed", residual.value(), "residual", false);
  }

  // Unwrap
  const int64_t n = num_tokens.unwrap();
  const DLDevice device = device_.unwrap();
  check_norm_scalars(op, h, eps);
  RuntimeCheck(quant_eps >= 0.0, op, ": quant_eps value: expected >= 0, got ", quant_eps);
  if (n == 0 || h == 0) return;
  const int64_t input_stride = input.stride(0);
  const int64_t residual_stride = residual.has_value() ? residual.value().stride(0) : 0;
  const uint64_t row_bytes = n > 1 ? static_cast<uint64_t>(input_stride | residual_stride) * sizeof(T) : 0;
  const int64_t vec_bytes = widest_vector_bytes<T>(
      {address_of(data_ptr<const void>(input)),
       residual.has_value() ? address_of(data_ptr<const void>(residual.value())) : 0,
       address_of(data_ptr<const void>(weight)),
       row_bytes,
       static_cast<uint64_t>(h) * sizeof(T)});
  RuntimeCheck(
      vec_bytes == 16,
      op,
      ": input layout: expected 16-byte aligned rows (data pointers, row strides, hidden_size * ",
      sizeof(T),
      "), got ",
      vec_bytes,
      "-byte alignment (the Python wrapper composes the unfused ops for such rows)");

  // Configure
  NormQuantParams params{};
  params.norm.rows[0] = NormRows{
      .input = data_ptr<const void>(input),
      .out = normed.has_value() ? data_ptr(normed.value()) : nullptr,
      .residual = residual.has_value() ? data_ptr(residual.value()) : nullptr,
      .weight = data_ptr<const void>(weight),
      .num_rows = n,
      .num_groups = 0,  // set with the geometry
      .num_heads = 1,
      .hidden_size = h,
      .input_token_stride = input_stride,
      .input_head_stride = 0,
      .out_token_stride = normed.has_value() ? normed.value().stride(0) : 0,
      .out_head_stride = 0,
      .residual_token_stride = residual_stride,
  };
  params.norm.eps = static_cast<float>(eps);
  params.norm.weight_offset = 0.0f;
  params.output_q = data_ptr(output_q);
  params.output_s = quant_mode == QuantMode::kStatic ? nullptr : data_ptr(output_s);
  params.static_scale = quant_mode == QuantMode::kStatic ? data_ptr<const float>(output_s) : nullptr;
  params.q_row_stride = q_row_stride.unwrap();
  params.s_row_stride = quant_mode == QuantMode::kStatic ? 0 : output_s.stride(0);
  params.s_group_stride = quant_mode == QuantMode::kGroup ? output_s.stride(1) : 0;
  params.num_groups = num_groups;
  params.mode = static_cast<int32_t>(mode);
  params.log2_group_vecs =
      quant_mode == QuantMode::kGroup ? std::countr_zero(static_cast<uint64_t>(group_size / kVecN)) : 0;
  params.quant_eps = static_cast<float>(quant_eps);
  params.scale_ue8m0 = scale_ue8m0;
  params.q_vec_aligned =
      address_of(params.output_q) % kVecN == 0 && (n == 1 || static_cast<uint64_t>(params.q_row_stride) % kVecN == 0);
  params.normed_vec_aligned =
      normed.has_value() && address_of(params.norm.rows[0].out) % 16 == 0 &&
      (n == 1 || static_cast<uint64_t>(params.norm.rows[0].out_token_stride) * sizeof(T) % 16 == 0);

  // The geometry rmsnorm / fused_add_rmsnorm choose for these rows: the same reduction order.
  const int64_t sm_count = host::runtime::get_sm_count(device.device_id);
  const NormGeometry geometry = choose_geometry(kKind, h / kVecN, 16, n, sm_count);
  RuntimeCheck(
      geometry.vecs_per_thread > 0,
      op,
      ": hidden_size value: expected at most ",
      2048 * kVecN,
      " (rows held in registers), got ",
      h);
  set_row_geometry<kVecN>(params.norm.rows[0], geometry, h / kVecN);
  // Prefetch distance, in CTAs' rows per SM: 2 for rmsnorm_quant, 1 for the fused add, which also
  // prefetches the residual and writes it back (measured best on the H100, docs/perf_notes.md).
  const int64_t prefetch_ctas_per_sm = kKind == NormKind::kFusedAddRMSNorm ? 1 : 2;
  params.prefetch_rows = prefetch_ctas_per_sm * sm_count * params.norm.rows[0].rows_per_cta;

  // Launch
  const bool pdl = resolve_pdl(enable_pdl, device);
  const bool pair =
      kKind == NormKind::kRMSNorm &&
      use_pair_ctas(
          geometry, quant_mode == QuantMode::kGroup ? group_size / kVecN : 0, params.norm.rows[0].num_groups, sm_count);
  switch (geometry.vecs_per_thread) {
    case 1:
      return launch_norm_quant_bucket<T, TOut, kKind, 1>(params, geometry, device, pdl, pair);
    case 2:
      return launch_norm_quant_bucket<T, TOut, kKind, 2>(params, geometry, device, pdl, pair);
    case 4:
      return launch_norm_quant_bucket<T, TOut, kKind, 4>(params, geometry, device, pdl, pair);
    default:
      Panic(op, ": unexpected vectors per thread ", geometry.vecs_per_thread);
  }
}

}  // namespace
