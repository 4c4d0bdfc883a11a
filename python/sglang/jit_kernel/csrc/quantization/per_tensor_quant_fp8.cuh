// per_tensor_quant_fp8: one scale for the whole tensor. Dynamic: output_s = max(output_s,
// max(max|x|, eps) / 448) (the caller zeroes output_s first), or with accumulate false output_s =
// max(max|x|, eps) / 448 (no zeroing needed: the single pass overwrites it, the two-pass path resets it
// in a one-thread kernel first), then q = clamp(x / s, -448, 448) in fp8 e4m3; static: q from the
// given output_s (floored at FLT_MIN). Arithmetic: quantize_8bit.cuh.
//
// The input is [num_rows, num_cols] rows (the wrapper passes a contiguous tensor as one row):
//   - small dynamic inputs (one row of at most kFusedMaxThreads * kVecsPerThread chunks): one block
//     reads the row into registers, reduces, writes scale and bytes: a single pass, one launch;
//   - otherwise two launches: absmax over a grid of at most one block per SM that strides over
//     tiles of kAbsmaxItems chunks per thread (all loads of a tile in flight, then the maximum) and
//     max-reduces its block maximum into output_s with one atomic per block: every atomic on the one
//     address is serialized in L2, so their count, not the bytes, bounded a grid of a block per 512
//     chunks; then quantize over a grid of (chunk blocks of a row, rows), walking the blocks in
//     reverse order, so it starts on the input the first pass read last, which is still in L2, and
//     (aligned rows) loading each block's first row before its PDL wait, under the absmax pass;
//   - opt-in single passes past the one-block size, the same bits: one 8-CTA cluster
//     (SGLANG_PER_TENSOR_CLUSTER=1), or a cooperative grid of co-resident blocks with a grid barrier
//     between the maximum and the bytes (SGLANG_PER_TENSOR_GRID=1).
// 64-bit offsets, any row strides. Every kernel but the cooperative grid pass is launched with PDL
// and waits for the previous kernel (the quantize pass for the absmax pass) before its first access
// (but the quantize pass's early input loads, which the absmax pass's own wait makes safe).
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, SymbolicSize, SymbolicDevice, data_ptr
#include <sgl_kernel/utils.h>   // For div_ceil

#include <sgl_kernel/atomic.cuh>   // For atomic::fmax
#include <sgl_kernel/cta.cuh>      // For cta::reduce_max
#include <sgl_kernel/runtime.cuh>  // For runtime::get_sm_count
#include <sgl_kernel/utils.cuh>    // For LaunchKernel, SGL_DEVICE, kWarpThreads, fp8_e4m3_t, pdl_wait_primary

#include <algorithm>
#include <array>
#include <atomic>
#include <cfloat>
#include <cooperative_groups.h>
#include <cstdint>
#include <cstdlib>
#include <dlpack/dlpack.h>
#include <string_view>
#include <tvm/ffi/container/tensor.h>

#include "quantize_8bit.cuh"  // For quant::Chunk, load_row_chunk, store_row_chunk, block_scale, quantize_chunk

namespace {

/// Kernel arguments of per_tensor_quant_fp8. Strides in elements of their own tensor.
struct TensorQuantParams {
  const void* input;         // [num_rows, num_cols], row stride input_row_stride
  void* output_q;            // fp8 [num_rows, num_cols], row stride q_row_stride
  float* output_s;           // [1]: the scale (dynamic: max-reduced into; static: read)
  int64_t num_rows;          // rows
  int64_t num_cols;          // elements per row
  int64_t input_row_stride;  // elements of TIn
  int64_t q_row_stride;      // bytes (fp8)
  int64_t tiles_per_row;     // absmax: ceil(chunks per row / (blockDim.x * kAbsmaxItems))
  float eps;                 // floor of the tensor maximum (dynamic)
  bool reverse;              // quantize: walk the blocks in reverse order
  bool accumulate;           // dynamic: max with the value already in output_s (else overwrite it)
};

/// Launch facts: a block of kThreads threads covers kThreads * kVecsPerThread chunks of a row; the
/// single-pass block has up to kFusedMaxThreads threads.
struct TensorQuantConfig {
  static constexpr uint32_t kThreads = 256;
  static constexpr int kVecsPerThread = 2;
  static constexpr int64_t kFusedMaxThreads = 1024;
  static constexpr int64_t kMaxRowBlocks = 65535;       // gridDim.y limit; rows past it are looped over
  static constexpr uint32_t kAbsmaxThreads = 1024;      // absmax: a block per SM at most
  static constexpr uint32_t kAbsmaxSmallThreads = 256;  // absmax blocks when fewer than one per SM
  static constexpr int kAbsmaxItems = 8;                // absmax: 128 bytes in flight per thread
  static constexpr uint32_t kClusterSize = 8;           // cluster pass: CTAs per cluster (portable max)
  static constexpr uint32_t kClusterThreads = 1024;     // cluster pass: threads per CTA (at most)
  static constexpr int kClusterVecs = 4;                // cluster pass: chunks in registers per thread
  static constexpr uint32_t kGridThreads = 1024;        // grid pass: threads per block (at most)
  static constexpr int kGridVecs = 4;                   // grid pass: chunks in registers per thread
};

/// Loads this thread's kVecs chunks (chunk first + c * blockDim.x) of a row; returns their |x| max.
template <int kVecs, typename TIn, int kVecN, bool kAligned>
SGL_DEVICE float load_chunks(
    device::quant::Chunk<TIn, kVecN, kAligned> (&x)[kVecs],
    const TIn* src,
    int64_t first,
    int64_t num_chunks,
    int64_t num_cols) {
#pragma unroll
  for (int c = 0; c < kVecs; ++c) {
    const int64_t index = first + int64_t{c} * blockDim.x;
    if (index < num_chunks) device::quant::load_row_chunk(x[c], src, index, num_cols);
  }
  float amax = 0.0f;
#pragma unroll
  for (int c = 0; c < kVecs; ++c) {
    if (first + int64_t{c} * blockDim.x < num_chunks) amax = device::quant::chunk_absmax(x[c], amax);
  }
  return amax;
}

/// Quantizes chunk x, chunk `index` of its row, and stores it at the same place of row dst.
template <typename TIn, int kVecN, bool kAligned>
SGL_DEVICE void store_quantized_chunk(
    const device::quant::Chunk<TIn, kVecN, kAligned>& x,
    fp8_e4m3_t* dst,
    int64_t index,
    int64_t num_cols,
    float inv_scale) {
  constexpr float kQMax = device::quant::kTypeMax<fp8_e4m3_t>;
  // -448..448 are the conversion's own saturation bounds: no clamp (quantize_values)
  const auto q = device::quant::quantize_chunk<fp8_e4m3_t, /*kClamp=*/false>(x, inv_scale, -kQMax, kQMax);
  device::quant::store_row_chunk(q, dst, index, num_cols);
}

/// Quantizes and stores the chunks load_chunks read.
template <int kVecs, typename TIn, int kVecN, bool kAligned>
SGL_DEVICE void store_chunks(
    const device::quant::Chunk<TIn, kVecN, kAligned> (&x)[kVecs],
    fp8_e4m3_t* dst,
    int64_t first,
    int64_t num_chunks,
    int64_t num_cols,
    float inv_scale) {
#pragma unroll
  for (int c = 0; c < kVecs; ++c) {
    const int64_t index = first + int64_t{c} * blockDim.x;
    if (index < num_chunks) store_quantized_chunk(x[c], dst, index, num_cols, inv_scale);
  }
}

/// The reciprocal of a stored scale, floored so that 0 or NaN never gives inf * 0.
SGL_DEVICE float inverse_scale(float scale) { return __fdiv_rn(1.0f, fminf(fmaxf(scale, FLT_MIN), FLT_MAX)); }

/// This thread's chunks in the cluster and grid passes, which read the [num_rows, chunks_per_row]
/// chunks of p.input as one row-major sequence whatever the rows: block b holds [b * n, (b + 1) * n)
/// (n = blockDim.x * kVecs), chunk first + c * blockDim.x in register slot c, so each load instruction
/// reads blockDim.x consecutive chunks of a row. 32-bit: the callers' capacity bounds num_chunks
/// (host-checked).
struct FlatChunks {
  uint32_t chunks_per_row;  // chunks of 16 bytes (or fewer elements at a row's end) in a row
  uint32_t num_chunks;      // num_rows * chunks_per_row
  uint32_t first;           // this thread's first chunk
};

/// The FlatChunks of thread `thread` of block `block`, kVecs chunks of kVecN elements a thread.
template <int kVecs, int kVecN>
SGL_DEVICE FlatChunks flat_chunks(const TensorQuantParams& p, uint32_t block, uint32_t thread) {
  const auto chunks_per_row = static_cast<uint32_t>((p.num_cols + kVecN - 1) / kVecN);
  return {chunks_per_row, static_cast<uint32_t>(p.num_rows) * chunks_per_row, block * blockDim.x * kVecs + thread};
}

/// Loads this thread's chunks of `at` (those below at.num_chunks) into x; returns their |x| max.
template <int kVecs, typename TIn, int kVecN, bool kAligned>
SGL_DEVICE float load_flat_chunks(
    device::quant::Chunk<TIn, kVecN, kAligned> (&x)[kVecs], const TensorQuantParams& p, const FlatChunks& at) {
#pragma unroll
  for (int c = 0; c < kVecs; ++c) {
    const uint32_t chunk = at.first + c * blockDim.x;
    if (chunk < at.num_chunks) {
      const uint32_t row = chunk / at.chunks_per_row;
      const auto* src = static_cast<const TIn*>(p.input) + int64_t{row} * p.input_row_stride;
      device::quant::load_row_chunk(x[c], src, chunk - row * at.chunks_per_row, p.num_cols);
    }
  }
  float amax = 0.0f;
#pragma unroll
  for (int c = 0; c < kVecs; ++c) {
    if (at.first + c * blockDim.x < at.num_chunks) amax = device::quant::chunk_absmax(x[c], amax);
  }
  return amax;
}

/// Quantizes and stores the chunks load_flat_chunks read, each in its row of p.output_q.
template <int kVecs, typename TIn, int kVecN, bool kAligned>
SGL_DEVICE void store_flat_chunks(
    const device::quant::Chunk<TIn, kVecN, kAligned> (&x)[kVecs],
    const TensorQuantParams& p,
    const FlatChunks& at,
    float inv_scale) {
  auto* dst = static_cast<fp8_e4m3_t*>(p.output_q);
#pragma unroll
  for (int c = 0; c < kVecs; ++c) {
    const uint32_t chunk = at.first + c * blockDim.x;
    if (chunk < at.num_chunks) {
      const uint32_t row = chunk / at.chunks_per_row;
      store_quantized_chunk(
          x[c], dst + int64_t{row} * p.q_row_stride, chunk - row * at.chunks_per_row, p.num_cols, inv_scale);
    }
  }
}

/// Single pass: one block (1 row, all chunks in registers) -> scale and bytes.
template <typename TIn, bool kAligned>
__global__ void __launch_bounds__(TensorQuantConfig::kFusedMaxThreads)
    per_tensor_quant_fp8_fused_kernel(const TensorQuantParams p) {
  constexpr int kVecN = 16 / sizeof(TIn);
  constexpr int kVecs = TensorQuantConfig::kVecsPerThread;
  __shared__ float smem[TensorQuantConfig::kFusedMaxThreads / device::kWarpThreads];
  const int64_t num_chunks = (p.num_cols + kVecN - 1) / kVecN;
  device::quant::Chunk<TIn, kVecN, kAligned> x[kVecs];
  const auto* src = static_cast<const TIn*>(p.input);
  device::pdl_wait_primary();  // the input, and output_s zeroed by the caller, may be earlier kernels' work
  device::pdl_launch_dependents();
  // With accumulate the old scale is loaded beside the input (one round trip, not one after the reduction)
  const float prior = p.accumulate ? *p.output_s : 0.0f;
  const float amax = load_chunks<kVecs>(x, src, threadIdx.x, num_chunks, p.num_cols);
  device::cta::reduce_max(amax, smem, 0.0f);
  __syncthreads();
  const float scale =
      fmaxf(device::quant::block_scale(smem[0], p.eps, device::quant::kTypeMax<fp8_e4m3_t>, false), prior);
  store_chunks<kVecs>(
      x, static_cast<fp8_e4m3_t*>(p.output_q), threadIdx.x, num_chunks, p.num_cols, inverse_scale(scale));
  __syncthreads();  // every thread has read *output_s before it is overwritten
  if (threadIdx.x == 0) *p.output_s = scale;
}

/// Cluster pass (opt-in, SGLANG_PER_TENSOR_CLUSTER=1, 9.0+): the single pass over up to
/// kClusterSize * kClusterThreads * kClusterVecs chunks of any number of rows (bf16: 262144 elements,
/// [64, 4096]), in one launch of one cluster. CTA r holds chunks [r * n, (r + 1) * n) of the
/// row-major chunk sequence (n = blockDim.x * kClusterVecs; chunk c * blockDim.x + threadIdx.x of
/// its range in register slot c: each load instruction reads blockDim.x consecutive chunks of a row),
/// reduces its maximum into its shared memory, and after a cluster barrier every CTA reads the
/// kClusterSize block maxima through distributed shared memory: the tensor maximum, exact in any
/// order. Scale and bytes are then the two-pass path's bit for bit (block_scale is monotonic, so the
/// maximum of the blocks' scales is the scale of the maximum; fmaxf with the prior value as the
/// atomic fmax does; the same inverse_scale and quantize_chunk). A second barrier keeps every CTA's
/// shared memory alive until the others have read it. Why: [64, 4096] bf16 is 512 KB, past the
/// one-block pass (16384 elements), so the default runs the reset, absmax and quantize kernels: three
/// dependent launches (~4.4 us on the H200 against ~1 us for one launch at that size). Measured (H200,
/// sixth session of 2026-12-01, [64, 4096] bf16 one input, accumulate=False): 4.96 us against the
/// default's 4.74 (6.75 / 5.25 with the caller's zero_), so it stays opt-in: one cluster's 8 SMs
/// move 768 KB slower than the default's grid does, more than the launches it saves.
template <typename TIn, bool kAligned>
__global__ void __launch_bounds__(TensorQuantConfig::kClusterThreads)
    per_tensor_quant_fp8_cluster_kernel(const TensorQuantParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  constexpr int kVecN = 16 / sizeof(TIn);
  constexpr int kVecs = TensorQuantConfig::kClusterVecs;
  constexpr float kQMax = device::quant::kTypeMax<fp8_e4m3_t>;
  __shared__ float smem[TensorQuantConfig::kClusterThreads / device::kWarpThreads];
  const cg::cluster_group cluster = cg::this_cluster();
  // 32-bit chunk indices: at most kClusterSize * kClusterThreads * kClusterVecs (host-checked)
  const FlatChunks at = flat_chunks<kVecs, kVecN>(p, blockIdx.x, threadIdx.x);
  device::quant::Chunk<TIn, kVecN, kAligned> x[kVecs];
  device::pdl_wait_primary();  // the input, and output_s zeroed by the caller, may be earlier kernels' work
  device::pdl_launch_dependents();
  const float prior = p.accumulate ? *p.output_s : 0.0f;
  const float amax = load_flat_chunks<kVecs>(x, p, at);
  device::cta::reduce_max(amax, smem, 0.0f);
  cluster.sync();  // every CTA's maximum is in its smem[0] (the barrier orders the shared store)
  float tensor_max = 0.0f;
#pragma unroll
  for (uint32_t r = 0; r < TensorQuantConfig::kClusterSize; ++r) {
    tensor_max = fmaxf(tensor_max, *cluster.map_shared_rank(&smem[0], r));
  }
  const float scale = fmaxf(device::quant::block_scale(tensor_max, p.eps, kQMax, /*ue8m0=*/false), prior);
  store_flat_chunks<kVecs>(x, p, at, inverse_scale(scale));
  // Every CTA has read the others' smem[0] (and, with accumulate, *output_s before the first barrier)
  cluster.sync();
  if (blockIdx.x == 0 && threadIdx.x == 0) *p.output_s = scale;
#endif
}

/// Grid pass (opt-in, SGLANG_PER_TENSOR_GRID=1): the single pass over a grid of co-resident blocks in
/// one cooperative launch, for dynamic inputs past the one-block pass up to what one resident wave
/// holds in registers (kGridVecs chunks a thread; the co-resident blocks of kGridThreads threads,
/// queried per device). Block b holds chunks [b * n, (b + 1) * n) of the row-major chunk sequence
/// (n = blockDim.x * kGridVecs, laid out as in the cluster pass): it loads them into registers,
/// reduces their maximum, and its thread 0 max-reduces the block's scale into output_s; after a grid
/// barrier every thread reads the final output_s and quantizes its chunks from registers. Bytes: the
/// input read once, fp8 written once, the 4-byte scale (N * s_in + N + 4) in one launch. Why: past the
/// one-block pass the default reads the input twice in two or three dependent launches (the reset,
/// absmax and quantize kernels), whose latency dominates at mid sizes ([64, 4096] bf16 is 512 KB), and
/// the cluster pass, one launch too, moves the bytes through 8 SMs only; this grid spreads them over
/// every SM (the launcher sizes the blocks so that it covers them). Opt-in: a first version (the fmax
/// loop, two barriers without accumulate) lost on the H200 (docs/perf_notes.md); this one is not
/// measured on a GPU yet.
///
/// Bit-identical to the two-pass path, whose output_s is fmaxf(start, s_0, .., s_n) (its atomic fmax;
/// start = the caller's output_s with accumulate, 0 without, as the reset kernel stores) of the same
/// block_scale s_b of each block's maximum: block_scale is monotonic, so that is the scale of the
/// tensor maximum whatever the blocks. Here each block does one atomicMax on the int bits instead of
/// the fmax's compare-and-swap loop (all blocks arrive at once, and the loop's retries serialize on
/// the one address): the s_b are positive finite floats, whose bits order as the floats do, and below
/// every start but a positive NaN (negative floats and -0.0 are negative ints, +inf and larger priors
/// stay, as under fmaxf); a positive NaN, above +inf as an int, stays where fmaxf drops it. No block's
/// atomicMax replaces it, so every block's atomic returns it: the grid then knows, uniformly, and
/// redoes the maximum with the fmax (which drops it) before a second barrier. The bytes use the same
/// inverse_scale and quantize_chunk.
///
/// Race-free, with no buffer but output_s: with accumulate, output_s is touched only by the blocks'
/// atomics before the barrier and only read after it (grid.sync() is a release/acquire at GPU scope:
/// every atomic is visible to every later read); one barrier (two with a positive-NaN prior, the
/// fmax's atomics between them). Without accumulate, thread 0 of block 0 stores 0 into output_s before
/// a first barrier, every atomic comes after it and every read after a second one. No thread writes
/// output_s after its last barrier, so every read sees the final value. The barrier is the driver's
/// own, per launch (concurrent launches on other streams share nothing), and the cooperative launch
/// makes every block co-resident, so no block spins on one not yet scheduled. Launched without PDL
/// (the launcher): pdl_wait_primary() is then a no-op, and the dependent that pdl_launch_dependents()
/// releases starts only once every block has issued it, all resident already.
template <typename TIn, bool kAligned>
__global__ void __launch_bounds__(TensorQuantConfig::kGridThreads)
    per_tensor_quant_fp8_grid_kernel(const TensorQuantParams p) {
  constexpr int kVecN = 16 / sizeof(TIn);
  constexpr int kVecs = TensorQuantConfig::kGridVecs;
  __shared__ float smem[TensorQuantConfig::kGridThreads / device::kWarpThreads];
  __shared__ bool nan_prior;  // output_s held a positive NaN (accumulate only)
  const cooperative_groups::grid_group grid = cooperative_groups::this_grid();
  // 32-bit chunk indices: at most the co-resident blocks' kGridThreads * kGridVecs (host-checked)
  const FlatChunks at = flat_chunks<kVecs, kVecN>(p, blockIdx.x, threadIdx.x);
  device::quant::Chunk<TIn, kVecN, kAligned> x[kVecs];
  device::pdl_wait_primary();  // a no-op: not launched with PDL (a launch waits for the previous kernel)
  device::pdl_launch_dependents();
  if (!p.accumulate && blockIdx.x == 0 && threadIdx.x == 0) *p.output_s = 0.0f;  // what the reset kernel does
  const float amax = load_flat_chunks<kVecs>(x, p, at);
  device::cta::reduce_max(amax, smem, 0.0f);
  if (!p.accumulate) grid.sync();  // the store of 0 above precedes every block's atomic
  // smem[0] was written by this thread (reduce_max's lane 0 of warp 0): no __syncthreads() owed
  float scale = 0.0f;
  if (threadIdx.x == 0) {
    scale = device::quant::block_scale(smem[0], p.eps, device::quant::kTypeMax<fp8_e4m3_t>, /*ue8m0=*/false);
    // One atomicMax on the bits, no compare-and-swap loop (see the comment above the kernel)
    const int old = atomicMax(reinterpret_cast<int*>(p.output_s), __float_as_int(scale));
    nan_prior = old > 0x7f800000;  // a positive NaN: above +inf as an int
  }
  grid.sync();      // every block's atomic precedes every read below (and nan_prior is in smem)
  if (nan_prior) {  // the same in every block: that NaN stays under atomicMax, so every block saw it
    if (threadIdx.x == 0) device::atomic::fmax(p.output_s, scale);  // the absmax pass's fmax drops it
    grid.sync();
  }
  store_flat_chunks<kVecs>(x, p, at, inverse_scale(*p.output_s));  // nothing writes output_s after the last barrier
}

/// Whether environment variable `name` is exactly "1" (the opt-in passes' switches).
inline bool env_is_one(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && std::string_view{value} == "1";
}

/// SGLANG_PER_TENSOR_CLUSTER (read at each call that fits the cluster pass, so at graph capture):
/// exactly "1" runs per_tensor_quant_fp8_cluster_kernel where it applies; anything else, or unset,
/// keeps the default's passes. The same bits either way.
inline bool per_tensor_cluster_enabled() { return env_is_one("SGLANG_PER_TENSOR_CLUSTER"); }

/// SGLANG_PER_TENSOR_GRID (read at each dynamic call past the one-block pass, so at graph capture):
/// exactly "1" runs per_tensor_quant_fp8_grid_kernel where it applies; anything else, or unset,
/// keeps the default's passes (with SGLANG_PER_TENSOR_CLUSTER=1 as well, the cluster pass takes the
/// inputs it fits). The same bits either way.
inline bool per_tensor_grid_enabled() { return env_is_one("SGLANG_PER_TENSOR_GRID"); }

/// SGLANG_PER_TENSOR_EARLY (read at each dynamic two-pass call, so at graph capture): exactly "0"
/// keeps the quantize pass's loads after its PDL wait (the A/B baseline); anything else, or unset,
/// loads the first row before it (per_tensor_quant_kernel's kEarly). The same bits either way.
inline bool per_tensor_early_enabled() {
  const char* value = std::getenv("SGLANG_PER_TENSOR_EARLY");
  return value == nullptr || std::string_view{value} != "0";
}

/// Answers per CUDA device, cached by query_once_per_device: answer + 1, 0 not asked yet.
using PerDeviceAnswers = std::array<std::atomic<int>, 64>;

/// `query(device_id)`'s answer (an int >= 0), asked with device `device_id` current once per device
/// and `cache`, then served from it (racing first calls may both ask; they store the same answer).
/// 0 for a device id outside the cache or a device that cannot be made current; `query` answers 0
/// for a failed CUDA call, whose error is cleared here so that it does not fail the next launch.
template <typename Query>
int query_once_per_device(PerDeviceAnswers& cache, int device_id, Query query) {
  if (device_id < 0 || device_id >= static_cast<int>(cache.size())) return 0;
  const int cached = cache[device_id].load(std::memory_order_relaxed);
  if (cached != 0) return cached - 1;
  int previous = -1;
  int answer = 0;
  if (cudaGetDevice(&previous) == cudaSuccess && cudaSetDevice(device_id) == cudaSuccess) {
    answer = std::max(query(device_id), 0);
  }
  (void)cudaGetLastError();
  if (previous >= 0) (void)cudaSetDevice(previous);
  cache[device_id].store(answer + 1, std::memory_order_relaxed);
  return answer;
}

/// Whether one cluster of kClusterSize CTAs of kClusterThreads threads of `kernel` can be resident on
/// device `device_id` (cudaOccupancyMaxActiveClusters > 0: a MIG slice or an MPS thread limit may
/// leave no GPC with 8 free SMs, and the launch would then fail), for the largest CTA the cluster
/// pass launches (smaller ones fit wherever it does). Queried once per device and kernel; a failed
/// query counts as no.
template <typename TIn, bool kAligned>
bool per_tensor_cluster_fits(int device_id) {
  static PerDeviceAnswers cache{};
  return query_once_per_device(cache, device_id, [](int) {
           cudaLaunchAttribute attr{};
           attr.id = cudaLaunchAttributeClusterDimension;
           attr.val.clusterDim.x = TensorQuantConfig::kClusterSize;
           attr.val.clusterDim.y = 1;
           attr.val.clusterDim.z = 1;
           cudaLaunchConfig_t config{};
           config.gridDim = dim3(TensorQuantConfig::kClusterSize);
           config.blockDim = dim3(TensorQuantConfig::kClusterThreads);
           config.attrs = &attr;
           config.numAttrs = 1;
           int clusters = 0;
           const auto kernel = per_tensor_quant_fp8_cluster_kernel<TIn, kAligned>;
           return cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) == cudaSuccess && clusters > 0 ? 1 : 0;
         }) == 1;
}

/// How many blocks of kGridThreads threads of per_tensor_quant_fp8_grid_kernel<TIn, kAligned> one
/// cooperative launch on device `device_id` may hold: cudaOccupancyMaxActiveBlocksPerMultiprocessor
/// times the SM count, the bound the driver checks the grid against (smaller blocks fit wherever
/// these do). 0 where the device cannot launch cooperatively (cudaDevAttrCooperativeLaunch) or a
/// query fails: the caller then takes the default's passes. Queried once per device and kernel.
template <typename TIn, bool kAligned>
int per_tensor_grid_capacity(int device_id) {
  static PerDeviceAnswers cache{};
  return query_once_per_device(cache, device_id, [](int device) {
    int cooperative = 0, sms = 0, per_sm = 0;
    const auto kernel = per_tensor_quant_fp8_grid_kernel<TIn, kAligned>;
    const bool ok = cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device) == cudaSuccess &&
                    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess &&
                    cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                        &per_sm, kernel, static_cast<int>(TensorQuantConfig::kGridThreads), 0) == cudaSuccess;
    return ok && cooperative != 0 ? per_sm * sms : 0;
  });
}

/// Dynamic without accumulate, two passes: output_s = 0 before the absmax pass max-reduces into it
/// (one thread; PDL keeps it off the critical path of the launches).
__global__ void per_tensor_reset_scale_kernel(float* output_s) {
  device::pdl_wait_primary();  // an earlier kernel may still read output_s
  *output_s = 0.0f;
  device::pdl_launch_dependents();
}

/// Pass 1 of the dynamic path: each block's maximum over the tiles it strides over, max-reduced
/// into output_s as a scale (one atomic per block).
template <typename TIn, bool kAligned>
__global__ void __launch_bounds__(TensorQuantConfig::kAbsmaxThreads)
    per_tensor_absmax_kernel(const TensorQuantParams p) {
  constexpr int kVecN = 16 / sizeof(TIn);
  constexpr int kItems = TensorQuantConfig::kAbsmaxItems;
  __shared__ float smem[TensorQuantConfig::kAbsmaxThreads / device::kWarpThreads];
  const int64_t num_chunks = (p.num_cols + kVecN - 1) / kVecN;
  const int64_t num_tiles = p.num_rows * p.tiles_per_row;
  device::pdl_wait_primary();  // the input, and output_s zeroed by the caller, may be earlier kernels' work
  device::pdl_launch_dependents();
  float amax = 0.0f;
  for (int64_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const int64_t row = tile / p.tiles_per_row;
    const int64_t first = (tile - row * p.tiles_per_row) * blockDim.x * kItems + threadIdx.x;
    device::quant::Chunk<TIn, kVecN, kAligned> x[kItems];
    const TIn* src = static_cast<const TIn*>(p.input) + row * p.input_row_stride;
    amax = fmaxf(amax, load_chunks<kItems>(x, src, first, num_chunks, p.num_cols));
  }
  device::cta::reduce_max(amax, smem, 0.0f);
  __syncthreads();
  if (threadIdx.x == 0) {
    // fmax, not max: a NaN left in output_s (accumulate) is ignored as the single pass's fmaxf does
    device::atomic::fmax(
        p.output_s,
        device::quant::block_scale(
            smem[0],
            p.eps,
            device::quant::kTypeMax<fp8_e4m3_t>,
            /*ue8m0=*/false));
  }
}

/// Loads this thread's kVecs chunks of an aligned row (chunk first + c * blockDim.x) from L2
/// (ld.global.cg: no L1 line of an earlier kernel can answer it), as load_chunks does otherwise.
template <int kVecs, typename TIn, int kVecN>
SGL_DEVICE void load_chunks_l2(
    device::quant::Chunk<TIn, kVecN, true> (&x)[kVecs], const TIn* src, int64_t first, int64_t num_chunks) {
  static_assert(sizeof(x[0].vec) == sizeof(uint4), "load_chunks_l2: 16-byte chunks");
#pragma unroll
  for (int c = 0; c < kVecs; ++c) {
    const int64_t index = first + int64_t{c} * blockDim.x;
    if (index < num_chunks) {
      const uint4 bits = __ldcg(reinterpret_cast<const uint4*>(src) + index);
      __builtin_memcpy(&x[c].vec, &bits, sizeof(bits));
    }
  }
}

/// Pass 2 (and the static path): quantize with the scale in output_s.
///
/// kEarly (the dynamic two-pass path, aligned rows; SGLANG_PER_TENSOR_EARLY=0 turns it off): the
/// block loads its first row's chunks before its PDL wait, so that the load overlaps the absmax
/// pass, and only output_s waits for it. That is safe because this kernel's primary is the absmax
/// pass, which never writes the input: this grid is launched only once every absmax block has
/// passed its own PDL wait, i.e. once every kernel before the absmax pass (the input's producer, the
/// caller's fill or the reset kernel) has completed and its writes are visible at GPU scope. The
/// early loads read L2 (ld.global.cg), not an L1 that may hold lines from before those writes.
/// output_q is written after the wait (it does not overlap the input: host-checked). The same bits.
template <typename TIn, bool kAligned, bool kEarly = false>
__global__ void __launch_bounds__(TensorQuantConfig::kThreads) per_tensor_quant_kernel(const TensorQuantParams p) {
  static_assert(kAligned || !kEarly, "per_tensor_quant_kernel: early loads need aligned rows");
  constexpr int kVecN = 16 / sizeof(TIn);
  constexpr int kVecs = TensorQuantConfig::kVecsPerThread;
  const int64_t num_chunks = (p.num_cols + kVecN - 1) / kVecN;
  const int64_t block_x = p.reverse ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int64_t first = block_x * blockDim.x * kVecs + threadIdx.x;
  int64_t y = blockIdx.y;
  if constexpr (kEarly) {
    // gridDim.y <= num_rows: every block has a first row
    const int64_t row = p.reverse ? p.num_rows - 1 - y : y;
    device::quant::Chunk<TIn, kVecN, kAligned> x[kVecs];
    load_chunks_l2<kVecs>(x, static_cast<const TIn*>(p.input) + row * p.input_row_stride, first, num_chunks);
    device::pdl_wait_primary();  // output_s (the absmax pass)
    device::pdl_launch_dependents();
    const float inv_scale = inverse_scale(*p.output_s);
    store_chunks<kVecs>(
        x, static_cast<fp8_e4m3_t*>(p.output_q) + row * p.q_row_stride, first, num_chunks, p.num_cols, inv_scale);
    y += gridDim.y;
    for (; y < p.num_rows; y += gridDim.y) {
      const int64_t next = p.reverse ? p.num_rows - 1 - y : y;
      load_chunks<kVecs>(
          x, static_cast<const TIn*>(p.input) + next * p.input_row_stride, first, num_chunks, p.num_cols);
      store_chunks<kVecs>(
          x, static_cast<fp8_e4m3_t*>(p.output_q) + next * p.q_row_stride, first, num_chunks, p.num_cols, inv_scale);
    }
    return;
  }
  device::pdl_wait_primary();  // output_s (the absmax pass, or the caller's static scale) and the input
  device::pdl_launch_dependents();
  const float inv_scale = inverse_scale(*p.output_s);
  for (; y < p.num_rows; y += gridDim.y) {
    const int64_t row = p.reverse ? p.num_rows - 1 - y : y;
    device::quant::Chunk<TIn, kVecN, kAligned> x[kVecs];
    const TIn* src = static_cast<const TIn*>(p.input) + row * p.input_row_stride;
    load_chunks<kVecs>(x, src, first, num_chunks, p.num_cols);
    store_chunks<kVecs>(
        x, static_cast<fp8_e4m3_t*>(p.output_q) + row * p.q_row_stride, first, num_chunks, p.num_cols, inv_scale);
  }
}

/// Quantizes input [num_rows, num_cols] (TIn = fp16_t | bf16_t | fp32_t, last dim contiguous, any
/// row stride) into output_q (fp8 e4m3, same shape, last dim contiguous, any row stride) with the
/// scale output_s (fp32 [1]): dynamic (is_static false) max-reduces the tensor's scale into it first.
/// All on one CUDA device, output_s overlapping neither. Empty inputs return without a launch.
/// Throws PanicError (Python RuntimeError) naming the tensor on any mismatch.
template <typename TIn>
void per_tensor_quant_fp8(
    tvm::ffi::TensorView input,
    tvm::ffi::TensorView output_q,
    tvm::ffi::TensorView output_s,
    bool is_static,
    double eps,
    bool accumulate) {
  using namespace host;
  constexpr int64_t kVecN = 16 / sizeof(TIn);
  constexpr int64_t kVecs = TensorQuantConfig::kVecsPerThread;

  // Validate
  SymbolicSize num_rows{"num_rows"};
  SymbolicSize num_cols{"num_cols"};
  SymbolicSize input_row_stride{"input_row_stride"};
  SymbolicSize q_row_stride{"q_row_stride"};
  SymbolicDevice device_;
  device_.set_options<kDLCUDA>();
  TensorMatcher({num_rows, num_cols})  //
      .with_strides({input_row_stride, 1})
      .with_dtype<TIn>()
      .with_device<kDLCUDA>(device_)
      .verify(input, "input");
  TensorMatcher({num_rows, num_cols})  //
      .with_strides({q_row_stride, 1})
      .with_dtype<fp8_e4m3_t>()
      .with_device<kDLCUDA>(device_)
      .verify(output_q, "output_q");
  TensorMatcher({1})  //
      .with_dtype<float>()
      .with_device<kDLCUDA>(device_)
      .verify(output_s, "output_s");
  verify_no_self_overlap(output_q, "output_q");
  verify_no_partial_overlap(output_q, "output_q", input, "input", /*allow_same=*/false);
  verify_no_partial_overlap(output_s, "output_s", input, "input", /*allow_same=*/false);
  verify_no_partial_overlap(output_s, "output_s", output_q, "output_q", /*allow_same=*/false);

  // Unwrap
  TensorQuantParams params{
      .input = data_ptr<const void>(input),
      .output_q = data_ptr(output_q),
      .output_s = data_ptr<float>(output_s),
      .num_rows = num_rows.unwrap(),
      .num_cols = num_cols.unwrap(),
      .input_row_stride = input_row_stride.unwrap(),
      .q_row_stride = q_row_stride.unwrap(),
      .tiles_per_row = 0,
      .eps = static_cast<float>(eps),
      .reverse = false,
      .accumulate = accumulate,
  };
  const DLDevice device = device_.unwrap();
  if (params.num_rows == 0 || params.num_cols == 0) return;

  // Configure: 16-byte accesses when every row allows them; the single pass when one block holds it
  const bool aligned = params.num_cols % kVecN == 0 && quant::is_aligned(params.input, 16) &&
                       quant::is_aligned(params.input_row_stride * int64_t{sizeof(TIn)}, 16) &&
                       quant::is_aligned(params.output_q, kVecN) && quant::is_aligned(params.q_row_stride, kVecN);
  const int64_t num_chunks = div_ceil(params.num_cols, kVecN);
  const bool fused = !is_static && params.num_rows == 1 && num_chunks <= TensorQuantConfig::kFusedMaxThreads * kVecs;
  const int64_t chunks_per_block = int64_t{TensorQuantConfig::kThreads} * kVecs;
  const dim3 grid(
      static_cast<uint32_t>(div_ceil(num_chunks, chunks_per_block)),
      static_cast<uint32_t>(std::min<int64_t>(params.num_rows, TensorQuantConfig::kMaxRowBlocks)));
  RuntimeCheck(
      div_ceil(num_chunks, chunks_per_block) <= 0x7fffffff,
      "per_tensor_quant_fp8: a row of ",
      params.num_cols,
      " elements exceeds the grid");

  // Launch
  if (fused) {
    const int64_t threads = std::clamp<int64_t>(
        div_ceil(div_ceil(num_chunks, kVecs), int64_t{32}) * 32, 32, TensorQuantConfig::kFusedMaxThreads);
    const auto kernel =
        aligned ? per_tensor_quant_fp8_fused_kernel<TIn, true> : per_tensor_quant_fp8_fused_kernel<TIn, false>;
    LaunchKernel(1, static_cast<uint32_t>(threads), device).enable_pdl(true)(kernel, params);
    return;
  }
  const int64_t total_chunks = params.num_rows * num_chunks;
  constexpr int64_t kClusterChunks =
      int64_t{TensorQuantConfig::kClusterSize} * TensorQuantConfig::kClusterThreads * TensorQuantConfig::kClusterVecs;
  if (!is_static && total_chunks <= kClusterChunks && per_tensor_cluster_enabled()) {
    // The cluster pass: kClusterSize CTAs of the fewest warps that hold every chunk.
    const int64_t per_cta = div_ceil(total_chunks, int64_t{TensorQuantConfig::kClusterSize});
    const int64_t threads = std::clamp<int64_t>(
        div_ceil(div_ceil(per_cta, int64_t{TensorQuantConfig::kClusterVecs}), int64_t{32}) * 32,
        32,
        TensorQuantConfig::kClusterThreads);
    LaunchKernel launch(TensorQuantConfig::kClusterSize, static_cast<uint32_t>(threads), device);
    const bool fits = launch.is_cluster_device() && (aligned ? per_tensor_cluster_fits<TIn, true>(device.device_id)
                                                             : per_tensor_cluster_fits<TIn, false>(device.device_id));
    if (fits) {  // else the default's passes
      const auto kernel =
          aligned ? per_tensor_quant_fp8_cluster_kernel<TIn, true> : per_tensor_quant_fp8_cluster_kernel<TIn, false>;
      launch.enable_pdl(true).cluster(TensorQuantConfig::kClusterSize)(kernel, params);
      return;
    }
  }
  if (!is_static && per_tensor_grid_enabled()) {
    // The grid pass where one resident wave holds every chunk: blocks of the fewest warps that spread
    // the chunks over every SM, up to kGridThreads (then more blocks than SMs, up to the capacity).
    // Below kGridThreads a block holds fewer chunks than the SMs' share, so blocks <= SMs: resident.
    const int64_t capacity = aligned ? per_tensor_grid_capacity<TIn, true>(device.device_id)
                                     : per_tensor_grid_capacity<TIn, false>(device.device_id);
    constexpr int64_t kBlockChunks = int64_t{TensorQuantConfig::kGridThreads} * TensorQuantConfig::kGridVecs;
    if (total_chunks <= std::min<int64_t>(capacity * kBlockChunks, 0x7fffffff)) {  // 32-bit chunk indices
      const int64_t num_sms = runtime::get_sm_count(device.device_id);
      const int64_t threads = std::clamp<int64_t>(
          div_ceil(div_ceil(total_chunks, num_sms * TensorQuantConfig::kGridVecs), int64_t{32}) * 32,
          32,
          TensorQuantConfig::kGridThreads);
      const int64_t blocks = div_ceil(total_chunks, threads * TensorQuantConfig::kGridVecs);
      const auto kernel =
          aligned ? per_tensor_quant_fp8_grid_kernel<TIn, true> : per_tensor_quant_fp8_grid_kernel<TIn, false>;
      // No PDL: the pass waits for the previous kernel at launch (whether the driver keeps the
      // cooperative guarantee under PDL is untested)
      try {
        LaunchKernel(static_cast<uint32_t>(blocks), static_cast<uint32_t>(threads), device)
            .cooperative(true)(kernel, params);
        return;
      } catch (const host::PanicError&) {
        // Refused (fewer co-resident blocks than the occupancy query promised, e.g. under an MPS SM
        // limit): nothing ran, the launch error is cleared (RuntimeDeviceCheck); the default's passes
      }
    }
  }
  if (!is_static) {
    // A block per SM of kAbsmaxThreads, or smaller blocks when that would leave most SMs idle.
    const int64_t num_sms = runtime::get_sm_count(device.device_id);
    const int64_t big_tiles =
        params.num_rows *
        div_ceil(num_chunks, int64_t{TensorQuantConfig::kAbsmaxThreads} * TensorQuantConfig::kAbsmaxItems);
    const uint32_t threads =
        2 * big_tiles >= num_sms ? TensorQuantConfig::kAbsmaxThreads : TensorQuantConfig::kAbsmaxSmallThreads;
    params.tiles_per_row = div_ceil(num_chunks, int64_t{threads} * TensorQuantConfig::kAbsmaxItems);
    const auto blocks = static_cast<uint32_t>(std::min<int64_t>(params.num_rows * params.tiles_per_row, num_sms));
    if (!accumulate) LaunchKernel(1, 1, device).enable_pdl(true)(per_tensor_reset_scale_kernel, params.output_s);
    const auto absmax = aligned ? per_tensor_absmax_kernel<TIn, true> : per_tensor_absmax_kernel<TIn, false>;
    LaunchKernel(blocks, threads, device).enable_pdl(true)(absmax, params);
    params.reverse = true;
  }
  // The quantize pass after the absmax pass loads before its PDL wait (aligned rows; see the kernel)
  const bool early = !is_static && aligned && per_tensor_early_enabled();
  const auto quant = early     ? per_tensor_quant_kernel<TIn, true, true>
                     : aligned ? per_tensor_quant_kernel<TIn, true>
                               : per_tensor_quant_kernel<TIn, false>;
  LaunchKernel(grid, TensorQuantConfig::kThreads, device).enable_pdl(true)(quant, params);
}

}  // namespace
