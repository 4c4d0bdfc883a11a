// RMSNorm over the last dimension, row by row, out of place or in place:
//
//   out[r, :] = round(x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * (w + weight_offset))
//
// fp32 arithmetic, one rounding to the dtype; weight_offset = 1 gives Gemma's (1 + w) (gemma_rmsnorm).
// With cast_x_before_out_mul the normalised x is rounded to the dtype first and then multiplied by
// the weight, Hugging Face's order (rmsnorm_hf): out = round(float(round(x * rstd)) * w). Both are
// runtime parameters of the same kernels, so rmsnorm, gemma_rmsnorm and rmsnorm_hf share one build.
//
// The file is the library's worked example of a row kernel:
//   - the launcher (rmsnorm, at the end) validates the tensors with TensorMatcher (shapes, dtype and
//     device in one pass, errors naming the tensor; strides are taken as they come and checked
//     after it: last dim contiguous, no aliasing between out and the inputs), unwraps the symbolic
//     sizes, fills the kernel's parameters and launches with host::LaunchKernel (PDL on Hopper:
//     the kernel's side of it is pdl_wait_then_release, device::pdl_wait_primary then
//     device::pdl_launch_dependents);
//   - the kernel (rmsnorm_kernel) addresses each row with device::tile::Memory: the TPR threads of
//     a row (threads_per_row) each own vectors lane, lane + TPR, lane + 2 * TPR, ... of it, 16
//     bytes wide when the pointers and row strides allow it. The register path loads x and stores
//     out through RowAccess at mem.index(j) (plain or L2-hinted accesses); the two-pass path is the
//     plain tile::Memory loop (in_bound, load, store).
//
// Layout of the work. TPR threads share a row and a CTA holds blockDim.x / TPR rows, one CTA per
// group of rows. Each thread keeps its kVecs vectors of x in registers between the sum of squares
// and the scaling, so x is read from DRAM once; the sum is reduced by shuffles inside the row's
// lanes (TPR <= 32) or through shared memory (row_reduce_sum). Rows longer than the registers hold
// (kVecs = 0) take one CTA each and two passes: the sum of squares, then a re-read (an L2 hit) to
// scale and store. The geometry (TPR, kVecs) is choose_geometry's of norm_rows.cuh, shared with
// the other norm ops: on the 16-byte rows it takes, rmsnorm_quant (norm_quant.cuh) reduces in the
// same order and gets rmsnorm's rstd bit for bit. bf16, 16-byte vectors: H = 4096 -> 256 threads x
// 2 vectors; H = 128 -> 8 x 2 (32 rows per CTA) when the groups fill the SMs, 16 x 1 when they do
// not (decode); H = 32768 -> two passes of 512 threads. Large launches in place on the register
// path (out = x, at least 1 MiB of rows, 16-byte vectors) load x evict_last and store
// evict_normal (RowAccess of norm_rows.cuh): the L2 then writes the dirty lines back first and
// DRAM keeps a copy's rate.
//
// The row math and geometry come from norm_rows.cuh, the engine of the fused add and qk-norm, so
// that every norm op sums and scales a row alike: choose_geometry, NormConfig's register budgets
// (__launch_bounds__), RowAccess, sum_squares / sum_squares_all, row_reduce_sum, row_scale and
// normalize, and the launch helpers (check_last_dim_contiguous, check_norm_scalars,
// widest_vector_bytes, use_l2_hint, resolve_pdl). The kernel itself is this file's.
//
// Bytes moved: 2 * num_tokens * hidden_size * sizeof(T) + hidden_size * sizeof(T).
#pragma once

// For TensorMatcher, SymbolicSize, SymbolicDevice, kAnySize, data_ptr, verify_no_self_overlap,
// verify_no_partial_overlap
#include <sgl_kernel/tensor.h>
#include <sgl_kernel/utils.h>  // For RuntimeCheck, Panic, div_ceil

#include <sgl_kernel/runtime.cuh>  // For runtime::get_sm_count
#include <sgl_kernel/tile.cuh>     // For tile::Memory
#include <sgl_kernel/type.cuh>     // For device::cast
#include <sgl_kernel/utils.cuh>    // For LaunchKernel
#include <sgl_kernel/vec.cuh>      // For AlignedVector

#include <bit>
#include <cstdint>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include "norm_rows.cuh"  // The shared row math and geometry (listed above)

namespace {

/// Kernel arguments of rmsnorm_kernel. Strides in elements; the last dim is contiguous.
struct RMSNormParams {
  const void* input;           // [num_rows, hidden_size]
  void* out;                   // [num_rows, hidden_size]; may be input
  const void* weight;          // [hidden_size]
  int64_t num_rows;            // num_tokens
  int64_t input_stride;        // elements between rows of input
  int64_t out_stride;          // elements between rows of out
  int32_t num_vecs;            // vectors per row: hidden_size / kVecN
  int32_t threads_per_row;     // TPR: a power of two <= 32, or a multiple of 32; divides blockDim.x
  int32_t tpr_shift;           // log2(TPR) when TPR is a power of two, else -1
  int32_t rows_per_cta;        // blockDim.x / TPR
  float inv_hidden_size;       // 1 / hidden_size
  float eps;                   // added to the mean square
  float weight_offset;         // 0 (RMSNorm) or 1 (Gemma: w + 1)
  bool cast_x_before_out_mul;  // round x * rstd to T before the weight multiply (rmsnorm_hf)
  bool packed_weight_mul;      // with it (fp16 / bf16, weight_offset 0): one packed multiply per pair
};

/// Rows of params.num_vecs vectors of kVecN elements of T. Block: rows_per_cta * TPR threads;
/// grid: div_ceil(num_rows, rows_per_cta). kVecs > 0: each thread holds kVecs vectors of its row
/// in registers (kWide: the build for CTAs of more than NormConfig::kBlockThreads threads); kVecs =
/// 0: one row per CTA, two passes. __launch_bounds__ caps the registers at what keeps the
/// occupancy these kernels live on (NormConfig::narrow_min_blocks). kL2Hint (register path only):
/// x loaded evict_last and out stored evict_normal (RowAccess of norm_rows.cuh), for large
/// launches in place, where it lets the L2 write the dirty lines back first.
template <typename T, int kVecN, int kVecs, bool kWide, bool kL2Hint>
__global__ void __launch_bounds__(
    NormConfig::bound_threads(NormKind::kRMSNorm, kNormThreadBytes<T, kVecN, kVecs>, kVecs == 0, kWide, kVecs),
    NormConfig::bound_blocks(NormKind::kRMSNorm, kNormThreadBytes<T, kVecN, kVecs>, kVecs == 0, kWide, kVecs))
    rmsnorm_kernel(const RMSNormParams params) {
  using vec_t = device::AlignedVector<T, kVecN>;
  // Warp partial sums of row_reduce_sum. One buffer suffices because a CTA reduces once (one row
  // group per CTA); a kernel looping over groups would alternate two (its contract: every thread of
  // the CTA calls it, inactive rows too, since it may hold a __syncthreads).
  __shared__ alignas(16) float partials[NormConfig::kMaxWarps];

  // This thread's row (slot) in the CTA's group and its place (lane) among the row's threads.
  const int tpr = params.threads_per_row;
  const int tid = static_cast<int>(threadIdx.x);
  const int slot = params.rows_per_cta == 1 ? 0 : (params.tpr_shift >= 0 ? tid >> params.tpr_shift : tid / tpr);
  const int lane = tid - slot * tpr;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * params.rows_per_cta + slot;
  const bool active = row < params.num_rows;
  // Up to two vectors per thread (decode rows among them): straight-line code (see below).
  constexpr bool kStraight = kVecs > 0 && kVecs <= 2;
  // The row pointers. The straight builds compute them under `active`: the branch keeps the
  // arithmetic ahead of the PDL wait below (ptxas otherwise sinks it past the wait, onto the
  // decode critical path); the other builds unconditionally (under the branch one spills).
  const T* x_row = nullptr;
  T* out_row = nullptr;
  if (!kStraight || active) {
    x_row = static_cast<const T*>(params.input) + row * params.input_stride;
    out_row = static_cast<T*>(params.out) + row * params.out_stride;
  }
  // Vector `offset` of this thread is vector lane + offset * TPR of the row.
  const auto mem = device::tile::Memory<vec_t>(lane, tpr);
  const RowAccess<kL2Hint> access = RowAccess<kL2Hint>::make();  // x and out: plain or L2-hinted

  if constexpr (kVecs > 0) {
    // Register path. Up to two vectors per thread, vectors past the row stay zero and the sum runs
    // unpredicated (straight-line code); more keep the arithmetic under `valid`, whose zeros would
    // hold registers those builds do not have.
    // PDL: x may be the previous kernel's output. Wait for it right before the first load and let
    // the next kernel start launching at once. Up to two vectors (decode rows) compute which
    // vectors they hold before the wait, overlapping the previous kernel's tail; more compute it
    // after (their flags would hold registers across the wait and spill).
    if constexpr (!kStraight) pdl_wait_then_release();
    bool valid[kVecs];
    vec_t x[kVecs], w[kVecs];
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      valid[j] = active && mem.in_bound(params.num_vecs, j);
      if constexpr (kStraight) x[j].fill(device::cast<T>(0.0f));
    }
    if constexpr (kStraight) pdl_wait_then_release();
    // Every load in flight before the first use: x, then the weight.
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (valid[j]) access.load(x[j], x_row, mem.index(j));
    }
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (valid[j]) w[j] = mem.load(params.weight, j);
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
    const float total = row_reduce_sum(sum, tpr, slot, partials);
    const RowScale scale = row_scale(rsqrtf(total * params.inv_hidden_size + params.eps), params.weight_offset);
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (valid[j]) {
        const vec_t y =
            normalize(x[j], w[j], scale, params.weight_offset, params.cast_x_before_out_mul, params.packed_weight_mul);
        access.store(y, out_row, mem.index(j));
      }
    }
  } else {
    // Two passes over chunks of kChunk vectors per thread (one row per CTA, TPR = blockDim.x).
    pdl_wait_then_release();
    constexpr int kChunk = NormConfig::max_vecs(sizeof(vec_t));
    float sum = 0.0f;
    for (int base = 0; mem.in_bound(params.num_vecs, base); base += kChunk) {
      vec_t x[kChunk];
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        if (mem.in_bound(params.num_vecs, base + j)) x[j] = mem.load(x_row, base + j);
      }
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        if (mem.in_bound(params.num_vecs, base + j)) sum += sum_squares(x[j]);
      }
    }
    const float total = row_reduce_sum(sum, tpr, 0, partials);
    const RowScale scale = row_scale(rsqrtf(total * params.inv_hidden_size + params.eps), params.weight_offset);
    for (int base = 0; mem.in_bound(params.num_vecs, base); base += kChunk) {
      vec_t x[kChunk], w[kChunk];
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        if (mem.in_bound(params.num_vecs, base + j)) {
          x[j] = mem.load(x_row, base + j);
          w[j] = mem.load(params.weight, base + j);
        }
      }
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        if (mem.in_bound(params.num_vecs, base + j)) {
          const vec_t y = normalize(
              x[j], w[j], scale, params.weight_offset, params.cast_x_before_out_mul, params.packed_weight_mul);
          mem.store(out_row, y, base + j);
        }
      }
    }
  }
}

/// Launches the build of rmsnorm_kernel with kVecs vectors per thread: the wide one for CTAs of
/// more than NormConfig::kBlockThreads threads (a 1024-thread register budget), one CTA per group.
/// Wide builds exist only where choose_geometry asks for them: rows too long for 256 threads at
/// max_vecs vectors each, which its second round gives the fewest vectors that fit the wide
/// budget, always more than a quarter of max_vecs (16-byte vectors: 2, narrower: 4 or 8).
template <typename T, int kVecN, int kVecs, bool kL2Hint>
void launch_rmsnorm_build(const RMSNormParams& params, const NormGeometry& geometry, DLDevice device, bool pdl) {
  constexpr int kBytes = kNormThreadBytes<T, kVecN, kVecs>;
  constexpr bool kHasWide =
      kVecs > 0 && 4 * kVecs > NormConfig::max_vecs(kVecN * sizeof(T)) &&
      NormConfig::max_threads(NormKind::kRMSNorm, kBytes, false, kVecs) > NormConfig::kBlockThreads;
  auto kernel = rmsnorm_kernel<T, kVecN, kVecs, false, kL2Hint>;
  bool wide = false;
  if constexpr (kHasWide) {
    wide = geometry.block_threads > NormConfig::kBlockThreads;
    if (wide) kernel = rmsnorm_kernel<T, kVecN, kVecs, true, kL2Hint>;
  }
  const uint32_t bound = NormConfig::bound_threads(NormKind::kRMSNorm, kBytes, kVecs == 0, wide, kVecs);
  host::RuntimeCheck(
      geometry.block_threads <= bound, "rmsnorm: no build for CTAs of ", geometry.block_threads, " threads");
  const int64_t num_ctas = host::div_ceil(params.num_rows, int64_t{geometry.rows_per_cta});
  // Out has a row of memory for each token, so the CTAs stay far below the grid limit.
  host::RuntimeCheck(num_ctas < (int64_t{1} << 31), "rmsnorm: too many rows: ", params.num_rows);
  host::LaunchKernel(static_cast<uint32_t>(num_ctas), geometry.block_threads, device).enable_pdl(pdl)(kernel, params);
}

/// Launches the build of the geometry's vectors per thread.
template <typename T, int kVecN, bool kL2Hint>
void launch_rmsnorm_vecs(const RMSNormParams& params, const NormGeometry& geometry, DLDevice device, bool pdl) {
  constexpr int kMaxVecs = NormConfig::max_vecs(kVecN * sizeof(T));
  switch (geometry.vecs_per_thread) {
    case 1:
      return launch_rmsnorm_build<T, kVecN, 1, kL2Hint>(params, geometry, device, pdl);
    case 2:
      return launch_rmsnorm_build<T, kVecN, 2, kL2Hint>(params, geometry, device, pdl);
    case 4:
      if constexpr (kMaxVecs >= 4) return launch_rmsnorm_build<T, kVecN, 4, kL2Hint>(params, geometry, device, pdl);
      [[fallthrough]];
    default:
      if constexpr (kMaxVecs >= 8) return launch_rmsnorm_build<T, kVecN, 8, kL2Hint>(params, geometry, device, pdl);
      host::Panic("rmsnorm: unexpected vectors per thread ", geometry.vecs_per_thread);
  }
}

/// Launches rmsnorm_kernel for vectors of kVecN elements with the geometry of choose_geometry:
/// rows too long for registers take the two-pass build; in-place launches with 16-byte vectors and
/// at least NormConfig::kL2HintMinBytes of rows the L2-hinted builds (use_l2_hint).
template <typename T, int kVecN>
void launch_rmsnorm(RMSNormParams params, int64_t hidden_size, DLDevice device, bool pdl, bool in_place) {
  const NormGeometry geometry = choose_geometry(
      NormKind::kRMSNorm,
      hidden_size / kVecN,
      kVecN * sizeof(T),
      params.num_rows,
      host::runtime::get_sm_count(device.device_id));
  params.num_vecs = static_cast<int32_t>(hidden_size / kVecN);
  params.threads_per_row = geometry.threads_per_row;
  params.rows_per_cta = geometry.rows_per_cta;
  const auto tpr = static_cast<uint64_t>(geometry.threads_per_row);
  params.tpr_shift = std::has_single_bit(tpr) ? std::countr_zero(tpr) : -1;
  params.inv_hidden_size = static_cast<float>(1.0 / static_cast<double>(hidden_size));

  if (geometry.vecs_per_thread == 0) return launch_rmsnorm_build<T, kVecN, 0, false>(params, geometry, device, pdl);
  if constexpr (kVecN * sizeof(T) == 16) {
    if (use_l2_hint(in_place, params.num_rows * hidden_size * static_cast<int64_t>(sizeof(T)))) {
      return launch_rmsnorm_vecs<T, kVecN, true>(params, geometry, device, pdl);
    }
  }
  launch_rmsnorm_vecs<T, kVecN, false>(params, geometry, device, pdl);
}

/// out = input * rsqrt(mean(input^2) + eps) * (weight + weight_offset), row by row.
/// input, out: [num_tokens, hidden_size] of T on one CUDA device, last dim contiguous, any row
/// strides (out may be input); weight: [hidden_size], contiguous. enable_pdl: 1 / 0 / -1 (auto).
/// T = fp16_t | bf16_t | fp32_t. Empty inputs return without a launch. Throws PanicError (Python
/// RuntimeError) naming the tensor on any mismatch.
/// kWidths: the vector widths this module builds (NormWidths): kWide the 16-byte vectors, kNarrow
/// the 8 / 4 / 2-byte ones. Returns true once launched (or for empty inputs); false, launching
/// nothing, for rows a kWide module does not take.
template <typename T, NormWidths kWidths>
bool rmsnorm(
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
  if (n == 0 || h == 0) return true;

  // Configure
  RMSNormParams params{};
  params.input = data_ptr<const void>(input);
  params.out = data_ptr(out);
  params.weight = data_ptr<const void>(weight);
  params.num_rows = n;
  params.input_stride = input.stride(0);
  params.out_stride = out.stride(0);
  params.eps = static_cast<float>(eps);
  params.weight_offset = static_cast<float>(weight_offset);
  params.cast_x_before_out_mul = cast_x_before_out_mul;
  // Hugging Face's order in fp16 / bf16: the weight multiply as one packed multiply per pair (normalize).
  params.packed_weight_mul = cast_x_before_out_mul && weight_offset == 0.0 && sizeof(T) == 2;
  // The widest vector every pointer, row stride and the row length allow.
  const uint64_t row_bytes = n > 1 ? static_cast<uint64_t>(input.stride(0) | out.stride(0)) * sizeof(T) : 0;
  const int64_t vec_bytes = widest_vector_bytes<T>(
      {address_of(params.input),
       address_of(params.out),
       address_of(params.weight),
       row_bytes,
       static_cast<uint64_t>(h) * sizeof(T)});

  // Launch
  const bool pdl = resolve_pdl(enable_pdl, device);
  const bool in_place = params.out == params.input;
  if constexpr (kWidths == NormWidths::kWide) {
    if (vec_bytes < 16) return false;
    launch_rmsnorm<T, 16 / sizeof(T)>(params, h, device, pdl, in_place);
  } else if (vec_bytes >= 8) {
    launch_rmsnorm<T, 8 / sizeof(T)>(params, h, device, pdl, in_place);
  } else if (sizeof(T) == 2 && vec_bytes == 4) {
    launch_rmsnorm<T, 2>(params, h, device, pdl, in_place);
  } else {
    launch_rmsnorm<T, 1>(params, h, device, pdl, in_place);
  }
  return true;
}

}  // namespace
