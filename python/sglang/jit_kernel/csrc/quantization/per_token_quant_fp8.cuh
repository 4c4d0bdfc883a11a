// per_token_quant_fp8: one scale per row, s = clamp(max(max|x|, eps) / 448, FLT_MIN, FLT_MAX),
// q = clamp(x * (1 / s), -448, 448) in fp8 e4m3 (arithmetic and roundings: quantize_8bit.cuh).
//
// Memory-bound: reads num_tokens * hidden_size inputs, writes as many bytes plus one fp32 per row.
// Two geometries, both reading the input once into registers, reducing the row maximum, then writing
// the quantized bytes from the registers:
//   - a warp per row (many rows of at most kWarpItems * 32 chunks): every lane issues all its
//     kWarpItems 16-byte loads before the first maximum, a warp shuffle reduction, no barrier, so
//     an SM keeps its resident rows' loads in flight together;
//   - a block per row (few rows, where a warp's serial arithmetic would dominate, or long rows):
//     kVecsPerThread chunks per thread and cta::reduce_max; rows longer than a block's registers
//     hold (more than 1024 * kVecsPerThread chunks) read the rest twice.
// 64-bit offsets, any row strides. Launched with PDL (waits for the previous kernel first).
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, SymbolicSize, SymbolicDevice, data_ptr
#include <sgl_kernel/utils.h>   // For RuntimeCheck, div_ceil

#include <sgl_kernel/cta.cuh>      // For cta::reduce_max_nonneg
#include <sgl_kernel/runtime.cuh>  // For runtime::get_sm_count
#include <sgl_kernel/utils.cuh>    // For LaunchKernel, SGL_DEVICE, kWarpThreads, fp8_e4m3_t, pdl_wait_primary
#include <sgl_kernel/warp.cuh>     // For warp::reduce_max_nonneg

#include <algorithm>
#include <cstdint>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include "quantize_8bit.cuh"  // For quant::Chunk, load_row_chunk, store_row_chunk, block_scale, quantize_chunk

namespace {

/// Kernel arguments of per_token_quant_fp8. Strides in elements of their own tensor.
struct TokenQuantParams {
  const void* input;         // [num_tokens, hidden_size], row stride input_row_stride
  void* output_q;            // fp8 [num_tokens, hidden_size], row stride q_row_stride
  float* output_s;           // [num_tokens] at stride s_stride
  int64_t num_tokens;        // rows
  int64_t hidden_size;       // elements per row
  int64_t input_row_stride;  // elements of TIn
  int64_t q_row_stride;      // bytes (fp8)
  int64_t s_stride;          // elements (fp32)
  float eps;                 // floor of the row maximum
};

/// Launch facts. Block per row: a thread keeps kVecsPerThread chunks; blocks of 32..kMaxThreads
/// threads, sized to the row. Warp per row: kWarpItems chunks per lane, kWarpBlockThreads per block,
/// used from kWarpRowsPerSm rows per SM on. Rows past the grid cap are looped over.
struct TokenQuantConfig {
  static constexpr int kVecsPerThread = 2;
  static constexpr int64_t kMaxThreads = 1024;
  static constexpr int kWarpItems = 16;  // a 4096-wide bf16 row in one warp (64 registers)
  static constexpr uint32_t kWarpBlockThreads = 128;
  static constexpr int64_t kWarpRowsPerSm = 2;
  static constexpr int64_t kMaxBlocks = 1 << 20;
};

/// A warp per row (see the file comment): lane l holds chunks c * 32 + l of its row.
template <typename TIn, bool kAligned>
__global__ void __launch_bounds__(TokenQuantConfig::kWarpBlockThreads)
    per_token_quant_fp8_warp_kernel(const TokenQuantParams p) {
  using namespace device::quant;
  constexpr int kVecN = 16 / sizeof(TIn);
  constexpr int kItems = TokenQuantConfig::kWarpItems;
  constexpr int64_t kWarpsPerBlock = TokenQuantConfig::kWarpBlockThreads / device::kWarpThreads;
  constexpr float kQMax = kTypeMax<fp8_e4m3_t>;
  const int32_t lane = threadIdx.x % device::kWarpThreads;
  const int64_t num_chunks = (p.hidden_size + kVecN - 1) / kVecN;
  const int64_t num_warps = int64_t{gridDim.x} * kWarpsPerBlock;
  device::pdl_wait_primary();  // the input may be the previous kernel's output
  device::pdl_launch_dependents();

  for (int64_t row = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / device::kWarpThreads; row < p.num_tokens;
       row += num_warps) {
    const TIn* src = static_cast<const TIn*>(p.input) + row * p.input_row_stride;
    auto* dst = static_cast<fp8_e4m3_t*>(p.output_q) + row * p.q_row_stride;
    Chunk<TIn, kVecN, kAligned> x[kItems];
#pragma unroll
    for (int c = 0; c < kItems; ++c) {
      const int64_t index = int64_t{c} * device::kWarpThreads + lane;
      if (index < num_chunks) load_row_chunk(x[c], src, index, p.hidden_size);
    }
    float amax = 0.0f;
#pragma unroll
    for (int c = 0; c < kItems; ++c) {
      if (int64_t{c} * device::kWarpThreads + lane < num_chunks) amax = chunk_absmax(x[c], amax);
    }
    amax = device::warp::reduce_max_nonneg(amax);  // >= 0, never NaN (chunk_absmax): exact
    const float scale = block_scale(amax, p.eps, kQMax, /*ue8m0=*/false);
    const float inv_scale = __fdiv_rn(1.0f, scale);
#pragma unroll
    for (int c = 0; c < kItems; ++c) {
      const int64_t index = int64_t{c} * device::kWarpThreads + lane;
      if (index < num_chunks) {
        store_row_chunk(
            quantize_chunk<fp8_e4m3_t, /*kClamp=*/false>(x[c], inv_scale, -kQMax, kQMax), dst, index, p.hidden_size);
      }
    }
    if (lane == 0) p.output_s[row * p.s_stride] = scale;
  }
}

template <typename TIn, bool kAligned>
__global__ void __launch_bounds__(TokenQuantConfig::kMaxThreads) per_token_quant_fp8_kernel(const TokenQuantParams p) {
  using namespace device::quant;
  constexpr int kVecN = 16 / sizeof(TIn);
  constexpr int kVecs = TokenQuantConfig::kVecsPerThread;
  using chunk_t = Chunk<TIn, kVecN, kAligned>;
  __shared__ float smem[TokenQuantConfig::kMaxThreads / device::kWarpThreads];

  const int64_t num_chunks = (p.hidden_size + kVecN - 1) / kVecN;
  const int64_t chunks_in_registers = int64_t{blockDim.x} * kVecs;
  // Parameter-only arithmetic before the PDL wait (it overlaps the previous kernel's tail).
  int64_t row = blockIdx.x;
  const TIn* src = static_cast<const TIn*>(p.input) + row * p.input_row_stride;
  auto* dst = static_cast<fp8_e4m3_t*>(p.output_q) + row * p.q_row_stride;
  device::pdl_wait_primary();  // the input may be the previous kernel's output
  device::pdl_launch_dependents();

  for (; row < p.num_tokens; row += gridDim.x) {
    // The first chunks_in_registers chunks (chunk c * blockDim.x + threadIdx.x of each thread) stay in
    // registers; later ones are read here for the maximum and again for the quantization. Missing
    // chunks are zeros (neutral for the maximum), so the maximum runs unpredicated.
    chunk_t x[kVecs];
#pragma unroll
    for (int c = 0; c < kVecs; ++c) {
      const int64_t index = int64_t{c} * blockDim.x + threadIdx.x;
#pragma unroll
      for (int i = 0; i < kVecN; ++i) x[c][i] = TIn(0.0f);
      if (index < num_chunks) load_row_chunk(x[c], src, index, p.hidden_size);
    }
    float amax = 0.0f;
#pragma unroll
    for (int c = 0; c < kVecs; ++c) amax = chunk_absmax(x[c], amax);
    for (int64_t index = chunks_in_registers + threadIdx.x; index < num_chunks; index += blockDim.x) {
      chunk_t extra;
      load_row_chunk(extra, src, index, p.hidden_size);
      amax = chunk_absmax(extra, amax);
    }
    device::cta::reduce_max_nonneg(amax, smem);  // >= 0, never NaN (chunk_absmax): exact
    __syncthreads();
    const float scale = block_scale(smem[0], p.eps, kTypeMax<fp8_e4m3_t>, /*ue8m0=*/false);
    const float inv_scale = __fdiv_rn(1.0f, scale);
    constexpr float kQMax = kTypeMax<fp8_e4m3_t>;

#pragma unroll
    for (int c = 0; c < kVecs; ++c) {
      const int64_t index = int64_t{c} * blockDim.x + threadIdx.x;
      if (index < num_chunks) {
        store_row_chunk(quantize_chunk<fp8_e4m3_t, false>(x[c], inv_scale, -kQMax, kQMax), dst, index, p.hidden_size);
      }
    }
    for (int64_t index = chunks_in_registers + threadIdx.x; index < num_chunks; index += blockDim.x) {
      chunk_t extra;
      load_row_chunk(extra, src, index, p.hidden_size);
      store_row_chunk(quantize_chunk<fp8_e4m3_t, false>(extra, inv_scale, -kQMax, kQMax), dst, index, p.hidden_size);
    }
    if (threadIdx.x == 0) p.output_s[row * p.s_stride] = scale;
    __syncthreads();  // smem[0] is read above before the next row's reduction overwrites it
    src += gridDim.x * p.input_row_stride;
    dst += gridDim.x * p.q_row_stride;
  }
}

/// Quantizes input [num_tokens, hidden_size] (TIn = fp16_t | bf16_t | fp32_t, last dim contiguous,
/// any row stride) into output_q (fp8 e4m3, same shape, last dim contiguous, any row stride) and
/// output_s (fp32 [num_tokens], any stride; the wrapper passes a [num_tokens, 1] buffer as its
/// column), all on one CUDA device, output_s overlapping neither. Empty inputs return without a
/// launch. Throws PanicError (Python RuntimeError) naming the tensor on any mismatch.
template <typename TIn>
void per_token_quant_fp8(
    tvm::ffi::TensorView input, tvm::ffi::TensorView output_q, tvm::ffi::TensorView output_s, double eps) {
  using namespace host;
  constexpr int64_t kVecN = 16 / sizeof(TIn);

  // Validate
  SymbolicSize num_tokens{"num_tokens"};
  SymbolicSize hidden_size{"hidden_size"};
  SymbolicSize input_row_stride{"input_row_stride"};
  SymbolicSize q_row_stride{"q_row_stride"};
  SymbolicSize s_stride{"s_stride"};
  SymbolicDevice device_;
  device_.set_options<kDLCUDA>();
  TensorMatcher({num_tokens, hidden_size})  //
      .with_strides({input_row_stride, 1})
      .with_dtype<TIn>()
      .with_device<kDLCUDA>(device_)
      .verify(input, "input");
  TensorMatcher({num_tokens, hidden_size})  //
      .with_strides({q_row_stride, 1})
      .with_dtype<fp8_e4m3_t>()
      .with_device<kDLCUDA>(device_)
      .verify(output_q, "output_q");
  TensorMatcher({num_tokens})  //
      .with_strides({s_stride})
      .with_dtype<float>()
      .with_device<kDLCUDA>(device_)
      .verify(output_s, "output_s");
  verify_no_self_overlap(output_q, "output_q");
  verify_no_self_overlap(output_s, "output_s");
  verify_no_partial_overlap(output_q, "output_q", input, "input", /*allow_same=*/false);
  verify_no_partial_overlap(output_s, "output_s", input, "input", /*allow_same=*/false);
  verify_no_partial_overlap(output_s, "output_s", output_q, "output_q", /*allow_same=*/false);

  // Unwrap
  const TokenQuantParams params{
      .input = data_ptr<const void>(input),
      .output_q = data_ptr(output_q),
      .output_s = data_ptr<float>(output_s),
      .num_tokens = num_tokens.unwrap(),
      .hidden_size = hidden_size.unwrap(),
      .input_row_stride = input_row_stride.unwrap(),
      .q_row_stride = q_row_stride.unwrap(),
      .s_stride = s_stride.unwrap(),
      .eps = static_cast<float>(eps),
  };
  const DLDevice device = device_.unwrap();
  if (params.num_tokens == 0) return;

  // Configure: 16-byte accesses when every row allows them; threads for kVecsPerThread chunks each
  const bool aligned = params.hidden_size % kVecN == 0 && quant::is_aligned(params.input, 16) &&
                       quant::is_aligned(params.input_row_stride * int64_t{sizeof(TIn)}, 16) &&
                       quant::is_aligned(params.output_q, kVecN) && quant::is_aligned(params.q_row_stride, kVecN);
  const int64_t num_chunks = div_ceil(std::max<int64_t>(params.hidden_size, 1), kVecN);
  const int64_t num_sms = runtime::get_sm_count(device.device_id);
  if (num_chunks <= int64_t{TokenQuantConfig::kWarpItems} * device::kWarpThreads &&
      params.num_tokens >= TokenQuantConfig::kWarpRowsPerSm * num_sms) {
    constexpr int64_t kRowsPerBlock = TokenQuantConfig::kWarpBlockThreads / device::kWarpThreads;
    const auto grid = static_cast<uint32_t>(
        std::min<int64_t>(div_ceil(params.num_tokens, kRowsPerBlock), TokenQuantConfig::kMaxBlocks));
    const auto kernel =
        aligned ? per_token_quant_fp8_warp_kernel<TIn, true> : per_token_quant_fp8_warp_kernel<TIn, false>;
    LaunchKernel(grid, TokenQuantConfig::kWarpBlockThreads, device).enable_pdl(true)(kernel, params);
    return;
  }
  const int64_t wanted = div_ceil(num_chunks, int64_t{TokenQuantConfig::kVecsPerThread});
  const int64_t threads = std::clamp<int64_t>(div_ceil(wanted, int64_t{32}) * 32, 32, TokenQuantConfig::kMaxThreads);
  const auto grid = static_cast<uint32_t>(std::min<int64_t>(params.num_tokens, TokenQuantConfig::kMaxBlocks));

  // Launch
  const auto kernel = aligned ? per_token_quant_fp8_kernel<TIn, true> : per_token_quant_fp8_kernel<TIn, false>;
  LaunchKernel(grid, static_cast<uint32_t>(threads), device).enable_pdl(true)(kernel, params);
}

}  // namespace
