// The row-normalisation engine of the in-place norm ops: one kernel template, norm_rows_kernel,
// the launch logic that picks its build for a shape, and the row math and geometry that every norm
// kernel shares (rmsnorm.cuh's, norm_quant.cuh's), so that their sums of squares agree bit for bit.
//
//   out[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * (w + weight_offset)
//
// fp32 arithmetic, one rounding to the dtype (weight_offset = 1 gives Gemma's (1 + w)).
//
// norm_rows_kernel<T, kVecN, kKind, kVecs, kWide, kL2Hint> computes one op per kKind; each op's
// launcher lives in its own file and instantiates only its kind:
//   kFusedAddRMSNorm  residual <- round(input + residual); input <- rmsnorm(residual)  (fused_add_rmsnorm.cuh)
//   kQKNorm           every head of q and of k normalised in place, two weights        (qknorm.cuh);
//                     also every whole row of q and of k, two hidden sizes  (qknorm_across_heads.cuh)
// kRMSNorm (rows of `input` -> rows of `out`) has no build here: it names the geometry
// (choose_geometry, NormConfig) of rmsnorm.cuh's and norm_quant.cuh's own kernels, which use this
// file's row math so that every norm op sums and scales a row alike.
//
// Layout of the work. A "row" is one normalised vector of hidden_size elements: a token of
// rmsnorm, a (token, head) pair of qknorm. threads_per_row (TPR) threads share a row; each holds
// up to kMaxVecs vectors of kVecN elements (16 bytes when the pointers and strides allow it), so
// x is read once from DRAM and kept in registers between the reduction and the scaling:
//   TPR <= 32   several rows per warp, the sum of squares reduced by shuffles inside TPR lanes;
//   TPR  > 32   one or more rows per CTA, warp partials combined through shared memory.
// Rows too long for registers (more than TPR * kMaxVecs vectors) take two passes: sum of squares,
// then a re-read (an L2 hit) to scale and store. CTAs stride over groups of rows_per_cta rows of
// one tensor (qknorm splits the CTAs between q and k in proportion to their rows); the launchers
// size the grid at one CTA per group (launch_norm_kernel), so a CTA loads its rows and the weight
// together and the hardware starts the next CTA as soon as one retires. (The fused add with four
// or more vectors per thread keeps the weight in registers across groups.) Register budgets are
// pinned by __launch_bounds__ (NormConfig::narrow_min_blocks): occupancy is what these kernels
// live on. With PDL the kernel runs its index arithmetic (kernel parameters only) before
// griddepcontrol.wait, issues its first global load right after it and releases the next kernel
// (launch_dependents) at the same point, so the next kernel's prologue overlaps this one; the
// sums and shuffles after the loads are straight-line code (norm_group_in_registers,
// row_reduce_sum), which is what brings a decode row down to the time of its bytes.
//
// Large in-place launches (the fused add, qknorm, and rmsnorm.cuh's kernel with out = input) load
// their rows evict_last and store evict_normal (RowAccess): the L2 then writes dirty lines back
// first and DRAM keeps the rate of a copy. These are separate builds (kL2Hint); small and
// out-of-place launches use the plain ones.
//
// Memory traffic (the bytes-moved counts of the benchmarks): rmsnorm 2*N*H*sizeof(T) + H*sizeof(T);
// fused add 4*N*H*sizeof(T) + H*sizeof(T); qknorm 2*N*(Hq+Hk)*D*sizeof(T) + 2*D*sizeof(T).
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, SymbolicSize, SymbolicDevice, kAnySize, data_ptr
#include <sgl_kernel/utils.h>   // For RuntimeCheck, div_ceil

#include <sgl_kernel/runtime.cuh>  // For runtime::get_sm_count, get_cc_major
#include <sgl_kernel/type.cuh>     // For device::cast
#include <sgl_kernel/utils.cuh>    // For LaunchKernel, SGL_DEVICE, kWarpThreads, pdl_wait_primary
#include <sgl_kernel/vec.cuh>      // For AlignedVector
#include <sgl_kernel/warp.cuh>     // For warp::reduce_sum

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <dlpack/dlpack.h>
#include <initializer_list>
#include <tvm/ffi/container/tensor.h>
#include <type_traits>

namespace {

/// Which op a norm_rows_kernel instantiation computes.
enum class NormKind { kRMSNorm, kFusedAddRMSNorm, kQKNorm };

/// One tensor's rows. Row r is (token, head) = (r / num_heads, r % num_heads) and lives at
/// input + token * input_token_stride + head * input_head_stride (elements; the last dim is
/// contiguous). rmsnorm and the fused add: num_heads = 1. The launch geometry of the rows (the
/// fields after head_shift) is per tensor: the two tensors of one kQKNorm launch may have rows of
/// different lengths (q and k across heads) and then share the CTA size and vectors per thread only.
struct NormRows {
  const void* input;              // [num_tokens, num_heads, hidden_size]
  void* out;                      // [num_tokens, num_heads, hidden_size] (kRMSNorm; the others write input)
  void* residual;                 // [num_tokens, hidden_size]; kFusedAddRMSNorm only
  const void* weight;             // [hidden_size]
  int64_t num_rows;               // num_tokens * num_heads
  int64_t num_groups;             // div_ceil(num_rows, rows_per_cta)
  int64_t num_heads;              // rows per token (>= 1)
  int64_t hidden_size;            // elements per row (< 2^30, checked)
  int64_t input_token_stride;     // elements
  int64_t input_head_stride;      // elements
  int64_t out_token_stride;       // elements
  int64_t out_head_stride;        // elements
  int64_t residual_token_stride;  // elements
  uint32_t head_magic;            // row / num_heads = (row * head_magic) >> head_shift for row < 2^31
  uint32_t head_shift;            //   (set by the launcher; see set_head_divisor)
  // Set by launch_norm_rows (set_row_geometry):
  int32_t num_vecs;         // vectors per row: hidden_size / kVecN
  int32_t threads_per_row;  // TPR: a power of two <= 32, or a multiple of 32; divides blockDim.x
  int32_t rows_per_cta;     // blockDim.x / threads_per_row
  int32_t tpr_shift;        // log2(threads_per_row) when it is a power of two, else -1
  float inv_hidden_size;    // 1 / hidden_size
};

/// Kernel arguments of norm_rows_kernel.
struct NormParams {
  NormRows rows[2];          // kQKNorm: {q, k}; otherwise rows[0] only
  int64_t rows0_ctas;        // kQKNorm: CTAs [0, rows0_ctas) serve q, the rest k
  float eps;                 // added to the mean square
  float weight_offset;       // 0 (RMSNorm) or 1 (Gemma: w + 1)
  bool interleave_segments;  // kQKNorm: q and k CTAs interleaved in launch order (cta_share)
};

/// Launch facts of norm_rows_kernel.
struct NormConfig {
  static constexpr int kTargetVecs = 2;                      // vectors per thread the heuristic aims for
  static constexpr int64_t kPreferredRowThreads = 256;       // rows wider than this take more vectors
                                                             // per thread first (H=8192 as 256 x 4)
  static constexpr int64_t kPreferredFusedRowThreads = 512;  // the fused add: H=8192 as 512 x 2
                                                             // (256 x 4 needs 80 registers and spills)
  static constexpr uint32_t kBlockThreads = 256;             // CTA size when several rows share a CTA
  static constexpr uint32_t kMaxWarps = 32;                  // shared-memory partials per buffer
  static constexpr int kMaxThreadBytes = 64;                 // x held per thread at most (registers)
  // In-place launches whose input rows (num_rows x hidden_size elements; the fused add reads as
  // many again from the residual) hold at least this many bytes take the L2 hint (RowAccess).
  static constexpr int64_t kL2HintMinBytes = int64_t{1} << 20;
  static constexpr int64_t kMaxGridCtas = int64_t{1} << 30;  // CTAs of one launch at most

  /// Vectors of x a thread may hold: 64 bytes' worth, at most 8. The register path is compiled for
  /// 1, 2, 4 and 8 (when allowed) vectors per thread; the two-pass path moves chunks of max_vecs.
  static constexpr int max_vecs(int vec_bytes) {
    return kMaxThreadBytes / vec_bytes < 8 ? kMaxThreadBytes / vec_bytes : 8;
  }

  /// Largest CTA (and TPR) for a kind and the bytes of x per thread; also the kernel's
  /// __launch_bounds__, i.e. its register budget: 1024 threads (64 registers) hold 32 bytes of x
  /// plus the weight, 256 threads hold 64 (with min_blocks, narrow_min_blocks); the two-pass
  /// path runs 512 threads; the fused add with eight (narrow) vectors per thread 512, so that it
  /// does not spill (unaligned fused rows of more than 512 * 8 vectors take two passes).
  /// qknorm: 256 (heads are short).
  static constexpr uint32_t max_threads(NormKind kind, int thread_bytes, bool two_pass = false, int vecs = 0) {
    if (kind == NormKind::kQKNorm) return 256;
    if (two_pass) return 512;
    if (kind == NormKind::kFusedAddRMSNorm && vecs >= 8) return 512;  // 128 registers: x, residual, weight
    return thread_bytes > 32 ? 256 : 1024;
  }

  /// Register-path kernels come in two builds: "narrow" for CTAs of at most kBlockThreads threads
  /// and "wide" for larger ones (long rows). The narrow build is compiled for a minimum of resident
  /// CTAs (__launch_bounds__), which caps its registers so that occupancy does not hinge on the
  /// compiler's choice: these kernels live on bytes in flight per SM, and one register across an
  /// occupancy edge costs more than any instruction it saves. The caps are the tightest without spills for every
  /// dtype (tests/test_norm_compile.py checks the ptxas reports): rmsnorm / qknorm 4 CTAs (64
  /// registers) above 32 bytes of x per thread, 6 (40) for 17..32 bytes in one or two vectors, 5
  /// (48) in four; the fused add 4 (64) up to 32 bytes, 1 above; 2 (128) for eight vectors.
  static constexpr int narrow_min_blocks(NormKind kind, int thread_bytes, int vecs) {
    if (vecs >= 8) return 2;  // eight loads per thread (narrow vectors): 128 registers
    if (kind == NormKind::kFusedAddRMSNorm) return thread_bytes > 32 ? 1 : 4;
    if (thread_bytes > 32) return 4;
    if (thread_bytes > 16) return vecs >= 4 ? 5 : 6;
    return 4;
  }

  /// __launch_bounds__ of a kernel build: (threads, minimum resident CTAs).
  static constexpr uint32_t bound_threads(NormKind kind, int thread_bytes, bool two_pass, bool wide, int vecs) {
    const uint32_t most = max_threads(kind, thread_bytes, two_pass, vecs);
    return two_pass || wide || most < kBlockThreads ? most : kBlockThreads;
  }
  static constexpr int bound_blocks(NormKind kind, int thread_bytes, bool two_pass, bool wide, int vecs) {
    return two_pass || wide ? 1 : narrow_min_blocks(kind, thread_bytes, vecs);
  }
};

// ---------------------------------------------------------------------------------------------
// Device helpers
// ---------------------------------------------------------------------------------------------

/// Elements 2i and 2i + 1 of v in fp32. bf16 -> fp32 is exact bit placement (one shift or mask per
/// element instead of the generic unpack-then-convert pair); fp16 uses the paired conversion.
template <typename T, std::size_t N>
SGL_DEVICE float2 pair_as_float2(const device::AlignedVector<T, N>& v, std::size_t i) {
  if constexpr (std::is_same_v<T, bf16_t> && N >= 2) {
    uint32_t bits;
    memcpy(&bits, &v[2 * i], sizeof(bits));
    return make_float2(__uint_as_float(bits << 16), __uint_as_float(bits & 0xffff0000u));
  } else if constexpr (std::is_same_v<T, fp16_t> && N >= 2) {
    fp16x2_t pair;
    memcpy(&pair, &v[2 * i], sizeof(pair));
    return __half22float2(pair);
  } else {
    return make_float2(device::cast<fp32_t>(v[2 * i]), device::cast<fp32_t>(v[2 * i + 1]));
  }
}

/// Writes f rounded to T into elements 2i and 2i + 1 of v (one packed conversion for fp16 / bf16).
template <typename T, std::size_t N>
SGL_DEVICE void set_pair(device::AlignedVector<T, N>& v, std::size_t i, float2 f) {
  if constexpr ((std::is_same_v<T, bf16_t> || std::is_same_v<T, fp16_t>) && N >= 2) {
    const packed_t<T> pair = device::cast<packed_t<T>>(f);
    memcpy(&v[2 * i], &pair, sizeof(pair));
  } else {
    v[2 * i] = device::cast<T>(f.x);
    v[2 * i + 1] = device::cast<T>(f.y);
  }
}

/// Applies op(float2 of x's pair i, float2 of y's pair i) -> float2 to every pair (or op on
/// {x[0], 0} for one-element vectors) and returns the results rounded to T.
template <typename T, std::size_t N, typename Op>
SGL_DEVICE device::AlignedVector<T, N> map_pairs(
    const device::AlignedVector<T, N>& x, const device::AlignedVector<T, N>& y, Op op) {
  device::AlignedVector<T, N> out;
  if constexpr (N >= 2) {
#pragma unroll
    for (std::size_t i = 0; i < N / 2; ++i) set_pair(out, i, op(pair_as_float2(x, i), pair_as_float2(y, i)));
  } else {
    const float2 f = op(make_float2(device::cast<fp32_t>(x[0]), 0.0f), make_float2(device::cast<fp32_t>(y[0]), 0.0f));
    out[0] = device::cast<T>(f.x);
  }
  return out;
}

/// Sum of x[i]^2 in fp32 over one vector: even and odd elements in two chains (half the dependent
/// FMAs on the decode critical path), added at the end.
template <typename T, std::size_t N>
SGL_DEVICE float sum_squares(const device::AlignedVector<T, N>& x) {
  if constexpr (N >= 2) {
    float even = 0.0f, odd = 0.0f;
#pragma unroll
    for (std::size_t i = 0; i < N / 2; ++i) {
      const float2 f = pair_as_float2(x, i);
      even = fmaf(f.x, f.x, even);
      odd = fmaf(f.y, f.y, odd);
    }
    return even + odd;
  } else {
    const float f = device::cast<fp32_t>(x[0]);
    return f * f;
  }
}

/// Sum of sum_squares(x[j]) over j < kVecs as a pairwise tree (the vectors' chains run side by side).
template <int kVecs, typename T, std::size_t N>
SGL_DEVICE float sum_squares_all(const device::AlignedVector<T, N> (&x)[kVecs]) {
  float partial[kVecs];
#pragma unroll
  for (int j = 0; j < kVecs; ++j) partial[j] = sum_squares(x[j]);
#pragma unroll
  for (int width = 1; width < kVecs; width *= 2) {
#pragma unroll
    for (int j = 0; j + width < kVecs; j += 2 * width) partial[j] += partial[j + width];
  }
  return partial[0];
}

/// round(x + r) element-wise: the fp32 sum rounded once to T (what the residual stream stores).
template <typename T, std::size_t N>
SGL_DEVICE device::AlignedVector<T, N> add_rounded(
    const device::AlignedVector<T, N>& x, const device::AlignedVector<T, N>& r) {
  return map_pairs(x, r, [](float2 a, float2 b) { return make_float2(a.x + b.x, a.y + b.y); });
}

/// Per-row factors of normalize(): rstd and weight_offset * rstd.
struct RowScale {
  float rstd;
  float offset_rstd;
};

/// The factors of a row with 1 / rms = rstd. weight_offset = 0 gives offset_rstd = 0 even when
/// rstd is inf (eps = 0 and every x^2 underflowing), as x * rstd * w would.
SGL_DEVICE RowScale row_scale(float rstd, float weight_offset) {
  return {rstd, weight_offset == 0.0f ? 0.0f : weight_offset * rstd};
}

/// round(x * rstd * (w + weight_offset)) element-wise, computed as x * fma(w, rstd, weight_offset *
/// rstd) (fp32, one rounding). With cast_x_first, x * rstd is rounded to T first and then
/// multiplied by (w + weight_offset): round(float(round(x * rstd)) * (w + weight_offset)).
/// packed_mul (fp16 / bf16 with weight_offset 0, the launcher's choice): the same values with a
/// third of the conversions. x * rstd is rounded a pair at a time (one packed conversion) and
/// multiplied by w as one packed fp16 / bf16 multiply, which rounds the exact product once: the
/// product of two fp16 (11-bit) or bf16 (8-bit) significands is exact in fp32, so round(float(r) *
/// float(w)) is that same correctly rounded product (bf16 products below 2^-126, in fp32's subnormal
/// range, aside). Why: the fp32 order converts every element twice (x * rstd to T, scalar, then the
/// result, packed: 1.5 conversions per element against rmsnorm's 0.5), and conversions issue at a
/// fraction of the FMA rate, which shows at decode sizes. With the packed multiply it converts 0.5
/// per element, as rmsnorm does.
template <typename T, std::size_t N>
SGL_DEVICE device::AlignedVector<T, N> normalize(
    const device::AlignedVector<T, N>& x,
    const device::AlignedVector<T, N>& w,
    RowScale scale,
    float weight_offset,
    bool cast_x_first,
    bool packed_mul) {
  if (!cast_x_first) {
    return map_pairs(x, w, [scale](float2 a, float2 b) {
      return make_float2(
          a.x * fmaf(b.x, scale.rstd, scale.offset_rstd), a.y * fmaf(b.y, scale.rstd, scale.offset_rstd));
    });
  }
  if constexpr ((std::is_same_v<T, bf16_t> || std::is_same_v<T, fp16_t>) && N >= 2) {
    if (packed_mul) {
      device::AlignedVector<T, N> out;
#pragma unroll
      for (std::size_t i = 0; i < N / 2; ++i) {
        const float2 a = pair_as_float2(x, i);
        const packed_t<T> rounded = device::cast<packed_t<T>>(make_float2(a.x * scale.rstd, a.y * scale.rstd));
        packed_t<T> weight;
        memcpy(&weight, &w[2 * i], sizeof(weight));
        const packed_t<T> product = __hmul2_rn(rounded, weight);
        memcpy(&out[2 * i], &product, sizeof(product));
      }
      return out;
    }
  }
  const auto round = [](float v) { return device::cast<fp32_t>(device::cast<T>(v)); };
  return map_pairs(x, w, [scale, weight_offset, round](float2 a, float2 b) {
    return make_float2(
        round(a.x * scale.rstd) * (b.x + weight_offset), round(a.y * scale.rstd) * (b.y + weight_offset));
  });
}

/// Global loads of rows (x, residual) and stores of results, with or without the L2 hint.
///
/// kL2Hint: rows are loaded evict_last and every store is evict_normal. Only for launches with
/// 16-byte vectors that write every row they read (in place: the fused add, qknorm, rmsnorm.cuh's
/// kernel with out = input) and read at least NormConfig::kL2HintMinBytes (use_l2_hint), so the
/// stores return every line the loads marked to the default priority and nothing marked evict_last
/// outlives the kernel. The weight is loaded without the hint (it is never written).
/// Why: the DRAM bytes are the same, the order is not: with default priorities the L2 replaces the
/// clean lines just read and the dirty lines just written alike; with the rows evict_last it
/// writes the dirty lines back first, and DRAM serves the stream at the rate of a copy. Not used
/// with a separate out (its input lines would stay evict_last after the kernel and push the next
/// kernel's data out of L2 first), nor below NormConfig::kL2HintMinBytes (latency-bound launches,
/// where the hinted accesses, compiler barriers, cost more than they save).
template <bool kL2Hint>
struct RowAccess {
  device::L2Policy load_policy;
  device::L2Policy store_policy;

  SGL_DEVICE static RowAccess make() {
    if constexpr (kL2Hint) {
      return {device::l2_evict_last_policy(), device::l2_evict_normal_policy()};
    } else {
      return {};
    }
  }

  template <typename V>
  SGL_DEVICE void load(V& v, const void* ptr, int64_t offset) const {
    if constexpr (kL2Hint) {
      v.load(ptr, offset, load_policy);
    } else {
      v.load(ptr, offset);
    }
  }

  template <typename V>
  SGL_DEVICE void store(const V& v, void* ptr, int64_t offset) const {
    if constexpr (kL2Hint) {
      v.store(ptr, offset, store_policy);
    } else {
      v.store(ptr, offset);
    }
  }
};

/// PDL (no-op without it): waits for the previous kernel in the stream to finish (its writes are
/// then visible), then lets the next kernel launch at once. Released this early, the next kernel's
/// prologue (parameter loads, index arithmetic, instruction fetch) overlaps all of this kernel
/// instead of its tail; it still waits for this grid to finish before its first load. Releasing
/// before the wait instead would let whole chains of queued kernels launch and occupy the SMs.
SGL_DEVICE void pdl_wait_then_release() {
  device::pdl_wait_primary();
  device::pdl_launch_dependents();
}

/// After the barrier of a row reduction: the total of the row's warp partials smem[first_partial ..
/// first_partial + warps_per_row - 1] (`row_partials` is smem + first_partial as float4, computed
/// before the barrier): by every thread from two broadcast LDS.128 for rows of 4 or 8 warps (a tree,
/// shorter than five more shuffles; wider rows keep the shuffles, as eight float4 would cost
/// registers), by a shuffle reduction in each warp otherwise. Every warp of the CTA gets the same bits.
SGL_DEVICE float sum_row_partials(const float4* row_partials, const float* smem, int first_partial, int warps_per_row) {
  if (warps_per_row == 4 || warps_per_row == 8) {
    const float4 a = row_partials[0];
    float total = (a.x + a.y) + (a.z + a.w);
    if (warps_per_row == 8) {
      const float4 b = row_partials[1];
      total += (b.x + b.y) + (b.z + b.w);
    }
    return total;
  }
  const int lane = static_cast<int>(threadIdx.x % device::kWarpThreads);
  return device::warp::reduce_sum<float>(lane < warps_per_row ? smem[first_partial + lane] : 0.0f);
}

/// Sum of `value` over the `tpr` threads of each row; every thread of the row gets the total.
/// tpr <= 32: rows are aligned groups of tpr lanes, reduced by shuffles (no barrier).
/// tpr > 32 (a multiple of 32): warp sums go to smem[warp]; one __syncthreads(); the row's warps
/// (slot * tpr / 32 ...) are summed again: by every thread from two broadcast LDS.128 for rows of
/// 4 or 8 warps, by a shuffle reduction in each warp otherwise. Every thread of the CTA must call it with
/// the same tpr. `smem` (kMaxWarps floats) must not be rewritten until every thread has passed the
/// next barrier: callers alternate two buffers.
/// Example: tpr = 8, lanes holding their lane id: lanes 0..7 get 28, lanes 8..15 get 92, ...
SGL_DEVICE float row_reduce_sum(float value, int tpr, int slot, float* smem) {
  const uint32_t lane = threadIdx.x % device::kWarpThreads;
  const uint32_t warp = threadIdx.x / device::kWarpThreads;
  const int warps_per_row = tpr / static_cast<int>(device::kWarpThreads);
  // Addresses first, so that their arithmetic is off the chain of shuffles and barrier below.
  float* const warp_partial = smem + warp;
  const int first_partial = slot * warps_per_row;
  const float4* const row_partials = reinterpret_cast<const float4*>(smem + first_partial);
  if (tpr < static_cast<int>(device::kWarpThreads)) {
    // Rows of lanes (qknorm heads, short rows): log2(tpr) shuffles, one uniform branch per level.
#pragma unroll
    for (int mask = device::kWarpThreads / 2; mask > 0; mask >>= 1) {
      if (mask < tpr) value += __shfl_xor_sync(0xffffffffu, value, mask);
    }
    return value;
  }
  // Rows of whole warps: the five shuffles as straight-line code, so that the compiler issues the
  // shared-window address (S2R SR_CgaCtaId) for the store with the loads; with a branch per level
  // it comes after the last shuffle, on the critical path.
  value = device::warp::reduce_sum<float>(value);
  if (tpr == static_cast<int>(device::kWarpThreads)) return value;
  if (lane == 0) *warp_partial = value;
  __syncthreads();
  return sum_row_partials(row_partials, smem, first_partial, warps_per_row);
}

/// The tensor a CTA serves (0, or 1 = k of qknorm) and its place among that tensor's CTAs.
struct CtaShare {
  int segment;
  int64_t first;   // first group of rows
  int64_t stride;  // CTAs serving the tensor
};

/// qknorm: params.rows0_ctas CTAs serve q, the other gridDim.x - rows0_ctas serve k. With
/// params.interleave_segments (set when the grid has more CTAs than SMs) the
/// two are interleaved in launch order in proportion (CTA b serves k when floor((b + 1) * K / grid)
/// > floor(b * K / grid), K the k CTAs), so that the CTAs running at any time read q and k of the
/// same tokens: the fused qkv rows are read as contiguous q + k spans instead of q spans first and
/// k's short strided spans last. Example: CTAs 0-3 q of tokens 0-3, CTA 4 k of tokens 0-3, CTAs 5-8
/// q of tokens 4-7, ... Otherwise (one wave, where the division is pure latency) q first, then k.
template <NormKind kKind>
SGL_DEVICE CtaShare cta_share(const NormParams& params) {
  const int64_t b = blockIdx.x;
  const int64_t grid = gridDim.x;
  if constexpr (kKind == NormKind::kQKNorm) {
    const int64_t k_ctas = grid - params.rows0_ctas;
    // Interleaved while grid * K < 2^32 (32-bit division; qknorm at 65536 tokens of 32 + 8 heads is
    // 81920 CTAs, K = 16384); beyond that, and without one of the tensors, q first, then k (a
    // 64-bit division here makes the kernel spill).
    if (params.interleave_segments && params.rows0_ctas > 0 && k_ctas > 0 &&
        static_cast<uint64_t>(grid) * static_cast<uint64_t>(k_ctas) < (uint64_t{1} << 32)) {
      const uint32_t g = static_cast<uint32_t>(grid), k = static_cast<uint32_t>(k_ctas), u = static_cast<uint32_t>(b);
      const uint32_t k_before = u * k / g;  // k CTAs among [0, b)
      if ((u + 1) * k / g > k_before) return {1, int64_t{k_before}, k_ctas};
      return {0, b - int64_t{k_before}, params.rows0_ctas};
    }
    if (b >= params.rows0_ctas) return {1, b - params.rows0_ctas, k_ctas};
    return {0, b, params.rows0_ctas};
  }
  return {0, b, grid};
}

/// Element pointers of one row; in-place kinds write where they read.
template <typename T>
struct RowPointers {
  const T* input;
  T* out;
  T* residual;
};

template <typename T, NormKind kKind>
SGL_DEVICE RowPointers<T> row_pointers(const NormRows& rows, int64_t row) {
  int64_t token = row;
  int64_t head = 0;
  if constexpr (kKind == NormKind::kQKNorm) {
    // A multiply and a shift when row < 2^31 (the common case); 64-bit division otherwise.
    if (row < (int64_t{1} << 31) && rows.head_magic != 0) {
      token = static_cast<int64_t>((static_cast<uint64_t>(row) * rows.head_magic) >> rows.head_shift);
    } else {
      token = row / rows.num_heads;
    }
    head = row - token * rows.num_heads;
  }
  RowPointers<T> ptrs;
  ptrs.input = static_cast<const T*>(rows.input) + token * rows.input_token_stride + head * rows.input_head_stride;
  if constexpr (kKind == NormKind::kRMSNorm) {
    ptrs.out = static_cast<T*>(rows.out) + token * rows.out_token_stride + head * rows.out_head_stride;
  } else {
    ptrs.out = const_cast<T*>(ptrs.input);
  }
  ptrs.residual = kKind == NormKind::kFusedAddRMSNorm
                      ? static_cast<T*>(rows.residual) + token * rows.residual_token_stride
                      : nullptr;
  return ptrs;
}

/// Rows longer than the registers hold, one per CTA (tpr = blockDim.x): pass 1 sums squares chunk
/// by chunk (the fused add stores round(x + r) to the residual on the way), pass 2 re-reads the row
/// (an L2 hit; the fused add re-reads its own residual stores, same thread and address) and
/// writes the output.
template <typename T, int kVecN, NormKind kKind, bool kL2Hint>
SGL_DEVICE void norm_rows_two_pass(const NormParams& params, float (*partials)[NormConfig::kMaxWarps]) {
  using vec_t = device::AlignedVector<T, kVecN>;
  constexpr int kMaxVecs = NormConfig::max_vecs(sizeof(vec_t));
  const CtaShare share = cta_share<kKind>(params);
  const NormRows& rows = params.rows[share.segment];
  const int tpr = rows.threads_per_row;
  const int lane = static_cast<int>(threadIdx.x);
  const int chunk = tpr * kMaxVecs;
  const RowAccess<kL2Hint> access = RowAccess<kL2Hint>::make();
  int parity = 0;

  for (int64_t row = share.first; row < rows.num_rows; row += share.stride) {
    const RowPointers<T> ptrs = row_pointers<T, kKind>(rows, row);
    float sum = 0.0f;
    for (int base = lane; base < rows.num_vecs; base += chunk) {
      vec_t x[kMaxVecs];
#pragma unroll
      for (int j = 0; j < kMaxVecs; ++j) {
        if (base + j * tpr < rows.num_vecs) access.load(x[j], ptrs.input, base + j * tpr);
      }
      if constexpr (kKind == NormKind::kFusedAddRMSNorm) {
#pragma unroll
        for (int j = 0; j < kMaxVecs; ++j) {
          if (base + j * tpr < rows.num_vecs) {
            vec_t r;
            access.load(r, ptrs.residual, base + j * tpr);
            x[j] = add_rounded(x[j], r);
            access.store(x[j], ptrs.residual, base + j * tpr);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < kMaxVecs; ++j) {
        if (base + j * tpr < rows.num_vecs) sum += sum_squares(x[j]);
      }
    }
    const float total = row_reduce_sum(sum, tpr, 0, partials[parity]);
    parity ^= 1;
    const float rstd = rsqrtf(total * rows.inv_hidden_size + params.eps);
    const RowScale scale = row_scale(rstd, params.weight_offset);

    const T* source = kKind == NormKind::kFusedAddRMSNorm ? ptrs.residual : ptrs.input;
    for (int base = lane; base < rows.num_vecs; base += chunk) {
      vec_t x[kMaxVecs], w[kMaxVecs];
#pragma unroll
      for (int j = 0; j < kMaxVecs; ++j) {
        if (base + j * tpr < rows.num_vecs) {
          x[j].load(source, base + j * tpr);
          w[j].load(rows.weight, base + j * tpr);
        }
      }
#pragma unroll
      for (int j = 0; j < kMaxVecs; ++j) {
        if (base + j * tpr < rows.num_vecs) {
          access.store(
              normalize(x[j], w[j], scale, params.weight_offset, /*cast_x_first=*/false, /*packed_mul=*/false),
              ptrs.out,
              base + j * tpr);
        }
      }
    }
  }
}

/// One group of the register path: thread (slot, lane) loads vectors lane + j * tpr (j < kVecs) of
/// row group * rows_per_cta + slot (and of its residual row) with every load in flight before the
/// first use, keeps them in registers through the reduction, then scales and stores them.
/// kLoadWeight: the weight vectors are loaded here, after x, so both loads are in flight together
/// (every group, except the fused add with four or more vectors per thread); otherwise `weight`
/// holds them (loaded once per CTA).
template <typename T, int kVecN, NormKind kKind, int kVecs, bool kLoadWeight, bool kL2Hint>
SGL_DEVICE void norm_group_in_registers(
    const NormParams& params,
    const NormRows& rows,
    int64_t group,
    int slot,
    int lane,
    const device::AlignedVector<T, kVecN>* weight,
    float* smem) {
  using vec_t = device::AlignedVector<T, kVecN>;
  const int tpr = rows.threads_per_row;
  const int64_t row = group * rows.rows_per_cta + slot;
  const bool active = row < rows.num_rows;
  RowPointers<T> ptrs{};
  if (active) ptrs = row_pointers<T, kKind>(rows, row);
  bool valid[kVecs];  // this thread's vector j exists in this row
#pragma unroll
  for (int j = 0; j < kVecs; ++j) valid[j] = active && lane + j * tpr < rows.num_vecs;

  // Up to two vectors per thread (decode rows among them), vectors past the row stay zero, so the
  // arithmetic below runs unpredicated: straight-line code whose chains the compiler interleaves;
  // only the loads and stores test valid[j]. More vectors keep the arithmetic under valid[j]: the
  // zeros would hold registers that those builds do not have (they spilled under their caps).
  constexpr bool kStraight = kVecs <= 2;
  vec_t x[kVecs];
  if constexpr (kStraight) {
#pragma unroll
    for (int j = 0; j < kVecs; ++j) x[j].fill(device::cast<T>(0.0f));
  }
  // Waits for the previous kernel (PDL) and releases the next one only here, after the index and
  // pointer arithmetic (kernel parameters only), right before the group's first global load.
  const RowAccess<kL2Hint> access = RowAccess<kL2Hint>::make();
  if constexpr (kLoadWeight) pdl_wait_then_release();
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (valid[j]) access.load(x[j], ptrs.input, lane + j * tpr);
  }
  vec_t loaded_weight[kLoadWeight ? kVecs : 1];
  if constexpr (kLoadWeight) {
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (valid[j]) loaded_weight[j].load(rows.weight, lane + j * tpr);
    }
    weight = loaded_weight;
  }
  if constexpr (kKind == NormKind::kFusedAddRMSNorm) {
    vec_t r[kVecs];
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if constexpr (kStraight) r[j].fill(device::cast<T>(0.0f));
      if (valid[j]) access.load(r[j], ptrs.residual, lane + j * tpr);
    }
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (kStraight || valid[j]) x[j] = add_rounded(x[j], r[j]);
      if (valid[j]) access.store(x[j], ptrs.residual, lane + j * tpr);
    }
  }
  float sum = 0.0f;
  if constexpr (kStraight) {
    sum = sum_squares_all(x);
  } else {
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (valid[j]) sum += sum_squares(x[j]);
    }
  }

  const float total = row_reduce_sum(sum, tpr, slot, smem);
  const float rstd = rsqrtf(total * rows.inv_hidden_size + params.eps);
  const RowScale scale = row_scale(rstd, params.weight_offset);

#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (valid[j]) {
      access.store(
          normalize(x[j], weight[j], scale, params.weight_offset, /*cast_x_first=*/false, /*packed_mul=*/false),
          ptrs.out,
          lane + j * tpr);
    }
  }
}

/// Register path: rows that fit kVecs vectors per thread. Thread t handles row slot t / tpr of
/// each group and the vectors (t % tpr) + j * tpr, j < kVecs, of that row, and loads x and the
/// weight of each group together (the fused add with four or more vectors per thread loads the
/// weight of its columns once and keeps it in registers across groups).
template <typename T, int kVecN, NormKind kKind, int kVecs, bool kL2Hint>
SGL_DEVICE void norm_rows_in_registers(const NormParams& params, float (*partials)[NormConfig::kMaxWarps]) {
  using vec_t = device::AlignedVector<T, kVecN>;
  const CtaShare share = cta_share<kKind>(params);
  const NormRows& rows = params.rows[share.segment];
  const int tpr = rows.threads_per_row;
  const int tid = static_cast<int>(threadIdx.x);
  const int slot = rows.rows_per_cta == 1 ? 0 : (rows.tpr_shift >= 0 ? tid >> rows.tpr_shift : tid / tpr);
  const int lane = tid - slot * tpr;

  // The launchers give every group its own CTA (launch_norm_kernel), so a CTA normally has one
  // group and loads x and the weight together. More groups than CTAs (the grid capped at
  // kMaxGridCtas) repeat that per group, the weight reloaded from L1 / L2 each time: keeping it in
  // registers across groups cost registers, hence occupancy, in every launch. The fused add with
  // four or more vectors per thread would spill holding x, the residual and the weight at once
  // and keeps the weight in registers, loaded before the first group.
  constexpr bool kOneGroupPath = kKind != NormKind::kFusedAddRMSNorm || kVecs <= 2;
  if constexpr (kOneGroupPath) {
    // One group: straight-line code, kept apart from the loop below (which costs decode rows
    // their latency).
    if (share.first + share.stride >= rows.num_groups) {
      if (share.first < rows.num_groups) {
        norm_group_in_registers<T, kVecN, kKind, kVecs, true, kL2Hint>(
            params, rows, share.first, slot, lane, nullptr, partials[0]);
      }
      return;
    }
    int parity = 0;
    for (int64_t group = share.first; group < rows.num_groups; group += share.stride) {
      norm_group_in_registers<T, kVecN, kKind, kVecs, true, kL2Hint>(
          params, rows, group, slot, lane, nullptr, partials[parity]);
      parity ^= 1;
    }
  } else {
    pdl_wait_then_release();  // before the first global load (see norm_rows_kernel)
    vec_t weight[kVecs];
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (lane + j * tpr < rows.num_vecs) weight[j].load(rows.weight, lane + j * tpr);
    }
    int parity = 0;
    for (int64_t group = share.first; group < rows.num_groups; group += share.stride) {
      norm_group_in_registers<T, kVecN, kKind, kVecs, false, kL2Hint>(
          params, rows, group, slot, lane, weight, partials[parity]);
      parity ^= 1;
    }
  }
}

/// Bytes of x one thread of norm_rows_kernel<T, kVecN, kKind, kVecs> holds (the two-pass path,
/// kVecs = 0, moves chunks of max_vecs vectors).
template <typename T, int kVecN, int kVecs>
inline constexpr int kNormThreadBytes =
    (kVecs > 0 ? kVecs : NormConfig::max_vecs(kVecN * sizeof(T))) * kVecN * static_cast<int>(sizeof(T));

/// Normalises every row of params.rows[0] (and params.rows[1] for kQKNorm). Block: rows_per_cta *
/// threads_per_row threads (a multiple of 32, at most NormConfig::max_threads(kKind, thread
/// bytes)); grid: any size (kQKNorm: at least 2 when both tensors have rows), CTAs stride over
/// their tensor's groups of rows_per_cta rows. kVecs > 0: the register path with kVecs vectors
/// per thread; kVecs = 0: rows too long for registers, one per CTA, two passes. kWide: the build
/// for CTAs of more than NormConfig::kBlockThreads threads (register budget, NormConfig).
/// kL2Hint: rows accessed with the L2 hint (RowAccess; the launcher decides, use_l2_hint). A
/// separate build rather than a runtime branch: both paths in one kernel spill three builds whose
/// paths alone do not (the compiler hoists their common arithmetic above the branch).
template <typename T, int kVecN, NormKind kKind, int kVecs, bool kWide, bool kL2Hint>
__global__ void __launch_bounds__(
    NormConfig::bound_threads(kKind, kNormThreadBytes<T, kVecN, kVecs>, kVecs == 0, kWide, kVecs),
    NormConfig::bound_blocks(kKind, kNormThreadBytes<T, kVecN, kVecs>, kVecs == 0, kWide, kVecs))
    norm_rows_kernel(const NormParams params) {
  __shared__ alignas(16) float partials[2][NormConfig::kMaxWarps];  // two buffers: one barrier per group

  // Every global load may read what the previous kernel writes (PDL): each path calls
  // pdl_wait_then_release() before its first one; index arithmetic on the parameters runs before it.
  if constexpr (kVecs == 0) {
    pdl_wait_then_release();
    norm_rows_two_pass<T, kVecN, kKind, kL2Hint>(params, partials);
  } else {
    norm_rows_in_registers<T, kVecN, kKind, kVecs, kL2Hint>(params, partials);
  }
}

// ---------------------------------------------------------------------------------------------
// Host side: configuration shared by the launchers
// ---------------------------------------------------------------------------------------------

/// Widest access (bytes, a power of two in [sizeof(T), 16]) that divides every value: the data
/// pointers' addresses and the byte strides / row length the vector index is scaled by.
template <typename T>
int64_t widest_vector_bytes(std::initializer_list<uint64_t> values) {
  uint64_t bits = 0;
  for (const uint64_t v : values) bits |= v;
  int64_t bytes = 16;
  while (bytes > static_cast<int64_t>(sizeof(T)) && bits % static_cast<uint64_t>(bytes) != 0) bytes /= 2;
  return bytes;
}

inline uint64_t address_of(const void* ptr) { return reinterpret_cast<uint64_t>(ptr); }

/// Geometry of one launch: threads per row, vectors per thread (0: two passes), rows per CTA.
struct NormGeometry {
  int32_t threads_per_row;
  int32_t vecs_per_thread;  // 1, 2, 4 or 8 (a compiled bucket), or 0 for two passes
  int32_t rows_per_cta;
  uint32_t block_threads;
};

/// Whether a launch takes the L2 hint of RowAccess: it writes every row it reads in place and its
/// input rows hold at least NormConfig::kL2HintMinBytes (`input_bytes`; smaller launches are
/// latency-bound). The launch then takes a hinted build if its vectors are 16 bytes wide
/// (launch_norm_bucket); narrower ones run the plain builds.
inline bool use_l2_hint(bool in_place, int64_t input_bytes) {
  return in_place && input_bytes >= NormConfig::kL2HintMinBytes;
}

/// Rounds a thread count up to a valid TPR: a power of two up to 32, a multiple of 32 above.
inline int64_t round_threads_per_row(int64_t tpr) {
  constexpr int64_t kWarp = device::kWarpThreads;
  return tpr <= kWarp ? static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(std::max<int64_t>(tpr, 1))))
                      : host::div_ceil(tpr, kWarp) * kWarp;
}

/// Fills rows.head_magic / head_shift so that (row * magic) >> shift == row / num_heads for every
/// row < 2^31: shift = 31 + ceil(log2(num_heads)), magic = ceil(2^shift / num_heads) (< 2^32; the
/// rounding error times row stays below 2^shift). num_heads >= 2^31: the kernel divides instead.
inline void set_head_divisor(NormRows& rows) {
  const uint64_t d = static_cast<uint64_t>(std::max<int64_t>(rows.num_heads, 1));
  if (d >= (uint64_t{1} << 31)) {
    rows.head_magic = 0;
    rows.head_shift = 0;
    return;
  }
  const uint32_t shift = 31 + static_cast<uint32_t>(std::bit_width(d - 1));
  rows.head_magic = static_cast<uint32_t>(((uint64_t{1} << shift) + d - 1) / d);
  rows.head_shift = shift;
}

inline NormGeometry make_geometry(int64_t tpr, int64_t k) {
  const int64_t rows = std::max<int64_t>(1, NormConfig::kBlockThreads / tpr);
  return {
      static_cast<int32_t>(tpr),
      static_cast<int32_t>(k),
      static_cast<int32_t>(rows),
      static_cast<uint32_t>(rows * tpr)};
}

/// Picks the geometry of a row of num_vecs vectors of vec_bytes bytes (num_rows rows in all, on a
/// device of sm_count SMs). Automatic: the fewest vectors per thread k >= NormConfig::kTargetVecs
/// (or the whole row if shorter) whose TPR = round_threads_per_row(num_vecs / k) is at most
/// kPreferredRowThreads (kPreferredFusedRowThreads for the fused add at <= 32 bytes per thread), else the fewest whose TPR
/// fits the kind's CTA; the vectors per thread are then trimmed to what that TPR needs (a power
/// of two). Short rows sharing a CTA whose groups would not give every SM a CTA take one vector
/// per thread instead (decode). Rows no k fits take two passes with the largest CTA. (bf16,
/// 16-byte vectors: H=128 -> 8 threads x 2, 32 rows per 256-thread CTA; H=4096 -> 256 x 2;
/// H=8192 -> 256 x 4 (fused add 512 x 2); H=16384 -> 1024 x 2; H=32768 -> two passes, 512
/// threads. qknorm, head_dim 128 -> 8 x 2, 32 heads per 256-thread CTA; 16 x 1 at one token.)
inline NormGeometry choose_geometry(
    NormKind kind, int64_t num_vecs, int vec_bytes, int64_t num_rows, int64_t sm_count) {
  using host::div_ceil;
  const int max_vecs = NormConfig::max_vecs(vec_bytes);
  const int64_t first_k =
      std::min<int64_t>(NormConfig::kTargetVecs, static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(num_vecs))));
  // Two rounds: first the fewest vectors per thread that keep a row within kPreferredRowThreads
  // threads, then (rows that need more) the fewest that fit the kind's largest CTA.
  for (const bool preferred : {true, false}) {
    for (int64_t k = first_k; k <= max_vecs; k *= 2) {
      const int64_t tpr = round_threads_per_row(div_ceil(num_vecs, k));
      const int64_t limit = NormConfig::max_threads(kind, static_cast<int>(k) * vec_bytes, false, static_cast<int>(k));
      // The fused add prefers rows of up to 512 threads while a thread holds at most 32 bytes.
      const int64_t preferred_threads = kind == NormKind::kFusedAddRMSNorm && k * vec_bytes <= 32
                                            ? NormConfig::kPreferredFusedRowThreads
                                            : NormConfig::kPreferredRowThreads;
      if (tpr <= (preferred ? std::min(limit, preferred_threads) : limit)) {
        const NormGeometry geometry =
            make_geometry(tpr, static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(div_ceil(num_vecs, tpr)))));
        // Short rows sharing a CTA, too few to give every SM a CTA (decode): one vector per thread
        // and half the rows per CTA, i.e. twice the CTAs and half the work per thread (qknorm at
        // one token, head_dim 128: 16 x 1 rather than 8 x 2).
        if (geometry.rows_per_cta > 1 && geometry.vecs_per_thread > 1 &&
            div_ceil(num_rows, int64_t{geometry.rows_per_cta}) < sm_count) {
          const int64_t tpr1 = round_threads_per_row(num_vecs);
          if (tpr1 <= std::min(NormConfig::max_threads(kind, vec_bytes, false, 1), NormConfig::kBlockThreads)) {
            return make_geometry(tpr1, 1);
          }
        }
        return geometry;
      }
    }
  }
  const uint32_t threads = NormConfig::max_threads(kind, max_vecs * vec_bytes, /*two_pass=*/true);
  return {static_cast<int32_t>(threads), 0, 1, threads};
}

/// enable_pdl: 1 on, 0 off, negative "auto" = on for compute capability >= 9 (Hopper and later).
inline bool resolve_pdl(int64_t enable_pdl, const DLDevice& device) {
  if (enable_pdl >= 0) return enable_pdl != 0;
  return host::runtime::get_cc_major(device.device_id) >= 9;
}

/// Launches norm_rows_kernel<T, kVecN, kKind, kVecs, kWide, kL2Hint> with one CTA per group of
/// rows (at most NormConfig::kMaxGridCtas; beyond that CTAs take several groups). Not a persistent
/// grid capped at the resident CTAs: the hardware schedules a new CTA as soon as one retires, so
/// the next group's loads overlap the previous one's reduction and stores, which measured faster
/// for every kind (docs/perf_notes.md). qknorm gives q and k shares of the grid in proportion to
/// their groups, at least one each, interleaved in launch order when the grid has more CTAs than SMs
/// (cta_share).
template <typename T, int kVecN, NormKind kKind, int kVecs, bool kWide, bool kL2Hint>
void launch_norm_kernel(NormParams params, const NormGeometry& geometry, DLDevice device, bool pdl) {
  constexpr auto kKernel = norm_rows_kernel<T, kVecN, kKind, kVecs, kWide, kL2Hint>;
  const int64_t groups0 = params.rows[0].num_groups;
  const int64_t groups1 = kKind == NormKind::kQKNorm ? params.rows[1].num_groups : 0;
  const int64_t groups = groups0 + groups1;
  int64_t grid = std::min(groups, NormConfig::kMaxGridCtas);
  params.interleave_segments =
      kKind == NormKind::kQKNorm && grid > int64_t{host::runtime::get_sm_count(device.device_id)};
  if (groups0 == 0) {
    params.rows0_ctas = 0;
  } else if (groups1 == 0) {
    params.rows0_ctas = grid;
  } else {
    grid = std::max<int64_t>(grid, 2);
    params.rows0_ctas = std::clamp<int64_t>((grid * groups0 + groups / 2) / groups, 1, grid - 1);
  }
  host::LaunchKernel(static_cast<uint32_t>(grid), geometry.block_threads, device).enable_pdl(pdl)(kKernel, params);
}

/// Launches the narrow or wide build of the kVecs bucket (two-pass: kVecs = 0, one build), with or
/// without the L2 hint. One vector per thread has no wide build: choose_geometry gives it only to
/// rows of one vector and to decode rows within kBlockThreads threads.
template <typename T, int kVecN, NormKind kKind, int kVecs, bool kL2Hint>
void launch_norm_bucket_hint(const NormParams& params, const NormGeometry& geometry, DLDevice device, bool pdl) {
  constexpr int kBytes = kNormThreadBytes<T, kVecN, kVecs>;
  if constexpr (kVecs > 1 && NormConfig::max_threads(kKind, kBytes, false, kVecs) > NormConfig::kBlockThreads) {
    if (geometry.block_threads > NormConfig::kBlockThreads) {
      return launch_norm_kernel<T, kVecN, kKind, kVecs, true, kL2Hint>(params, geometry, device, pdl);
    }
  }
  host::RuntimeCheck(
      geometry.block_threads <= NormConfig::bound_threads(kKind, kBytes, kVecs == 0, false, kVecs),
      "norm: no build for CTAs of ",
      geometry.block_threads,
      " threads");
  launch_norm_kernel<T, kVecN, kKind, kVecs, false, kL2Hint>(params, geometry, device, pdl);
}

template <typename T, int kVecN, NormKind kKind, int kVecs>
void launch_norm_bucket(
    const NormParams& params, const NormGeometry& geometry, DLDevice device, bool pdl, bool l2_hint) {
  // Hinted builds exist for 16-byte vectors only (rows 16-byte aligned, as large tensors are):
  // for every width they would double the compile time.
  if constexpr (kVecN * sizeof(T) == 16) {
    if (l2_hint) return launch_norm_bucket_hint<T, kVecN, kKind, kVecs, true>(params, geometry, device, pdl);
  }
  launch_norm_bucket_hint<T, kVecN, kKind, kVecs, false>(params, geometry, device, pdl);
}

/// Fills the launch fields of `rows` (its hidden_size and num_rows set) for a launch of `geometry`,
/// chosen for rows of `geometry_vecs` vectors of kVecN elements. Rows that long take the geometry as
/// it is; shorter ones (one of the two tensors of fused_inplace_qknorm_across_heads) the fewest
/// threads per row that cover them at the geometry's vectors per thread and divide its threads per
/// row, hence the CTA (so every thread has a row slot): k of 1024 elements next to q of 4096 (bf16,
/// 256 x 2) takes 64 x 2, four rows per CTA. Two-pass launches keep one row per CTA.
template <int kVecN>
void set_row_geometry(NormRows& rows, const NormGeometry& geometry, int64_t geometry_vecs) {
  const int64_t num_vecs = rows.hidden_size / kVecN;
  int64_t tpr = geometry.threads_per_row;
  if (num_vecs < geometry_vecs && geometry.vecs_per_thread > 0) {
    tpr = round_threads_per_row(host::div_ceil(num_vecs, int64_t{geometry.vecs_per_thread}));
    while (geometry.threads_per_row % tpr != 0) tpr = round_threads_per_row(tpr + 1);
  }
  rows.num_vecs = static_cast<int32_t>(num_vecs);
  rows.threads_per_row = static_cast<int32_t>(tpr);
  rows.rows_per_cta = static_cast<int32_t>(geometry.block_threads / tpr);
  rows.tpr_shift = std::has_single_bit(static_cast<uint64_t>(tpr)) ? std::countr_zero(static_cast<uint64_t>(tpr)) : -1;
  rows.inv_hidden_size = rows.hidden_size > 0 ? static_cast<float>(1.0 / static_cast<double>(rows.hidden_size)) : 0.0f;
  rows.num_groups = host::div_ceil(rows.num_rows, int64_t{rows.rows_per_cta});
  set_head_divisor(rows);
}

/// Chooses the geometry for kVecN-wide vectors (for the longer rows of the two tensors), fills it
/// into each tensor's rows and launches the kernel of its vectors-per-thread bucket, the L2-hint
/// build when use_l2_hint says so. in_place: every row read is written where it was read.
template <typename T, int kVecN, NormKind kKind>
void launch_norm_rows(NormParams params, DLDevice device, bool pdl, bool in_place) {
  constexpr int kMaxVecs = NormConfig::max_vecs(kVecN * sizeof(T));
  const int64_t num_vecs = std::max(
                               params.rows[0].num_rows > 0 ? params.rows[0].hidden_size : 0,
                               params.rows[1].num_rows > 0 ? params.rows[1].hidden_size : 0) /
                           kVecN;
  const NormGeometry geometry = choose_geometry(
      kKind,
      num_vecs,
      kVecN * sizeof(T),
      params.rows[0].num_rows + params.rows[1].num_rows,
      host::runtime::get_sm_count(device.device_id));
  int64_t input_elements = 0;
  for (NormRows& rows : params.rows) {
    set_row_geometry<kVecN>(rows, geometry, num_vecs);
    input_elements += rows.num_rows * rows.hidden_size;
  }
  const bool l2_hint = use_l2_hint(in_place, input_elements * static_cast<int64_t>(sizeof(T)));
  switch (geometry.vecs_per_thread) {
    case 0:
      return launch_norm_bucket<T, kVecN, kKind, 0>(params, geometry, device, pdl, l2_hint);
    case 1:
      return launch_norm_bucket<T, kVecN, kKind, 1>(params, geometry, device, pdl, l2_hint);
    case 2:
      return launch_norm_bucket<T, kVecN, kKind, 2>(params, geometry, device, pdl, l2_hint);
    case 4:
      if constexpr (kMaxVecs >= 4) {
        return launch_norm_bucket<T, kVecN, kKind, 4>(params, geometry, device, pdl, l2_hint);
      }
      [[fallthrough]];
    default:
      if constexpr (kMaxVecs >= 8) {
        return launch_norm_bucket<T, kVecN, kKind, 8>(params, geometry, device, pdl, l2_hint);
      }
      host::Panic("norm: unexpected vectors per thread ", geometry.vecs_per_thread);
  }
}

/// The vector widths a module builds. Each norm op has two modules per dtype: kWide, the 16-byte
/// vectors of aligned rows (every model's hidden size, tensors from the allocator), loaded on the
/// first call; kNarrow, the 8 / 4 / 2-byte vectors (and single elements) of rows that do not allow
/// 16 bytes, loaded on the first such call. Together they are one dispatch; apart, the common first
/// call compiles a third of the kernels.
enum class NormWidths { kWide, kNarrow };

/// Launches with the widest vector `vec_bytes` allows (16 / 8 / 4 / 2 bytes; it must divide both
/// tensors' hidden_size bytes) among kWidths'; in_place as in launch_norm_rows. Returns false,
/// without launching, for rows narrower than 16 bytes in a kWide build (the kNarrow module's); a
/// kNarrow build takes 16-byte rows with 8-byte vectors.
template <typename T, NormKind kKind, NormWidths kWidths>
bool launch_norm_rows_any_width(const NormParams& params, int64_t vec_bytes, DLDevice device, bool pdl, bool in_place) {
  if constexpr (kWidths == NormWidths::kWide) {
    if (vec_bytes < 16) return false;
    launch_norm_rows<T, 16 / sizeof(T), kKind>(params, device, pdl, in_place);
  } else if (vec_bytes >= 8) {
    launch_norm_rows<T, 8 / sizeof(T), kKind>(params, device, pdl, in_place);
  } else if constexpr (sizeof(T) <= 2) {
    if (vec_bytes == 4) {
      launch_norm_rows<T, 4 / sizeof(T), kKind>(params, device, pdl, in_place);
    } else {
      launch_norm_rows<T, 1, kKind>(params, device, pdl, in_place);
    }
  } else {
    launch_norm_rows<T, 1, kKind>(params, device, pdl, in_place);
  }
  return true;
}

/// Common scalar checks of the launchers.
inline void check_norm_scalars(const char* op, int64_t hidden_size, double eps) {
  host::RuntimeCheck(hidden_size < (int64_t{1} << 30), op, ": hidden_size must be < 2^30, got ", hidden_size);
  host::RuntimeCheck(eps >= 0.0, op, ": eps must be >= 0, got ", eps);
}

/// Last-dim contiguity of a [rows..., hidden_size] view (stride 1; any stride when hidden_size is 1).
inline void check_last_dim_contiguous(const char* op, const char* name, const tvm::ffi::TensorView& view) {
  const int64_t last = view.ndim() - 1;
  host::RuntimeCheck(
      view.size(last) <= 1 || view.stride(last) == 1,
      op,
      ": ",
      name,
      " must be contiguous in its last dimension, got stride ",
      view.stride(last));
}

}  // namespace
