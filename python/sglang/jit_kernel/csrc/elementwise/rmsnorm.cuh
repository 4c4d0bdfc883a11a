// RMSNorm over the last dimension, and the row-normalisation kernel shared by every norm op.
//
//   out[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * (w + weight_offset)
//
// fp32 arithmetic, one rounding to the dtype (weight_offset = 1 gives Gemma's (1 + w)). With
// cast_x_before_out_mul the normalised x is rounded to the dtype first and then multiplied by the
// weight (Hugging Face's order): out = round(float(round(x * rstd)) * (w + weight_offset)).
//
// One kernel, norm_rows_kernel<T, kVecN, kKind, kVecs, kWide, kL2Hint>, serves three ops (kKind):
//   kRMSNorm          rows of `input` -> rows of `out`                         (this file)
//   kFusedAddRMSNorm  residual <- round(input + residual); input <- rmsnorm(residual)  (fused_add_rmsnorm.cuh)
//   kQKNorm           every head of q and of k normalised in place, two weights        (qknorm.cuh);
//                     also every whole row of q and of k, two hidden sizes  (qknorm_across_heads.cuh),
//                     there with one token's q and k rows per CTA (kWide builds, norm_rows_split)
//
// Layout of the work. A "row" is one normalised vector of hidden_size elements: a token of
// rmsnorm, a (token, head) pair of qknorm. threads_per_row (TPR) threads share a row; each holds
// up to kMaxVecs vectors of kVecN elements (16 bytes when the pointers and strides allow it), so
// x is read once from DRAM and kept in registers between the reduction and the scaling:
//   TPR <= 32   several rows per warp, the sum of squares reduced by shuffles inside TPR lanes;
//   TPR  > 32   one or more rows per CTA, warp partials combined through shared memory.
// Rows too long for registers (more than TPR * kMaxVecs vectors) take two passes: sum of squares,
// then a re-read (an L2 hit) to scale and store. The kernel is written persistent: CTAs stride over
// groups of rows_per_cta rows of one tensor (qknorm splits the CTAs between q and k in proportion
// to their rows). The launchers size the grid at one CTA per group (launch_norm_kernel), which
// measured fastest for every kind: a CTA then loads its rows and the weight together, and the
// hardware starts the next CTA as soon as one retires. (The fused add with four or more vectors
// per thread keeps the weight in registers across groups.) Register budgets are pinned by
// __launch_bounds__ (NormConfig::narrow_min_blocks): occupancy is what these kernels live on.
// With PDL the kernel runs its index arithmetic (kernel parameters only) before
// griddepcontrol.wait, issues its first global load right after it and releases the next kernel
// (launch_dependents) at the same point, so the next kernel's prologue overlaps this one: at
// decode sizes that took rmsnorm [1, 4096] from 1.41 to 1.13-1.18 us per call on an H200, and
// straight-line sums and shuffles after the loads (norm_group_in_registers, row_reduce_sum) to
// 0.99-1.03, the time of a probe kernel that moves the same bytes and does nothing else.
//
// Large in-place launches (the fused add, qknorm, rmsnorm with out = input) load their rows
// evict_last and store evict_normal (RowAccess): the L2 then writes dirty lines back first and
// DRAM keeps the rate of a copy (fused add [16384, 4096] on an H200: 95.1 -> 101.0 % of a torch
// copy). These are separate builds (kL2Hint); small and out-of-place launches use the plain ones.
//
// Memory traffic (the bytes-moved counts of the benchmarks): rmsnorm 2*N*H*sizeof(T) + H*sizeof(T);
// fused add 4*N*H*sizeof(T) + H*sizeof(T); qknorm 2*N*(Hq+Hk)*D*sizeof(T) + 2*D*sizeof(T).
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, SymbolicSize, SymbolicDevice, kAnySize, data_ptr
#include <sgl_kernel/utils.h>   // For RuntimeCheck, div_ceil

#include <sgl_kernel/runtime.cuh>  // For runtime::get_blocks_per_sm, get_sm_count, get_cc_major
#include <sgl_kernel/type.cuh>     // For device::cast
#include <sgl_kernel/utils.cuh>    // For LaunchKernel, SGL_DEVICE, kWarpThreads, pdl_wait_primary
#include <sgl_kernel/vec.cuh>      // For AlignedVector
#include <sgl_kernel/warp.cuh>     // For warp::reduce_sum

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <dlpack/dlpack.h>
#include <initializer_list>
#include <limits>
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
  NormRows rows[2];            // kQKNorm: {q, k}; otherwise rows[0] only
  int64_t rows0_ctas;          // kQKNorm: CTAs [0, rows0_ctas) serve q, the rest k
  float eps;                   // added to the mean square
  float weight_offset;         // 0 (RMSNorm) or 1 (Gemma: w + 1)
  bool cast_x_before_out_mul;  // round x * rstd to T before the weight multiply
  bool packed_weight_mul;      // with it (fp16 / bf16, weight_offset 0): that multiply as one packed
                               //   fp16 / bf16 multiply per pair (normalize; set by the launcher)
  bool interleave_segments;    // kQKNorm: q and k CTAs interleaved in launch order (cta_share)
  int32_t split_threads;       // kQKNorm, the one-token-per-CTA layout (kWide builds): threads
                               //   [0, split_threads) normalise row b of rows[0], the others row b
                               //   of rows[1] (norm_rows_split); 0 otherwise
};

/// Launch facts of norm_rows_kernel.
struct NormConfig {
  static constexpr int kTargetVecs = 2;                      // vectors per thread the heuristic aims for
  static constexpr int64_t kPreferredRowThreads = 256;       // rows wider than this take more vectors
                                                             // per thread first (H200: H=8192 as 256 x 4
                                                             // beat 512 x 2 by 12%; H=4096 256 x 2 best)
  static constexpr int64_t kPreferredFusedRowThreads = 512;  // the fused add, one CTA per group:
                                                             // H=8192 as 512 x 2 262.5 us vs 266.4
                                                             // for 256 x 4 (80 registers, spills)
  static constexpr uint32_t kBlockThreads = 256;             // CTA size when several rows share a CTA
  static constexpr uint32_t kMaxWarps = 32;                  // shared-memory partials per buffer
  static constexpr uint32_t kSplitMaxThreads = 512;          // kQKNorm one-token-per-CTA layout (kWide builds)
  static constexpr int kMaxThreadBytes = 64;                 // x held per thread at most (registers)
  // In-place launches whose input rows (num_rows x hidden_size elements; the fused add reads as
  // many again from the residual) hold at least this many bytes take the L2 hint (RowAccess).
  static constexpr int64_t kL2HintMinBytes = int64_t{1} << 20;

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
  /// compiler's choice: these kernels live on bytes in flight per SM. Measured (H200, bf16,
  /// 256-thread CTAs, one CTA per group): rmsnorm H=4096 as 256 x 2 took 65.2 us at 40 registers
  /// (6 CTAs per SM) vs 69.4 at 48 (5) and 69.8 at 32 (8, spilling); H=8192 as 256 x 4 129.4 us at
  /// 64 (4) vs 132.0 at 80 (3); one register across an edge costs 8-15 % (session 3: 48 vs 50
  /// registers at H=4096, 70.7 vs 76.3 us). The caps are the tightest without spills for every
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

  /// __launch_bounds__ of a kernel build: (threads, minimum resident CTAs). The kQKNorm kWide
  /// builds (one token per CTA, up to kSplitMaxThreads threads) keep the narrow builds' register
  /// caps: 512 x 3 CTAs allow 40 registers, as 256 x 6 do; 512 x 2 allow 64, as 256 x 4.
  static constexpr uint32_t bound_threads(NormKind kind, int thread_bytes, bool two_pass, bool wide, int vecs) {
    if (kind == NormKind::kQKNorm && wide && !two_pass) return kSplitMaxThreads;
    const uint32_t most = max_threads(kind, thread_bytes, two_pass, vecs);
    return two_pass || wide || most < kBlockThreads ? most : kBlockThreads;
  }
  static constexpr int bound_blocks(NormKind kind, int thread_bytes, bool two_pass, bool wide, int vecs) {
    if (kind == NormKind::kQKNorm && wide && !two_pass) {
      const int blocks = narrow_min_blocks(kind, thread_bytes, vecs) * static_cast<int>(kBlockThreads) /
                         static_cast<int>(kSplitMaxThreads);
      return blocks > 0 ? blocks : 1;
    }
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
/// fraction of the FMA rate; at one token (one CTA of 256 threads, 16 elements each) that is the
/// 0.1 us rmsnorm_hf measured over rmsnorm (1.14 vs 1.00 us, H200, same launch geometry and PDL).
/// With the packed multiply it converts 0.5 per element, as rmsnorm does.
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
/// 16-byte vectors that write every row they read (in place: the fused add, qknorm, rmsnorm with
/// out = input) and read at least NormConfig::kL2HintMinBytes (use_l2_hint), so the
/// stores return every line the loads marked to the default priority and nothing marked
/// evict_last outlives the kernel. The weight is loaded without the hint (it is never written).
/// Why: the DRAM bytes are the same (ncu, fused add [16384, 4096]: 268.5 MB read either way), the
/// order is not: with default priorities the L2 replaces the clean lines just read and the dirty
/// lines just written alike; with the rows evict_last it writes the dirty lines back first, and
/// DRAM serves the stream at the rate of a copy. H200, bf16, cold L2, same process, before ->
/// after: fused add [16384, 4096] 133.1 -> 125.3 us (95.1 -> 101.0 % of a torch copy), [16384,
/// 8192] 262.1 -> 247.6 (96.5 -> 102.2 %); rmsnorm out = x [16384, 4096 / 8192] 65.4 / 131.5 ->
/// 63.3 / 125.3; qknorm at 16384 tokens 81.7 -> 79.7 (96.8 -> 99.3 %). The same in a bare probe of
/// the access pattern (scripts/debug/stream_probe.py: 94.4 -> 99.0 % in place). Not used:
/// - with a separate out (rmsnorm 97.7 %, measured 100 % hinted): its input lines would stay
///   evict_last after the kernel and push the next kernel's data out of L2 first (a 32 MB buffer
///   read twice right after rmsnorm [16384, 4096]: second read 18.3 us vs 13.5 without the hint;
///   after the hinted in-place fused add 14.4-14.6, as without it);
/// - evict_last loads with plain stores (the lines stay evict_last: same 18 us), evict_first
///   stores (98.3 %), applypriority after use (rmsnorm 92.8 %), loads evict_first or .cs (-4 %);
/// - launches below NormConfig::kL2HintMinBytes: latency-bound, the hinted accesses (compiler
///   barriers) measured 0.05-0.13 us slower at one token.
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
/// before the wait instead lets whole chains of queued kernels launch and occupy the SMs
/// (rmsnorm [64, 4096]: 2.1 vs 1.5 us). H200, per call: qknorm one token 1.28 -> 0.98 us,
/// rmsnorm [1, 4096] 1.24 -> 1.18, fused add 1.37 -> 1.26.
SGL_DEVICE void pdl_wait_then_release() {
  device::pdl_wait_primary();
  device::pdl_launch_dependents();
}

/// Sum of `value` over the `tpr` threads of each row; every thread of the row gets the total.
/// tpr <= 32: rows are aligned groups of tpr lanes, reduced by shuffles (no barrier).
/// tpr > 32 (a multiple of 32): warp sums go to smem[warp]; one __syncthreads(); the row's warps
/// (slot * tpr / 32 ...) are summed again: by every thread from two broadcast LDS.128 for rows of
/// 4 or 8 warps, by a shuffle reduction in each warp otherwise. Every thread of the CTA must call it with
/// the same tpr. `smem` (kMaxWarps floats) must not be rewritten until every thread has passed the
/// next barrier: callers alternate two buffers.
/// `warp_base`: the CTA's warp at which slot 0's row starts (0, except for rows[1] of the
/// one-token-per-CTA layout, norm_rows_split).
/// Example: tpr = 8, lanes holding their lane id: lanes 0..7 get 28, lanes 8..15 get 92, ...
SGL_DEVICE float row_reduce_sum(float value, int tpr, int slot, float* smem, int warp_base = 0) {
  const uint32_t lane = threadIdx.x % device::kWarpThreads;
  const uint32_t warp = threadIdx.x / device::kWarpThreads;
  const int warps_per_row = tpr / static_cast<int>(device::kWarpThreads);
  // Addresses first, so that their arithmetic is off the chain of shuffles and barrier below.
  float* const warp_partial = smem + warp;
  const int first_partial = warp_base + slot * warps_per_row;
  const float4* const row_partials = reinterpret_cast<const float4*>(smem + first_partial);
  if (tpr < static_cast<int>(device::kWarpThreads)) {
    // Rows of lanes (qknorm heads, short rows): log2(tpr) shuffles, one uniform branch per level.
    // (All five shuffles with a predicated add cost qknorm at 16384 tokens 81.9 vs 81.4 us.)
#pragma unroll
    for (int mask = device::kWarpThreads / 2; mask > 0; mask >>= 1) {
      if (mask < tpr) value += __shfl_xor_sync(0xffffffffu, value, mask);
    }
    return value;
  }
  // Rows of whole warps: the five shuffles as straight-line code. With a branch per level the
  // compiler left the shared-window address (S2R SR_CgaCtaId) for the store after the last
  // shuffle, on the critical path; now it is issued with the loads. Together with the
  // straight-line sums of norm_group_in_registers, H200, same process: rmsnorm [1, 4096] 1.09 /
  // 1.15 -> 1.03 / 0.99 us, fused add [1, 4096] 1.23 -> 1.16 / 1.06, [64, 4096] 2.07 -> 1.91.
  value = device::warp::reduce_sum<float>(value);
  if (tpr == static_cast<int>(device::kWarpThreads)) return value;
  if (lane == 0) *warp_partial = value;
  __syncthreads();
  if ((warps_per_row == 4 || warps_per_row == 8) && warp_base % 4 == 0) {  // float4-aligned partials
    // Rows of 128 or 256 threads (decode rmsnorm): every thread reads the row's partials (broadcast
    // LDS.128) and sums them as a tree, shorter than five more shuffles (rmsnorm [1, 4096] on an
    // H200: 1.13 vs 1.18 us). Wider rows keep the shuffles (eight float4 would cost registers).
    const float4 a = row_partials[0];
    float total = (a.x + a.y) + (a.z + a.w);
    if (warps_per_row == 8) {
      const float4 b = row_partials[1];
      total += (b.x + b.y) + (b.z + b.w);
    }
    return total;
  }
  value = static_cast<int>(lane) < warps_per_row ? smem[first_partial + lane] : 0.0f;
  return device::warp::reduce_sum<float>(value);
}

/// The tensor a CTA serves (0, or 1 = k of qknorm) and its place among that tensor's CTAs.
struct CtaShare {
  int segment;
  int64_t first;   // first group of rows
  int64_t stride;  // CTAs serving the tensor
};

/// qknorm: params.rows0_ctas CTAs serve q, the other gridDim.x - rows0_ctas serve k. With
/// params.interleave_segments (set when the grid has more CTAs than SMs, i.e. runs in waves) the
/// two are interleaved in launch order in proportion (CTA b serves k when floor((b + 1) * K / grid)
/// > floor(b * K / grid), K the k CTAs), so that the CTAs running at any time read q and k of the
/// same tokens: the fused qkv rows are read as contiguous q + k spans instead of q spans first and
/// k's short strided spans last (H200, 16384 tokens of 32 + 8 heads x 128: 81.9 vs 84.2 us, 97.1
/// vs 94.5 % of copy). Example: CTAs 0-3 q of tokens 0-3, CTA 4 k of tokens 0-3, CTAs 5-8 q of
/// tokens 4-7, ... Otherwise (one wave; the division cost 0.1 us at one token) q first, then k.
template <NormKind kKind>
SGL_DEVICE CtaShare cta_share(const NormParams& params) {
  const int64_t b = blockIdx.x;
  const int64_t grid = gridDim.x;
  if constexpr (kKind == NormKind::kQKNorm) {
    const int64_t k_ctas = grid - params.rows0_ctas;
    // Interleaved while grid * K < 2^32 (32-bit division; qknorm at 65536 tokens of 32 + 8 heads is
    // 81920 CTAs, K = 16384); beyond that, and without one of the tensors, q first, then k (a
    // 64-bit division here made the kernel spill).
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

/// kWholeRows: kQKNorm rows of one head per token (norm_rows_split), row = token.
template <typename T, NormKind kKind, bool kWholeRows = false>
SGL_DEVICE RowPointers<T> row_pointers(const NormRows& rows, int64_t row) {
  int64_t token = row;
  int64_t head = 0;
  if constexpr (kKind == NormKind::kQKNorm && !kWholeRows) {
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
              normalize(
                  x[j],
                  w[j],
                  scale,
                  params.weight_offset,
                  kKind == NormKind::kRMSNorm && params.cast_x_before_out_mul,
                  params.packed_weight_mul),
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
template <typename T, int kVecN, NormKind kKind, int kVecs, bool kLoadWeight, bool kL2Hint, bool kWholeRows = false>
SGL_DEVICE void norm_group_in_registers(
    const NormParams& params,
    const NormRows& rows,
    int64_t group,
    int slot,
    int lane,
    const device::AlignedVector<T, kVecN>* weight,
    float* smem,
    int warp_base = 0) {
  using vec_t = device::AlignedVector<T, kVecN>;
  const int tpr = rows.threads_per_row;
  const int64_t row = group * rows.rows_per_cta + slot;
  const bool active = row < rows.num_rows;
  RowPointers<T> ptrs{};
  if (active) ptrs = row_pointers<T, kKind, kWholeRows>(rows, row);
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

  const float total = row_reduce_sum(sum, tpr, slot, smem, warp_base);
  const float rstd = rsqrtf(total * rows.inv_hidden_size + params.eps);
  const RowScale scale = row_scale(rstd, params.weight_offset);

#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (valid[j]) {
      access.store(
          normalize(
              x[j],
              weight[j],
              scale,
              params.weight_offset,
              kKind == NormKind::kRMSNorm && params.cast_x_before_out_mul,
              params.packed_weight_mul),
          ptrs.out,
          lane + j * tpr);
    }
  }
}

/// kQKNorm, one token per CTA (the kWide builds; fused_inplace_qknorm_across_heads): CTA b
/// normalises row b of rows[0] with threads [0, split_threads) and row b of rows[1] with the
/// others, each tensor with its own threads per row (one row each, so rows_per_cta = 1; both
/// multiples of 32 and both above 32 or both 32, so that every thread passes the same barriers; the
/// launcher sets this up, launch_norm_rows). A fused qkv buffer is then read as one contiguous q + k
/// span per token and CTA (q [16384, 4096] + k [16384, 1024] bf16: 10 KiB in a 320-thread CTA),
/// every CTA has the same work, and there is no split of the grid between the tensors to compute.
template <typename T, int kVecN, int kVecs, bool kL2Hint>
SGL_DEVICE void norm_rows_split(const NormParams& params, float (*partials)[NormConfig::kMaxWarps]) {
  // One CTA per token (grid = num_tokens <= 2^30, set_split_layout): straight-line code, no loop
  // (a loop over tokens cost the 40-register build 16 bytes of spills).
  const int tid = static_cast<int>(threadIdx.x);
  const bool second = tid >= params.split_threads;
  const NormRows& rows = params.rows[second ? 1 : 0];
  const int lane = second ? tid - params.split_threads : tid;
  const int warp_base = second ? params.split_threads / static_cast<int>(device::kWarpThreads) : 0;
  norm_group_in_registers<T, kVecN, NormKind::kQKNorm, kVecs, true, kL2Hint, true>(
      params, rows, blockIdx.x, 0, lane, nullptr, partials[0], warp_base);
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
  // group and loads x and the weight together. More groups than CTAs (grid capped, or a benchmark
  // override) repeat that per group, the weight reloaded from L1 / L2 each time: keeping it in
  // registers across groups cost registers, hence occupancy, in every launch. The fused add with
  // four or more vectors per thread would spill holding x, the residual and the weight at once
  // and keeps the weight in registers, loaded before the first group.
  constexpr bool kOneGroupPath = kKind != NormKind::kFusedAddRMSNorm || kVecs <= 2;
  if constexpr (kOneGroupPath) {
    // One group: straight-line code, kept apart from the loop below (the loop alone measured
    // rmsnorm [1, 4096] 1.45 vs 1.24 us on an H200).
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
/// separate build rather than a runtime branch: both paths in one kernel spilled three builds
/// whose paths alone do not (the compiler hoists their common arithmetic above the branch).
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
  } else if constexpr (kKind == NormKind::kQKNorm && kWide) {
    norm_rows_split<T, kVecN, kVecs, kL2Hint>(params, partials);
  } else {
    norm_rows_in_registers<T, kVecN, kKind, kVecs, kL2Hint>(params, partials);
  }
}

// ---------------------------------------------------------------------------------------------
// Host side: configuration shared by the three launchers
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

/// A geometry forced by _set_geometry_override (benchmark sweeps only; 0 = automatic).
struct NormOverride {
  int64_t threads_per_row = 0;  // a power of two <= 32 or a multiple of 32
  int64_t vecs_per_thread = 0;  // 1, 2, 4, 8 (0: as many as the row needs)
  int64_t blocks_per_sm = 0;    // > 0: a persistent grid, at most this many CTAs per SM; else one per group
};

inline NormOverride& norm_override() {
  static NormOverride value;
  return value;
}

/// The L2 hint forced by _set_l2_hint_override (tests and benchmarks only): -1 automatic, 0 never,
/// 1 every in-place launch whatever its size. Out-of-place launches never take it.
inline int64_t& norm_l2_hint_override() {
  static int64_t value = -1;
  return value;
}

/// Paths forced by _set_path_override (tests and benchmarks: the older and the newer path of a
/// choice timed in one process): -1 automatic, 0 the older path, 1 the newer where it applies.
struct NormPathOverride {
  int64_t packed_weight_mul = -1;  // cast_x_before_out_mul, fp16 / bf16, weight_offset 0: packed
                                   //   multiply (normalize; automatic: on), 0 the fp32 multiply
  int64_t one_cta_per_token = -1;  // kQKNorm across heads: 1 one token's q and k rows per CTA
                                   //   (norm_rows_split, where it applies); automatic and 0: each
                                   //   tensor's rows in CTAs of their own (H200, bf16 [16384, 4096 +
                                   //   1024]: 80.72 us = 97.9 % of copy vs 84.00 us = 94.1 % for one
                                   //   token per CTA, and 1.03 vs 1.25 us at 1 token)
};

inline NormPathOverride& norm_path_override() {
  static NormPathOverride value;
  return value;
}

/// Whether a launch takes the L2 hint of RowAccess: it writes every row it reads in place and its
/// input rows hold at least NormConfig::kL2HintMinBytes (`input_bytes`: smaller launches are
/// latency-bound, and the hinted accesses cost them 0.05-0.13 us). The launch then takes a hinted
/// build if its vectors are 16 bytes wide (launch_norm_bucket); narrower ones run the plain builds.
inline bool use_l2_hint(bool in_place, int64_t input_bytes) {
  if (!in_place) return false;
  const int64_t mode = norm_l2_hint_override();
  if (mode >= 0) return mode == 1;
  return input_bytes >= NormConfig::kL2HintMinBytes;
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
  const NormOverride& forced = norm_override();
  if (forced.threads_per_row > 0) {
    const int64_t tpr = forced.threads_per_row;
    const int64_t k = forced.vecs_per_thread > 0
                          ? forced.vecs_per_thread
                          : static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(div_ceil(num_vecs, tpr))));
    host::RuntimeCheck(
        round_threads_per_row(tpr) == tpr && (k & (k - 1)) == 0 && k <= max_vecs &&
            tpr <= NormConfig::max_threads(kind, static_cast<int>(k) * vec_bytes, false, static_cast<int>(k)) &&
            k * tpr >= num_vecs,
        "norm geometry override: ",
        tpr,
        " threads x ",
        k,
        " vectors per thread cannot cover ",
        num_vecs,
        " vectors of ",
        vec_bytes,
        " bytes");
    return make_geometry(tpr, k);
  }
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
        // one token, head_dim 128: 16 x 1 measured 1.21 us vs 1.42 for 8 x 2).
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

/// Resident CTAs per SM of kKernel at `block_threads` (a multiple of 32, <= 1024), cached per
/// block size (the query runs once per kernel and size, on the current device).
template <auto kKernel>
uint32_t cached_blocks_per_sm(uint32_t block_threads) {
  static std::array<std::atomic<uint32_t>, 33> cache{};
  std::atomic<uint32_t>& slot = cache[block_threads / device::kWarpThreads];
  uint32_t blocks = slot.load(std::memory_order_relaxed);
  if (blocks == 0) {
    blocks = host::runtime::get_blocks_per_sm(kKernel, block_threads);
    host::RuntimeCheck(blocks > 0, "norm: kernel cannot run with ", block_threads, " threads per block");
    slot.store(blocks, std::memory_order_relaxed);
  }
  return blocks;
}

/// enable_pdl: 1 on, 0 off, negative "auto" = on for compute capability >= 9 (Hopper and later).
inline bool resolve_pdl(int64_t enable_pdl, const DLDevice& device) {
  if (enable_pdl >= 0) return enable_pdl != 0;
  return host::runtime::get_cc_major(device.device_id) >= 9;
}

/// Launches norm_rows_kernel<T, kVecN, kKind, kVecs, kWide, kL2Hint>: one CTA per group of rows (at most
/// 2^30 CTAs; beyond that CTAs take several groups), or, under the benchmark override, at most SMs x
/// blocks_per_sm CTAs (persistent). One CTA per group measured fastest on an H200 for all three
/// kinds (rmsnorm [16384, 4096 / 8192] bf16 65.2 / 129.4 us vs 69.4 / 132.0 persistent at the
/// same registers, the fused add 94.8% vs 89.7% of copy, qknorm at 16384 tokens 84.7 vs 88.0 us):
/// the hardware schedules a new CTA as soon as one retires, so the next group's loads overlap the
/// previous one's reduction and stores. qknorm gives q and k shares of the grid in proportion to
/// their groups, at least one each, interleaved in launch order when the grid runs in waves
/// (cta_share).
template <typename T, int kVecN, NormKind kKind, int kVecs, bool kWide, bool kL2Hint>
void launch_norm_kernel(NormParams params, const NormGeometry& geometry, DLDevice device, bool pdl) {
  constexpr auto kKernel = norm_rows_kernel<T, kVecN, kKind, kVecs, kWide, kL2Hint>;
  const int64_t groups0 = params.rows[0].num_groups;
  const int64_t groups1 = kKind == NormKind::kQKNorm ? params.rows[1].num_groups : 0;
  const int64_t groups = groups0 + groups1;
  // The one-token-per-CTA layout: one CTA per group of rows[0] (rows[1] has as many).
  int64_t grid = std::min(params.split_threads > 0 ? groups0 : groups, int64_t{1} << 30);
  if (const int64_t blocks_per_sm = norm_override().blocks_per_sm; blocks_per_sm > 0) {
    const int64_t resident = int64_t{host::runtime::get_sm_count(device.device_id)} *
                             std::min<int64_t>(blocks_per_sm, cached_blocks_per_sm<kKernel>(geometry.block_threads));
    grid = std::min(grid, resident);
  }
  params.interleave_segments = kKind == NormKind::kQKNorm && params.split_threads == 0 &&
                               grid > int64_t{host::runtime::get_sm_count(device.device_id)};
  if (params.split_threads > 0) {
    params.rows0_ctas = grid;  // unused by norm_rows_split
  } else if (groups0 == 0) {
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
/// without the L2 hint.
template <typename T, int kVecN, NormKind kKind, int kVecs, bool kL2Hint>
void launch_norm_bucket_hint(const NormParams& params, const NormGeometry& geometry, DLDevice device, bool pdl) {
  constexpr int kBytes = kNormThreadBytes<T, kVecN, kVecs>;
  // kQKNorm's kWide builds are the one-token-per-CTA layout (16-byte vectors only, set_split_layout).
  if constexpr (kKind == NormKind::kQKNorm && kVecs > 0 && kVecN * sizeof(T) == 16) {
    if (params.split_threads > 0) {
      return launch_norm_kernel<T, kVecN, kKind, kVecs, true, kL2Hint>(params, geometry, device, pdl);
    }
  }
  if constexpr (kVecs > 0 && NormConfig::max_threads(kKind, kBytes, false, kVecs) > NormConfig::kBlockThreads) {
    if (geometry.block_threads > NormConfig::kBlockThreads) {
      return launch_norm_kernel<T, kVecN, kKind, kVecs, true, kL2Hint>(params, geometry, device, pdl);
    }
  }
  launch_norm_kernel<T, kVecN, kKind, kVecs, false, kL2Hint>(params, geometry, device, pdl);
}

template <typename T, int kVecN, NormKind kKind, int kVecs>
void launch_norm_bucket(
    const NormParams& params, const NormGeometry& geometry, DLDevice device, bool pdl, bool l2_hint) {
  // Hinted builds exist for 16-byte vectors only (rows 16-byte aligned, as large tensors are):
  // for every width they doubled the norm module's compile time (CI compiles it without a GPU).
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

/// The one-token-per-CTA layout of a kQKNorm launch (norm_rows_split), for rows filled by
/// set_row_geometry: where it applies, sets each tensor's rows to one row per CTA (threads per row
/// raised to 32 at least, and to 64 when the other tensor's rows need more than a warp, so that
/// both reduce through the same barrier), params.split_threads to rows[0]'s threads, and returns
/// the CTA size; otherwise returns 0 and changes nothing. It applies to whole rows of two tensors
/// of as many rows (fused_inplace_qknorm_across_heads: num_heads 1), register-path geometries, both
/// rows within NormConfig::kSplitMaxThreads threads together, at most 2^30 tokens (one CTA each),
/// only when _set_path_override(_, 1) asks for it (it measured slower than each tensor's rows in
/// CTAs of their own, see NormPathOverride) and no geometry override is in force. Example: bf16
/// q [T, 4096] + k [T, 1024], 16-byte vectors: 256 x 2 + 64 x 2, 320-thread CTAs, one per token.
inline uint32_t set_split_layout(NormParams& params, const NormGeometry& geometry) {
  if (norm_path_override().one_cta_per_token != 1) return 0;
  if (norm_override().threads_per_row > 0 || norm_override().blocks_per_sm > 0) return 0;
  if (geometry.vecs_per_thread == 0) return 0;
  NormRows& a = params.rows[0];
  NormRows& b = params.rows[1];
  if (a.num_heads != 1 || b.num_heads != 1 || a.num_rows == 0 || a.num_rows != b.num_rows) return 0;
  if (a.num_rows > (int64_t{1} << 30)) return 0;  // one CTA per token, no loop (norm_rows_split)
  constexpr int64_t kWarp = device::kWarpThreads;
  int64_t threads_a = std::max<int64_t>(a.threads_per_row, kWarp);
  int64_t threads_b = std::max<int64_t>(b.threads_per_row, kWarp);
  if (threads_a > kWarp || threads_b > kWarp) {
    threads_a = std::max(threads_a, 2 * kWarp);
    threads_b = std::max(threads_b, 2 * kWarp);
  }
  if (threads_a + threads_b > NormConfig::kSplitMaxThreads) return 0;
  const auto one_row_per_cta = [](NormRows& rows, int64_t threads) {
    rows.threads_per_row = static_cast<int32_t>(threads);
    rows.rows_per_cta = 1;
    const uint64_t bits = static_cast<uint64_t>(threads);
    rows.tpr_shift = std::has_single_bit(bits) ? std::countr_zero(bits) : -1;
    rows.num_groups = rows.num_rows;
  };
  one_row_per_cta(a, threads_a);
  one_row_per_cta(b, threads_b);
  params.split_threads = static_cast<int32_t>(threads_a);
  return static_cast<uint32_t>(threads_a + threads_b);
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
  NormGeometry geometry = choose_geometry(
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
  params.split_threads = 0;
  if constexpr (kKind == NormKind::kQKNorm && kVecN * sizeof(T) == 16) {
    if (const uint32_t threads = set_split_layout(params, geometry); threads > 0) geometry.block_threads = threads;
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

/// Launches with the widest vector `vec_bytes` allows (16 / 8 / 4 / 2 bytes; it must divide both
/// tensors' hidden_size bytes); in_place as in launch_norm_rows.
template <typename T, NormKind kKind>
void launch_norm_rows_any_width(const NormParams& params, int64_t vec_bytes, DLDevice device, bool pdl, bool in_place) {
  switch (vec_bytes) {
    case 16:
      return launch_norm_rows<T, 16 / sizeof(T), kKind>(params, device, pdl, in_place);
    case 8:
      return launch_norm_rows<T, 8 / sizeof(T), kKind>(params, device, pdl, in_place);
    default:
      if constexpr (sizeof(T) <= 2) {
        if (vec_bytes == 4) {
          return launch_norm_rows<T, 4 / sizeof(T), kKind>(params, device, pdl, in_place);
        }
        return launch_norm_rows<T, 1, kKind>(params, device, pdl, in_place);
      } else {
        return launch_norm_rows<T, 1, kKind>(params, device, pdl, in_place);
      }
  }
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

// ---------------------------------------------------------------------------------------------
// rmsnorm launcher
// ---------------------------------------------------------------------------------------------

/// out = input * rsqrt(mean(input^2) + eps) * (weight + weight_offset), row by row.
/// input, out: [num_tokens, hidden_size] of T on one CUDA device, last dim contiguous, any row
/// strides (out may be input); weight: [hidden_size], contiguous. enable_pdl: 1 / 0 / -1 (auto).
/// T = fp16_t | bf16_t | fp32_t. Empty inputs return without a launch. Throws PanicError (Python
/// RuntimeError) naming the tensor on any mismatch.
template <typename T>
void rmsnorm(
    tvm::ffi::TensorView out,
    tvm::ffi::TensorView input,
    tvm::ffi::TensorView weight,
    double eps,
    double weight_offset,
    bool cast_x_before_out_mul,
    int64_t enable_pdl) {
  using namespace host;

  // Validate
  SymbolicSize num_tokens{"num_tokens"};
  SymbolicSize hidden_size{"hidden_size"};
  SymbolicDevice device_;
  device_.set_options<kDLCUDA>();
  TensorMatcher({num_tokens, hidden_size})  //
      .with_strides({kAnySize, kAnySize})
      .with_dtype<T>()
      .with_device<kDLCUDA>(device_)
      .verify(input, "input")
      .verify(out, "out");
  check_last_dim_contiguous("rmsnorm", "input", input);
  check_last_dim_contiguous("rmsnorm", "out", out);
  TensorMatcher({hidden_size})  //
      .with_dtype<T>()
      .with_device<kDLCUDA>(device_)
      .verify(weight, "weight");
  verify_no_self_overlap(out, "out");
  verify_no_partial_overlap(out, "out", input, "input", /*allow_same=*/true);
  // Other rows still read the weight while out is written: they must not share memory.
  verify_no_partial_overlap(out, "out", weight, "weight", /*allow_same=*/false);

  // Unwrap
  const int64_t n = num_tokens.unwrap();
  const int64_t h = hidden_size.unwrap();
  const DLDevice device = device_.unwrap();
  check_norm_scalars("rmsnorm", h, eps);
  if (n == 0 || h == 0) return;

  // Configure
  NormParams params{};
  params.rows[0] = NormRows{
      .input = data_ptr<const void>(input),
      .out = data_ptr(out),
      .residual = nullptr,
      .weight = data_ptr<const void>(weight),
      .num_rows = n,
      .num_groups = 0,  // set with the geometry
      .num_heads = 1,
      .hidden_size = h,
      .input_token_stride = input.stride(0),
      .input_head_stride = 0,
      .out_token_stride = out.stride(0),
      .out_head_stride = 0,
      .residual_token_stride = 0,
  };
  params.eps = static_cast<float>(eps);
  params.weight_offset = static_cast<float>(weight_offset);
  params.cast_x_before_out_mul = cast_x_before_out_mul;
  params.packed_weight_mul =
      cast_x_before_out_mul && weight_offset == 0.0 && sizeof(T) == 2 && norm_path_override().packed_weight_mul != 0;
  const uint64_t row_bytes = n > 1 ? static_cast<uint64_t>(input.stride(0) | out.stride(0)) * sizeof(T) : 0;
  const int64_t vec_bytes = widest_vector_bytes<T>(
      {address_of(params.rows[0].input),
       address_of(params.rows[0].out),
       address_of(params.rows[0].weight),
       row_bytes,
       static_cast<uint64_t>(h) * sizeof(T)});

  // Launch
  // In place: out is input (the overlap check above allows only the same view or none).
  const bool in_place = params.rows[0].out == params.rows[0].input;
  launch_norm_rows_any_width<T, NormKind::kRMSNorm>(
      params, vec_bytes, device, resolve_pdl(enable_pdl, device), in_place);
}

/// Benchmark hook: forces the geometry of every later norm launch of this module (all three ops)
/// until called again with zeros. threads_per_row (a power of two <= 32 or a multiple of 32) and
/// vecs_per_thread (1/2/4/8, 0 = as needed) must cover the row or the launch throws;
/// blocks_per_sm > 0 makes the grid persistent with at most that many CTAs per SM (capped at the
/// occupancy); 0 or < 0 keeps the default, one CTA per group of rows.
inline void set_norm_geometry_override(int64_t threads_per_row, int64_t vecs_per_thread, int64_t blocks_per_sm) {
  norm_override() = NormOverride{threads_per_row, vecs_per_thread, blocks_per_sm};
}

/// Tests and benchmarks only: forces the paths of NormPathOverride (each -1 automatic, 0 the older
/// path, 1 the newer where it applies) for every later launch of this module.
inline void set_norm_path_override(int64_t packed_weight_mul, int64_t one_cta_per_token) {
  host::RuntimeCheck(
      packed_weight_mul >= -1 && packed_weight_mul <= 1 && one_cta_per_token >= -1 && one_cta_per_token <= 1,
      "_set_path_override: each mode must be -1, 0 or 1, got ",
      packed_weight_mul,
      " and ",
      one_cta_per_token);
  norm_path_override() = NormPathOverride{packed_weight_mul, one_cta_per_token};
}

/// Tests and benchmarks only: forces the L2 hint of in-place launches (see norm_l2_hint_override).
inline void set_norm_l2_hint_override(int64_t mode) {
  host::RuntimeCheck(mode >= -1 && mode <= 1, "_set_l2_hint_override: mode must be -1, 0 or 1, got ", mode);
  norm_l2_hint_override() = mode;
}

}  // namespace
