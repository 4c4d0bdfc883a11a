// Cooperative strided access to a contiguous 1D region.
//
//   device::tile::Memory<T>   thread `tid` of a group of `tsize` threads touches element tid + k * tsize
#pragma once

#include <sgl_kernel/utils.cuh>  // For SGL_DEVICE, kWarpThreads

#include <cstdint>

namespace device::tile {

/// 1D cooperative accessor: thread `tid` of `tsize` cooperating threads owns units
/// tid, tid + tsize, tid + 2 * tsize, ... of a contiguous array of T (the `offset`-th of them is
/// unit tid + offset * tsize). T is the unit: a scalar, or an AlignedVector (then one unit is one
/// vector and load/store use its single vector instruction). Indices are 64-bit.
///
/// Example: a CTA of 256 threads scanning `n` vectors of 8 bf16:
///   using vec_t = AlignedVector<bf16_t, 8>;
///   const auto mem = tile::Memory<vec_t>::cta();
///   for (int64_t k = 0; mem.in_bound(n, k); ++k) { vec_t v = mem.load(src, k); ...; mem.store(dst, v, k); }
template <typename T>
struct Memory {
  uint32_t tid;    ///< This thread's index in the group, 0 <= tid < tsize.
  uint32_t tsize;  ///< Number of threads in the group (the stride between a thread's units).

  SGL_DEVICE Memory(uint32_t tid_, uint32_t tsize_) : tid(tid_), tsize(tsize_) {}

  /// Whole (1D) CTA: tid = threadIdx.x, tsize = blockDim.x.
  static SGL_DEVICE Memory cta() { return Memory(threadIdx.x, blockDim.x); }
  /// First `tsize` threads of a 1D CTA: tid = threadIdx.x (threads with tid >= tsize must not access).
  static SGL_DEVICE Memory cta(uint32_t tsize) { return Memory(threadIdx.x, tsize); }
  /// Current warp: tid = lane id (threadIdx.x % 32), tsize = 32.
  static SGL_DEVICE Memory warp() { return Memory(threadIdx.x % kWarpThreads, kWarpThreads); }

  /// Index of this thread's `offset`-th unit: tid + offset * tsize.
  SGL_DEVICE int64_t index(int64_t offset = 0) const { return tid + offset * static_cast<int64_t>(tsize); }

  /// Returns unit ptr[tid + offset * tsize].
  SGL_DEVICE T load(const void* ptr, int64_t offset = 0) const {
    if constexpr (requires(T t) { t.load(ptr, offset); }) {
      T value;
      value.load(ptr, index(offset));
      return value;
    } else {
      return static_cast<const T*>(ptr)[index(offset)];
    }
  }

  /// Writes `value` to unit ptr[tid + offset * tsize].
  SGL_DEVICE void store(void* ptr, const T& value, int64_t offset = 0) const {
    if constexpr (requires(const T t) { t.store(ptr, offset); }) {
      value.store(ptr, index(offset));
    } else {
      static_cast<T*>(ptr)[index(offset)] = value;
    }
  }

  /// True iff unit tid + offset * tsize is inside an array of `n` units.
  SGL_DEVICE bool in_bound(int64_t n, int64_t offset = 0) const { return index(offset) < n; }
};

}  // namespace device::tile
