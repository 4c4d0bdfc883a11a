// RMSNorm over the last dimension, and the row-normalisation kernel shared by every norm op.
//
//   out[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * (w + weight_offset)
//
// fp32 arithmetic, one rounding to the dtype (weight_offset = 1 gives Gemma's (1 + w)). With
// cast_x_before_out_mul the normalised x is rounded to the dtype first and then multiplied by the
// weight (Hugging Face's order): out = round(float(round(x * rstd)) * (w + weight_offset)).
//
// One kernel, norm_rows_kernel<T, kVecN, kKind, kVecs>, serves three ops (kKind):
//   kRMSNorm          rows of `input` -> rows of `out`                         (this file)
//   kFusedAddRMSNorm  residual <- round(input + residual); input <- rmsnorm(residual)  (fused_add_rmsnorm.cuh)
//   kQKNorm           every head of q and of k normalised in place, two weights        (qknorm.cuh)
//
// Layout of the work. A "row" is one normalised vector of hidden_size elements: a token of
// rmsnorm, a (token, head) pair of qknorm. threads_per_row (TPR) threads share a row; each holds
// up to kMaxVecs vectors of kVecN elements (16 bytes when the pointers and strides allow it), so
// x is read once from DRAM and kept in registers between the reduction and the scaling:
//   TPR <= 32   several rows per warp, the sum of squares reduced by shuffles inside TPR lanes;
//   TPR  > 32   one or more rows per CTA, warp partials combined through shared memory.
// Rows too long for registers (more than TPR * kMaxVecs vectors) take two passes: sum of squares,
// then a re-read (an L2 hit) to scale and store. The grid is persistent (SMs x resident CTAs):
// CTAs stride over groups of rows_per_cta rows of one tensor (qknorm splits the CTAs between q and
// k in proportion to their rows) and keep its weight in registers (a thread always touches the
// same columns).
//
// Memory traffic (the bytes-moved counts of the benchmarks): rmsnorm 2*N*H*sizeof(T) + H*sizeof(T);
// fused add 4*N*H*sizeof(T) + H*sizeof(T); qknorm 2*N*(Hq+Hk)*D*sizeof(T) + 2*D*sizeof(T).
#pragma once

#include <sgl_kernel/runtime.cuh>  // For runtime::get_blocks_per_sm, get_sm_count, get_cc_major
#include <sgl_kernel/tensor.h>     // For TensorMatcher, SymbolicSize, SymbolicDevice, kAnySize, data_ptr
#include <sgl_kernel/type.cuh>     // For device::cast
#include <sgl_kernel/utils.cuh>    // For LaunchKernel, SGL_DEVICE, kWarpThreads, pdl_wait_primary
#include <sgl_kernel/utils.h>      // For RuntimeCheck, div_ceil
#include <sgl_kernel/vec.cuh>      // For AlignedVector
#include <sgl_kernel/warp.cuh>     // For warp::reduce_sum

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <initializer_list>
#include <limits>

namespace {

/// Which op a norm_rows_kernel instantiation computes.
enum class NormKind { kRMSNorm, kFusedAddRMSNorm, kQKNorm };

/// One tensor's rows. Row r is (token, head) = (r / num_heads, r % num_heads) and lives at
/// input + token * input_token_stride + head * input_head_stride (elements; the last dim is
/// contiguous). rmsnorm and the fused add: num_heads = 1.
struct NormRows {
  const void* input;              // [num_tokens, num_heads, hidden_size]
  void* out;                      // [num_tokens, num_heads, hidden_size] (kRMSNorm; the others write input)
  void* residual;                 // [num_tokens, hidden_size]; kFusedAddRMSNorm only
  const void* weight;             // [hidden_size]
  int64_t num_rows;               // num_tokens * num_heads
  int64_t num_groups;             // div_ceil(num_rows, rows_per_cta)
  int64_t num_heads;              // rows per token (>= 1)
  int64_t input_token_stride;     // elements
  int64_t input_head_stride;      // elements
  int64_t out_token_stride;       // elements
  int64_t out_head_stride;        // elements
  int64_t residual_token_stride;  // elements
};

/// Kernel arguments of norm_rows_kernel.
struct NormParams {
  NormRows rows[2];             // kQKNorm: {q, k}; otherwise rows[0] only
  int64_t rows0_ctas;           // kQKNorm: CTAs [0, rows0_ctas) serve q, the rest k
  int32_t num_vecs;             // vectors per row: hidden_size / kVecN (hidden_size < 2^30, checked)
  int32_t threads_per_row;      // TPR: a power of two <= 32, or a multiple of 32
  int32_t rows_per_cta;         // blockDim.x / threads_per_row
  float eps;                    // added to the mean square
  float inv_hidden_size;        // 1 / hidden_size
  float weight_offset;          // 0 (RMSNorm) or 1 (Gemma: w + 1)
  bool cast_x_before_out_mul;   // round x * rstd to T before the weight multiply
};

/// Launch facts of norm_rows_kernel.
struct NormConfig {
  static constexpr int kTargetVecs = 2;            // vectors per thread the heuristic aims for
  static constexpr int64_t kPreferredRowThreads = 256;  // rows wider than this take more vectors
                                                        // per thread first (H200: H=8192 as 256 x 4
                                                        // beat 512 x 2 by 12%; H=4096 256 x 2 best)
  static constexpr uint32_t kBlockThreads = 256;   // CTA size when several rows share a CTA
  static constexpr uint32_t kMaxWarps = 32;        // shared-memory partials per buffer
  static constexpr int kMaxThreadBytes = 64;       // x held per thread at most (registers)

  /// Vectors of x a thread may hold: 64 bytes' worth, at most 8. The register path is compiled for
  /// 1, 2, 4 and 8 (when allowed) vectors per thread; the two-pass path moves chunks of max_vecs.
  static constexpr int max_vecs(int vec_bytes) {
    return kMaxThreadBytes / vec_bytes < 8 ? kMaxThreadBytes / vec_bytes : 8;
  }

  /// Largest CTA (and TPR) for a kind and the bytes of x per thread; also the kernel's
  /// __launch_bounds__, i.e. its register budget: 1024 threads (64 registers) hold 32 bytes of x
  /// plus the cached weight, 512 threads (128 registers) hold 64. qknorm: 256 (heads are short).
  static constexpr uint32_t max_threads(NormKind kind, int thread_bytes) {
    if (kind == NormKind::kQKNorm) return 256;
    return thread_bytes > 32 ? 512 : 1024;
  }
};

// ---------------------------------------------------------------------------------------------
// Device helpers
// ---------------------------------------------------------------------------------------------

/// Sum of x[i]^2 in fp32 over one vector.
template <typename T, std::size_t N>
SGL_DEVICE float sum_squares(const device::AlignedVector<T, N>& x) {
  float sum = 0.0f;
#pragma unroll
  for (std::size_t i = 0; i < N; ++i) {
    const float f = device::cast<fp32_t>(x[i]);
    sum = fmaf(f, f, sum);
  }
  return sum;
}

/// round(x + r) element-wise: the fp32 sum rounded once to T (what the residual stream stores).
template <typename T, std::size_t N>
SGL_DEVICE device::AlignedVector<T, N> add_rounded(const device::AlignedVector<T, N>& x,
                                                   const device::AlignedVector<T, N>& r) {
  device::AlignedVector<T, N> sum;
#pragma unroll
  for (std::size_t i = 0; i < N; ++i) {
    sum[i] = device::cast<T>(device::cast<fp32_t>(x[i]) + device::cast<fp32_t>(r[i]));
  }
  return sum;
}

/// round(x * rstd * (w + weight_offset)) element-wise; with cast_x_first, x * rstd is rounded to T
/// before the weight multiply.
template <typename T, std::size_t N>
SGL_DEVICE device::AlignedVector<T, N> normalize(const device::AlignedVector<T, N>& x,
                                                 const device::AlignedVector<T, N>& w, float rstd,
                                                 float weight_offset, bool cast_x_first) {
  device::AlignedVector<T, N> out;
#pragma unroll
  for (std::size_t i = 0; i < N; ++i) {
    float normed = device::cast<fp32_t>(x[i]) * rstd;
    if (cast_x_first) normed = device::cast<fp32_t>(device::cast<T>(normed));
    out[i] = device::cast<T>(normed * (device::cast<fp32_t>(w[i]) + weight_offset));
  }
  return out;
}

/// Sum of `value` over the `tpr` threads of each row; every thread of the row gets the total.
/// tpr <= 32: rows are aligned groups of tpr lanes, reduced by shuffles (no barrier).
/// tpr > 32 (a multiple of 32): warp sums go to smem[warp]; one __syncthreads(); the row's warps
/// (slot * tpr / 32 ...) are summed again by each warp. Every thread of the CTA must call it with
/// the same tpr. `smem` (kMaxWarps floats) must not be rewritten until every thread has passed the
/// next barrier: callers alternate two buffers.
/// Example: tpr = 8, lanes holding their lane id: lanes 0..7 get 28, lanes 8..15 get 92, ...
SGL_DEVICE float row_reduce_sum(float value, int tpr, int slot, float* smem) {
#pragma unroll
  for (int mask = device::kWarpThreads / 2; mask > 0; mask >>= 1) {
    if (mask < tpr) value += __shfl_xor_sync(0xffffffffu, value, mask);
  }
  if (tpr <= static_cast<int>(device::kWarpThreads)) return value;
  const uint32_t lane = threadIdx.x % device::kWarpThreads;
  const uint32_t warp = threadIdx.x / device::kWarpThreads;
  if (lane == 0) smem[warp] = value;
  __syncthreads();
  const int warps_per_row = tpr / static_cast<int>(device::kWarpThreads);
  value = static_cast<int>(lane) < warps_per_row ? smem[slot * warps_per_row + lane] : 0.0f;
  return device::warp::reduce_sum<float>(value);
}

/// The tensor a CTA serves (0, or 1 = k of qknorm) and its place among that tensor's CTAs.
struct CtaShare {
  int segment;
  int64_t first;   // first group of rows
  int64_t stride;  // CTAs serving the tensor
};

template <NormKind kKind>
SGL_DEVICE CtaShare cta_share(const NormParams& params) {
  if constexpr (kKind == NormKind::kQKNorm) {
    if (blockIdx.x >= params.rows0_ctas) {
      return {1, static_cast<int64_t>(blockIdx.x) - params.rows0_ctas, static_cast<int64_t>(gridDim.x) - params.rows0_ctas};
    }
    return {0, static_cast<int64_t>(blockIdx.x), params.rows0_ctas};
  }
  return {0, static_cast<int64_t>(blockIdx.x), static_cast<int64_t>(gridDim.x)};
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
    // 32-bit division when it fits (the common case); 64-bit otherwise.
    if (row <= std::numeric_limits<uint32_t>::max() && rows.num_heads <= std::numeric_limits<uint32_t>::max()) {
      token = static_cast<uint32_t>(row) / static_cast<uint32_t>(rows.num_heads);
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
template <typename T, int kVecN, NormKind kKind>
SGL_DEVICE void norm_rows_two_pass(const NormParams& params, float (*partials)[NormConfig::kMaxWarps]) {
  using vec_t = device::AlignedVector<T, kVecN>;
  constexpr int kMaxVecs = NormConfig::max_vecs(sizeof(vec_t));
  const CtaShare share = cta_share<kKind>(params);
  const NormRows& rows = params.rows[share.segment];
  const int tpr = params.threads_per_row;
  const int lane = static_cast<int>(threadIdx.x);
  const int chunk = tpr * kMaxVecs;
  int parity = 0;

  for (int64_t row = share.first; row < rows.num_rows; row += share.stride) {
    const RowPointers<T> ptrs = row_pointers<T, kKind>(rows, row);
    float sum = 0.0f;
    for (int base = lane; base < params.num_vecs; base += chunk) {
      vec_t x[kMaxVecs];
#pragma unroll
      for (int j = 0; j < kMaxVecs; ++j) {
        if (base + j * tpr < params.num_vecs) x[j].load(ptrs.input, base + j * tpr);
      }
      if constexpr (kKind == NormKind::kFusedAddRMSNorm) {
#pragma unroll
        for (int j = 0; j < kMaxVecs; ++j) {
          if (base + j * tpr < params.num_vecs) {
            vec_t r;
            r.load(ptrs.residual, base + j * tpr);
            x[j] = add_rounded(x[j], r);
            x[j].store(ptrs.residual, base + j * tpr);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < kMaxVecs; ++j) {
        if (base + j * tpr < params.num_vecs) sum += sum_squares(x[j]);
      }
    }
    const float total = row_reduce_sum(sum, tpr, 0, partials[parity]);
    parity ^= 1;
    if (row + share.stride >= rows.num_rows) device::pdl_launch_dependents();
    const float rstd = rsqrtf(total * params.inv_hidden_size + params.eps);

    const T* source = kKind == NormKind::kFusedAddRMSNorm ? ptrs.residual : ptrs.input;
    for (int base = lane; base < params.num_vecs; base += chunk) {
      vec_t x[kMaxVecs], w[kMaxVecs];
#pragma unroll
      for (int j = 0; j < kMaxVecs; ++j) {
        if (base + j * tpr < params.num_vecs) {
          x[j].load(source, base + j * tpr);
          w[j].load(rows.weight, base + j * tpr);
        }
      }
#pragma unroll
      for (int j = 0; j < kMaxVecs; ++j) {
        if (base + j * tpr < params.num_vecs) {
          normalize(x[j], w[j], rstd, params.weight_offset, params.cast_x_before_out_mul)
              .store(ptrs.out, base + j * tpr);
        }
      }
    }
  }
}

/// Register path: rows that fit kVecs vectors per thread. Thread t handles row slot t / tpr of
/// each group and the vectors (t % tpr) + j * tpr, j < kVecs, of that row: it loads them (and the
/// residual) with every load in flight before the first use, keeps them in registers through the
/// reduction, then scales and stores them. The weight of its columns is loaded once.
template <typename T, int kVecN, NormKind kKind, int kVecs>
SGL_DEVICE void norm_rows_in_registers(const NormParams& params, float (*partials)[NormConfig::kMaxWarps]) {
  using vec_t = device::AlignedVector<T, kVecN>;
  const CtaShare share = cta_share<kKind>(params);
  const NormRows& rows = params.rows[share.segment];
  const int tpr = params.threads_per_row;
  const int slot = static_cast<int>(threadIdx.x) / tpr;
  const int lane = static_cast<int>(threadIdx.x) - slot * tpr;

  vec_t weight[kVecs];
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (lane + j * tpr < params.num_vecs) weight[j].load(rows.weight, lane + j * tpr);
  }

  int parity = 0;
  for (int64_t group = share.first; group < rows.num_groups; group += share.stride) {
    const int64_t row = group * params.rows_per_cta + slot;
    const bool active = row < rows.num_rows;
    RowPointers<T> ptrs{};
    if (active) ptrs = row_pointers<T, kKind>(rows, row);
    bool valid[kVecs];  // this thread's vector j exists in this row
#pragma unroll
    for (int j = 0; j < kVecs; ++j) valid[j] = active && lane + j * tpr < params.num_vecs;

    vec_t x[kVecs];
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (valid[j]) x[j].load(ptrs.input, lane + j * tpr);
    }
    if constexpr (kKind == NormKind::kFusedAddRMSNorm) {
      vec_t r[kVecs];
#pragma unroll
      for (int j = 0; j < kVecs; ++j) {
        if (valid[j]) r[j].load(ptrs.residual, lane + j * tpr);
      }
#pragma unroll
      for (int j = 0; j < kVecs; ++j) {
        if (valid[j]) {
          x[j] = add_rounded(x[j], r[j]);
          x[j].store(ptrs.residual, lane + j * tpr);
        }
      }
    }
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (valid[j]) sum += sum_squares(x[j]);
    }

    const float total = row_reduce_sum(sum, tpr, slot, partials[parity]);
    parity ^= 1;
    // This CTA's last group: let the next kernel in the stream start launching (it still waits
    // for this whole grid to finish before it reads anything).
    if (group + share.stride >= rows.num_groups) device::pdl_launch_dependents();
    const float rstd = rsqrtf(total * params.inv_hidden_size + params.eps);

#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (valid[j]) {
        normalize(x[j], weight[j], rstd, params.weight_offset, params.cast_x_before_out_mul)
            .store(ptrs.out, lane + j * tpr);
      }
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
/// per thread; kVecs = 0: rows too long for registers, one per CTA, two passes.
template <typename T, int kVecN, NormKind kKind, int kVecs>
__global__ void __launch_bounds__(NormConfig::max_threads(kKind, kNormThreadBytes<T, kVecN, kVecs>))
    norm_rows_kernel(const NormParams params) {
  __shared__ float partials[2][NormConfig::kMaxWarps];  // two buffers: one barrier per row

  // Everything reads data the previous kernel may write (PDL: wait for it first).
  device::pdl_wait_primary();
  if constexpr (kVecs == 0) {
    norm_rows_two_pass<T, kVecN, kKind>(params, partials);
  } else {
    norm_rows_in_registers<T, kVecN, kKind, kVecs>(params, partials);
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
  int64_t blocks_per_sm = 0;    // > 0: at most this many resident CTAs per SM; < 0: one CTA per group
};

inline NormOverride& norm_override() {
  static NormOverride value;
  return value;
}

/// Rounds a thread count up to a valid TPR: a power of two up to 32, a multiple of 32 above.
inline int64_t round_threads_per_row(int64_t tpr) {
  constexpr int64_t kWarp = device::kWarpThreads;
  return tpr <= kWarp ? static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(std::max<int64_t>(tpr, 1))))
                      : host::div_ceil(tpr, kWarp) * kWarp;
}

inline NormGeometry make_geometry(int64_t tpr, int64_t k) {
  const int64_t rows = std::max<int64_t>(1, NormConfig::kBlockThreads / tpr);
  return {static_cast<int32_t>(tpr), static_cast<int32_t>(k), static_cast<int32_t>(rows),
          static_cast<uint32_t>(rows * tpr)};
}

/// Picks the geometry of a row of num_vecs vectors of vec_bytes bytes. Automatic: the fewest
/// vectors per thread k >= NormConfig::kTargetVecs (or the whole row if shorter) whose TPR =
/// round_threads_per_row(num_vecs / k) is at most kPreferredRowThreads, else the fewest whose TPR
/// fits the kind's CTA; the vectors per thread are then
/// trimmed to what that TPR needs (a power of two). Rows no k fits take two passes with the
/// largest CTA. (bf16, 16-byte vectors: H=128 -> 8 threads x 2, 32 rows per 256-thread CTA;
/// H=4096 -> 256 x 2; H=8192 -> 256 x 4; H=16384 -> 1024 x 2; H=32768 -> two passes, 512 threads.
/// qknorm, head_dim 128 -> 8 x 2, 32 heads per 256-thread CTA.)
inline NormGeometry choose_geometry(NormKind kind, int64_t num_vecs, int vec_bytes) {
  using host::div_ceil;
  const int max_vecs = NormConfig::max_vecs(vec_bytes);
  const NormOverride& forced = norm_override();
  if (forced.threads_per_row > 0) {
    const int64_t tpr = forced.threads_per_row;
    const int64_t k = forced.vecs_per_thread > 0
                          ? forced.vecs_per_thread
                          : static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(div_ceil(num_vecs, tpr))));
    host::RuntimeCheck(round_threads_per_row(tpr) == tpr && (k & (k - 1)) == 0 && k <= max_vecs &&
                           tpr <= NormConfig::max_threads(kind, static_cast<int>(k) * vec_bytes) && k * tpr >= num_vecs,
                       "norm geometry override: ", tpr, " threads x ", k, " vectors per thread cannot cover ",
                       num_vecs, " vectors of ", vec_bytes, " bytes");
    return make_geometry(tpr, k);
  }
  const int64_t first_k =
      std::min<int64_t>(NormConfig::kTargetVecs, static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(num_vecs))));
  // Two rounds: first the fewest vectors per thread that keep a row within kPreferredRowThreads
  // threads, then (rows that need more) the fewest that fit the kind's largest CTA.
  for (const bool preferred : {true, false}) {
    for (int64_t k = first_k; k <= max_vecs; k *= 2) {
      const int64_t tpr = round_threads_per_row(div_ceil(num_vecs, k));
      const int64_t limit = NormConfig::max_threads(kind, static_cast<int>(k) * vec_bytes);
      if (tpr <= (preferred ? std::min(limit, NormConfig::kPreferredRowThreads) : limit)) {
        return make_geometry(tpr,
                             static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(div_ceil(num_vecs, tpr)))));
      }
    }
  }
  const uint32_t threads = NormConfig::max_threads(kind, max_vecs * vec_bytes);
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

/// Launches norm_rows_kernel<T, kVecN, kKind, kVecs> on a persistent grid: as many CTAs as there
/// are groups of rows, at most SMs x resident CTAs per SM. qknorm gives q and k shares of the
/// grid in proportion to their groups (each CTA then caches one weight), at least one each.
template <typename T, int kVecN, NormKind kKind, int kVecs>
void launch_norm_kernel(NormParams params, const NormGeometry& geometry, DLDevice device, bool pdl) {
  constexpr auto kKernel = norm_rows_kernel<T, kVecN, kKind, kVecs>;
  const int64_t groups0 = params.rows[0].num_groups;
  const int64_t groups1 = kKind == NormKind::kQKNorm ? params.rows[1].num_groups : 0;
  const int64_t groups = groups0 + groups1;
  int64_t blocks_per_sm = cached_blocks_per_sm<kKernel>(geometry.block_threads);
  // The fused add moves twice the bytes per row: one CTA per group (no persistence) keeps more
  // rows in flight and measured 94.8% / 96.8% of copy at [16384, 4096 / 8192] vs 89.7% / 90.6%.
  int64_t forced = norm_override().blocks_per_sm;
  if (forced == 0 && kKind == NormKind::kFusedAddRMSNorm) forced = -1;
  if (forced != 0) blocks_per_sm = forced > 0 ? std::min(blocks_per_sm, forced) : groups;
  const int64_t resident = int64_t{host::runtime::get_sm_count(device.device_id)} * blocks_per_sm;
  int64_t grid = std::min({groups, resident, int64_t{1} << 30});
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

/// Chooses the geometry for kVecN-wide vectors, fills it into `params` and launches the kernel of
/// its vectors-per-thread bucket.
template <typename T, int kVecN, NormKind kKind>
void launch_norm_rows(NormParams params, int64_t hidden_size, DLDevice device, bool pdl) {
  constexpr int kMaxVecs = NormConfig::max_vecs(kVecN * sizeof(T));
  const int64_t num_vecs = hidden_size / kVecN;
  const NormGeometry geometry = choose_geometry(kKind, num_vecs, kVecN * sizeof(T));
  params.num_vecs = static_cast<int32_t>(num_vecs);
  params.threads_per_row = geometry.threads_per_row;
  params.rows_per_cta = geometry.rows_per_cta;
  for (NormRows& rows : params.rows) rows.num_groups = host::div_ceil(rows.num_rows, int64_t{geometry.rows_per_cta});
  switch (geometry.vecs_per_thread) {
    case 0: return launch_norm_kernel<T, kVecN, kKind, 0>(params, geometry, device, pdl);
    case 1: return launch_norm_kernel<T, kVecN, kKind, 1>(params, geometry, device, pdl);
    case 2: return launch_norm_kernel<T, kVecN, kKind, 2>(params, geometry, device, pdl);
    case 4:
      if constexpr (kMaxVecs >= 4) return launch_norm_kernel<T, kVecN, kKind, 4>(params, geometry, device, pdl);
      [[fallthrough]];
    default:
      if constexpr (kMaxVecs >= 8) return launch_norm_kernel<T, kVecN, kKind, 8>(params, geometry, device, pdl);
      host::Panic("norm: unexpected vectors per thread ", geometry.vecs_per_thread);
  }
}

/// Launches with the widest vector `vec_bytes` allows (16 / 8 / 4 / 2 bytes).
template <typename T, NormKind kKind>
void launch_norm_rows_any_width(const NormParams& params, int64_t hidden_size, int64_t vec_bytes, DLDevice device,
                                bool pdl) {
  switch (vec_bytes) {
    case 16: return launch_norm_rows<T, 16 / sizeof(T), kKind>(params, hidden_size, device, pdl);
    case 8: return launch_norm_rows<T, 8 / sizeof(T), kKind>(params, hidden_size, device, pdl);
    default:
      if constexpr (sizeof(T) <= 2) {
        if (vec_bytes == 4) return launch_norm_rows<T, 4 / sizeof(T), kKind>(params, hidden_size, device, pdl);
        return launch_norm_rows<T, 1, kKind>(params, hidden_size, device, pdl);
      } else {
        return launch_norm_rows<T, 1, kKind>(params, hidden_size, device, pdl);
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
  host::RuntimeCheck(view.size(last) <= 1 || view.stride(last) == 1, op, ": ", name,
                     " must be contiguous in its last dimension, got stride ", view.stride(last));
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
void rmsnorm(tvm::ffi::TensorView out, tvm::ffi::TensorView input, tvm::ffi::TensorView weight, double eps,
             double weight_offset, bool cast_x_before_out_mul, int64_t enable_pdl) {
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
      .input_token_stride = input.stride(0),
      .input_head_stride = 0,
      .out_token_stride = out.stride(0),
      .out_head_stride = 0,
      .residual_token_stride = 0,
  };
  params.eps = static_cast<float>(eps);
  params.inv_hidden_size = static_cast<float>(1.0 / static_cast<double>(h));
  params.weight_offset = static_cast<float>(weight_offset);
  params.cast_x_before_out_mul = cast_x_before_out_mul;
  const uint64_t row_bytes = n > 1 ? static_cast<uint64_t>(input.stride(0) | out.stride(0)) * sizeof(T) : 0;
  const int64_t vec_bytes = widest_vector_bytes<T>({address_of(params.rows[0].input), address_of(params.rows[0].out),
                                                    address_of(params.rows[0].weight), row_bytes,
                                                    static_cast<uint64_t>(h) * sizeof(T)});

  // Launch
  launch_norm_rows_any_width<T, NormKind::kRMSNorm>(params, h, vec_bytes, device, resolve_pdl(enable_pdl, device));
}

/// Benchmark hook: forces the geometry of every later norm launch of this module (all three ops)
/// until called again with zeros. threads_per_row (a power of two <= 32 or a multiple of 32) and
/// vecs_per_thread (1/2/4/8, 0 = as needed) must cover the row or the launch throws;
/// blocks_per_sm > 0 caps resident CTAs per SM, < 0 launches one CTA per group of rows.
inline void set_norm_geometry_override(int64_t threads_per_row, int64_t vecs_per_thread, int64_t blocks_per_sm) {
  norm_override() = NormOverride{threads_per_row, vecs_per_thread, blocks_per_sm};
}

}  // namespace
