// unary_map: dst[i] = op(src[i]) over two contiguous 1-D tensors, the engine of the element-wise ops
// (scale, add_constant): each op supplies only its per-element functor.
//
// Memory-bound: moves 2 * num_elements * sizeof(T) bytes, so what decides the speed is how many bytes
// each SM keeps in flight. A thread moves 16-byte vectors (one LDG.128 / STG.128), kUnroll of them
// loaded before any is stored; a scalar 4-byte access per thread keeps a quarter of the bytes in flight
// at the same occupancy and reaches about half of the copy bandwidth. Indices are 64-bit (any element
// count), and a data pointer that is not 16-byte aligned (a view with a storage offset) selects a
// narrower vector, so no access is ever misaligned. Measurements: docs/perf_notes.md.
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, SymbolicSize, SymbolicDevice, verify_no_partial_overlap
#include <sgl_kernel/utils.h>   // For div_ceil

#include <sgl_kernel/utils.cuh>  // For LaunchKernel, SGL_DEVICE
#include <sgl_kernel/vec.cuh>    // For AlignedVector

#include <algorithm>
#include <cstdint>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

namespace {

/// Launch facts of unary_map_kernel: kThreads threads per block, each moving kUnroll vectors per tile
/// (loaded before any is stored: the loads in flight per thread).
template <int kUnrollV, uint32_t kThreadsV>
struct UnaryMapConfig {
  static constexpr uint32_t kThreads = kThreadsV;  // threads per block
  static constexpr int kUnroll = kUnrollV;         // vectors per thread per tile
  static constexpr int64_t kMaxBlocks = 1 << 20;   // grid cap; blocks loop over the remaining tiles
};
/// One 16-byte vector per thread per tile, 256 threads: the fastest of the swept configurations at
/// large sizes (benchmark/sweep_scale.py; docs/perf_notes.md, scale). The sweep is over bytes per
/// access, so it holds for any 16-byte vector (8 bf16 or 4 int32).
using DefaultUnaryMapConfig = UnaryMapConfig<1, 256>;

/// Kernel arguments of unary_map_kernel.
/// Op: a trivially copyable functor, `SGL_DEVICE T operator()(T x) const`, copied into the kernel
/// parameters (its state, e.g. scale's factor, is a kernel argument).
template <typename T, typename Op>
struct UnaryMapParams {
  T* dst;                // [num_elements]
  const T* src;          // [num_elements]; may equal dst (in place)
  Op op;                 // applied to every element
  int64_t num_elements;  // total element count (may exceed 2^32)
};

/// One tile = kThreads * kUnroll vectors of kVecN elements; each thread loads its kUnroll vectors
/// (strided by kThreads so that a warp's accesses are contiguous), maps them, then stores them.
/// The last num_elements % kVecN elements are done by the last block, one by one.
/// Precondition: params.dst and params.src aligned to sizeof(T) * kVecN bytes.
template <typename T, int kVecN, typename Config, typename Op>
__global__ void __launch_bounds__(Config::kThreads) unary_map_kernel(const UnaryMapParams<T, Op> params) {
  using vec_t = device::AlignedVector<T, kVecN>;
  constexpr int kUnroll = Config::kUnroll;
  constexpr int64_t kTileVecs = int64_t{Config::kThreads} * kUnroll;
  const int64_t num_vecs = params.num_elements / kVecN;
  const int64_t num_tiles = (num_vecs + kTileVecs - 1) / kTileVecs;

  for (int64_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const int64_t first = tile * kTileVecs + threadIdx.x;
    vec_t v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t vi = first + int64_t{u} * Config::kThreads;
      if (vi < num_vecs) v[u].load(params.src, vi);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t vi = first + int64_t{u} * Config::kThreads;
      if (vi < num_vecs) {
#pragma unroll
        for (int i = 0; i < kVecN; ++i) v[u][i] = params.op(v[u][i]);
        v[u].store(params.dst, vi);
      }
    }
  }

  if constexpr (kVecN > 1) {
    if (blockIdx.x == gridDim.x - 1) {
      for (int64_t i = num_vecs * kVecN + threadIdx.x; i < params.num_elements; i += Config::kThreads) {
        params.dst[i] = params.op(params.src[i]);
      }
    }
  }
}

/// Widest vector (in elements of T, at most 16 bytes) that both addresses are aligned to.
/// Example: T = int32_t, a at 0x...00 and b at 0x...08: 2 (8 bytes).
template <typename T>
int64_t widest_aligned_vector(const void* a, const void* b) {
  const auto bits = reinterpret_cast<std::uintptr_t>(a) | reinterpret_cast<std::uintptr_t>(b);
  int64_t bytes = 16;
  while (bytes > static_cast<int64_t>(sizeof(T)) && (bits % bytes) != 0) bytes /= 2;
  return bytes / static_cast<int64_t>(sizeof(T));
}

/// Launches unary_map_kernel with the widest vector of at most kVecN elements that vec_n allows
/// (kVecN, kVecN / 2, ..., 1: one instantiation per power of two). The grid covers every tile, up to
/// Config::kMaxBlocks blocks. num_elements > 0.
template <typename T, int kVecN, typename Config, typename Op>
void launch_unary_map(const UnaryMapParams<T, Op>& params, int64_t vec_n, DLDevice device) {
  using namespace host;
  if constexpr (kVecN > 1) {
    if (vec_n < kVecN) return launch_unary_map<T, kVecN / 2, Config>(params, vec_n, device);
  }
  const int64_t tiles = div_ceil(params.num_elements / kVecN, int64_t{Config::kThreads} * Config::kUnroll);
  const auto blocks = static_cast<uint32_t>(std::clamp<int64_t>(tiles, 1, Config::kMaxBlocks));
  LaunchKernel(blocks, Config::kThreads, device)(unary_map_kernel<T, kVecN, Config, Op>, params);
}

/// dst[i] = op(src[i]). dst ("out") and src: contiguous 1-D tensors of T on one CUDA device, of one
/// length; dst may be src (in place), any other overlap is refused. Empty tensors return without a
/// launch. Runs on torch's current stream of that device. Throws PanicError (Python RuntimeError)
/// naming the tensor on a mismatch, before any launch.
template <typename T, typename Config = DefaultUnaryMapConfig, typename Op>
void unary_map(tvm::ffi::TensorView dst, tvm::ffi::TensorView src, const Op& op) {
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
  const UnaryMapParams<T, Op> params{
      .dst = static_cast<T*>(dst.data_ptr()),
      .src = static_cast<const T*>(src.data_ptr()),
      .op = op,
      .num_elements = num_elements.unwrap(),
  };
  const DLDevice device = device_.unwrap();
  if (params.num_elements == 0) return;

  // Configure: the widest vector both pointers allow
  constexpr int kMaxVecN = static_cast<int>(16 / sizeof(T));
  const int64_t vec_n = widest_aligned_vector<T>(params.dst, params.src);

  // Launch
  launch_unary_map<T, kMaxVecN, Config>(params, vec_n, device);
}

}  // namespace
