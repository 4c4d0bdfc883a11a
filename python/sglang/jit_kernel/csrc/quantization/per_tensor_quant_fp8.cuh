// per_tensor_quant_fp8: one scale for the whole tensor. Dynamic: output_s = max(output_s,
// max(max|x|, eps) / 448) (the caller zeroes output_s first), or with accumulate false output_s =
// max(max|x|, eps) / 448 (no zeroing needed: the single pass overwrites it, the two-pass path resets it
// in a one-thread kernel first), clamped to [FLT_MIN, FLT_MAX], then q = clamp(x * (1 / s), -448, 448)
// in fp8 e4m3; static: q from the
// given output_s (floored at FLT_MIN). Arithmetic: quantize_8bit.cuh.
//
// The input is [num_rows, num_cols] rows (the wrapper passes a contiguous tensor as one row):
//   - small dynamic inputs (one row of at most kFusedMaxThreads * kVecsPerThread chunks): one block
//     reads the row into registers, reduces, writes scale and bytes: a single pass, one launch;
//   - otherwise two launches: absmax over a grid of at most one block per SM that strides over
//     tiles of kAbsmaxItems chunks per thread (all loads of a tile in flight, then the maximum) and
//     max-reduces its block maximum into output_s with one atomic per block: every atomic on the one
//     address is serialized in L2, so their count, not the bytes, bounds the grid; then quantize over
//     a grid of (chunk blocks of a row, rows), walking the blocks in reverse order, so it starts on
//     the input the first pass read last, which is still in L2, and (aligned rows) loading each
//     block's first row before its PDL wait, under the absmax pass. Static inputs take the quantize
//     pass alone.
// 64-bit offsets, any row strides. Every kernel is launched with PDL and waits for the previous
// kernel (the quantize pass for the absmax pass) before its first access (but the quantize pass's
// early input loads, which the absmax pass's own wait makes safe).
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, SymbolicSize, SymbolicDevice, data_ptr
#include <sgl_kernel/utils.h>   // For div_ceil

#include <sgl_kernel/atomic.cuh>   // For atomic::fmax
#include <sgl_kernel/cta.cuh>      // For cta::reduce_max
#include <sgl_kernel/runtime.cuh>  // For runtime::get_sm_count
#include <sgl_kernel/utils.cuh>    // For LaunchKernel, SGL_DEVICE, kWarpThreads, fp8_e4m3_t, pdl_wait_primary

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <dlpack/dlpack.h>
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
/// kEarly (the dynamic two-pass path, aligned rows): the block loads its first row's chunks before its
/// PDL wait, so that the load overlaps the absmax pass, and only output_s waits for it. That is safe because this kernel's primary is the absmax
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
  const bool early = !is_static && aligned;
  const auto quant = early     ? per_tensor_quant_kernel<TIn, true, true>
                     : aligned ? per_tensor_quant_kernel<TIn, true>
                               : per_tensor_quant_kernel<TIn, false>;
  LaunchKernel(grid, TensorQuantConfig::kThreads, device).enable_pdl(true)(quant, params);
}

}  // namespace
