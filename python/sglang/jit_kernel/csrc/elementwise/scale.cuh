// scale: dst[i] = src[i] * factor, element-wise, fp32 arithmetic, one rounding to the dtype.
//
// Memory-bound: moves 2 * num_elements * sizeof(T) bytes. The kernel reads kUnroll 16-byte vectors
// per thread before it writes any (several loads in flight), uses 64-bit indices (any element count),
// and falls back to narrower vectors when a data pointer is not 16-byte aligned (a view with a storage
// offset), so no access is ever misaligned.
#pragma once

#include <sgl_kernel/tensor.h>   // For TensorMatcher, SymbolicSize, SymbolicDevice
#include <sgl_kernel/utils.h>    // For RuntimeCheck, Panic, div_ceil
#include <sgl_kernel/utils.cuh>  // For LaunchKernel, SGL_DEVICE, fp16_t, bf16_t, fp32_t
#include <sgl_kernel/vec.cuh>    // For AlignedVector

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include <algorithm>
#include <cstdint>

namespace {

/// Kernel arguments of scale.
struct ScaleParams {
  void* dst;             // [num_elements]
  const void* src;       // [num_elements]
  float factor;          // multiplier, applied in fp32
  int64_t num_elements;  // total element count (may exceed 2^32)
};

/// Launch facts of scale: kThreads threads per block, each keeping kUnroll 16-byte loads in flight.
template <int kUnrollV = 4, uint32_t kThreadsV = 256>
struct ScaleConfig {
  static constexpr uint32_t kThreads = kThreadsV;  // threads per block
  static constexpr int kUnroll = kUnrollV;         // vectors per thread per tile (loads in flight)
  static constexpr int64_t kMaxBlocks = 1 << 20;   // grid cap; blocks loop over the remaining tiles
};
/// One 16-byte vector per thread per tile, 256 threads: the fastest of the swept configurations on
/// H200 (benchmark/sweep_scale.py: 100.7% of copy at 2^28 bf16, on par with torch at 2^24).
using DefaultScaleConfig = ScaleConfig<1, 256>;

/// Scales elements [begin, end) of one thread's share, scalar by scalar (tail and unaligned fallback).
template <typename T>
SGL_DEVICE void scale_scalars(const ScaleParams& params, int64_t begin, int64_t end, int64_t stride) {
  auto* dst = static_cast<T*>(params.dst);
  const auto* src = static_cast<const T*>(params.src);
  for (int64_t i = begin; i < end; i += stride) {
    dst[i] = static_cast<T>(static_cast<float>(src[i]) * params.factor);
  }
}

/// One tile = kThreads * kUnroll vectors of kVecN elements; each thread loads its kUnroll vectors
/// (strided by kThreads so a warp's accesses are contiguous), scales them, then stores them.
/// The last kVecN-1 elements (num_elements % kVecN) are done by the last block, scalar.
template <typename T, int kVecN, typename Config>
__global__ void __launch_bounds__(Config::kThreads) scale_kernel(const ScaleParams params) {
  using vec_t = device::AlignedVector<T, kVecN>;
  constexpr int kUnroll = Config::kUnroll;
  constexpr int64_t kTileVecs = int64_t{Config::kThreads} * kUnroll;
  const int64_t num_vecs = params.num_elements / kVecN;
  const int64_t num_tiles = (num_vecs + kTileVecs - 1) / kTileVecs;
  const auto* src = static_cast<const T*>(params.src);
  auto* dst = static_cast<T*>(params.dst);

  for (int64_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const int64_t first = tile * kTileVecs + threadIdx.x;
    vec_t v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t vi = first + int64_t{u} * Config::kThreads;
      if (vi < num_vecs) v[u].load(src, vi);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t vi = first + int64_t{u} * Config::kThreads;
      if (vi < num_vecs) {
#pragma unroll
        for (int i = 0; i < kVecN; ++i) {
          v[u][i] = static_cast<T>(static_cast<float>(v[u][i]) * params.factor);
        }
        v[u].store(dst, vi);
      }
    }
  }

  if constexpr (kVecN > 1) {
    if (blockIdx.x == gridDim.x - 1) {
      scale_scalars<T>(params, num_vecs * kVecN + threadIdx.x, params.num_elements, Config::kThreads);
    }
  }
}

/// Widest vector (in elements, at most 16 bytes) that every pointer's address is aligned to.
template <typename T>
int64_t widest_aligned_vector(const void* a, const void* b) {
  const auto bits = reinterpret_cast<std::uintptr_t>(a) | reinterpret_cast<std::uintptr_t>(b);
  int64_t bytes = 16;
  while (bytes > static_cast<int64_t>(sizeof(T)) && (bits % bytes) != 0) bytes /= 2;
  return bytes / static_cast<int64_t>(sizeof(T));
}

template <typename T, int kVecN, typename Config>
void launch_scale(const ScaleParams& params, DLDevice device) {
  using namespace host;
  const int64_t num_vecs = params.num_elements / kVecN;
  const int64_t tiles = div_ceil(num_vecs, int64_t{Config::kThreads} * Config::kUnroll);
  const auto blocks = static_cast<uint32_t>(std::clamp<int64_t>(tiles, 1, Config::kMaxBlocks));
  LaunchKernel(blocks, Config::kThreads, device)(scale_kernel<T, kVecN, Config>, params);
}

/// dst = src * factor with an explicit launch configuration (benchmark/sweep_scale.py times several).
template <typename T, typename Config>
void scale_with_config(tvm::ffi::TensorView dst, tvm::ffi::TensorView src, double factor) {
  using namespace host;

  // Validate
  SymbolicSize num_elements{"num_elements"};
  SymbolicDevice device_;
  device_.set_options<kDLCUDA>();
  TensorMatcher({num_elements})  //
      .with_dtype<T>()
      .with_device<kDLCUDA>(device_)
      .verify(dst, "out")
      .verify(src, "src");
  verify_no_partial_overlap(dst, "out", src, "src", /*allow_same=*/true);

  // Unwrap
  const ScaleParams params{
      .dst = dst.data_ptr(),
      .src = src.data_ptr(),
      .factor = static_cast<float>(factor),
      .num_elements = num_elements.unwrap(),
  };
  const DLDevice device = device_.unwrap();
  if (params.num_elements == 0) return;

  // Configure: the widest vector both pointers allow
  constexpr int64_t kMaxVecN = 16 / sizeof(T);
  const int64_t vec_n = widest_aligned_vector<T>(params.dst, params.src);

  // Launch
  switch (vec_n) {
    case kMaxVecN: return launch_scale<T, kMaxVecN, Config>(params, device);
    case kMaxVecN / 2: return launch_scale<T, std::max<int64_t>(kMaxVecN / 2, 1), Config>(params, device);
    case kMaxVecN / 4: return launch_scale<T, std::max<int64_t>(kMaxVecN / 4, 1), Config>(params, device);
    default: return launch_scale<T, 1, Config>(params, device);
  }
}

/// dst = src * factor. dst and src: contiguous 1-D tensors of T on one CUDA device, same length;
/// dst may be src (in place). Empty tensors return without a launch.
/// T = fp16_t | bf16_t | fp32_t. Throws PanicError (Python RuntimeError) on a mismatch.
template <typename T>
void scale(tvm::ffi::TensorView dst, tvm::ffi::TensorView src, double factor) {
  scale_with_config<T, DefaultScaleConfig>(dst, src, factor);
}

}  // namespace
