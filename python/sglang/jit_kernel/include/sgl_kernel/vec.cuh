// Vectorised global/shared memory access.
//
//   device::AlignedVector<T, N>   N elements of T moved with one 2/4/8/16-byte access (two 16-byte
//                                 accesses for 32 bytes below SM100)
#pragma once

#include <sgl_kernel/utils.cuh>  // For SGL_DEVICE

#include <cstddef>
#include <cstdint>

namespace device {

namespace detail {

/// Unsigned integer (vector) type of exactly kBytes bytes, used to move an AlignedVector at once.
template <std::size_t kBytes>
struct raw_storage;
template <>
struct raw_storage<1> {
  using type = uint8_t;
};
template <>
struct raw_storage<2> {
  using type = uint16_t;
};
template <>
struct raw_storage<4> {
  using type = uint32_t;
};
template <>
struct raw_storage<8> {
  using type = uint2;
};
template <>
struct raw_storage<16> {
  using type = uint4;
};
template <>
struct raw_storage<32> {
  struct alignas(32) type {
    uint4 lo, hi;
  };
};

}  // namespace detail

/// N elements of T stored contiguously with alignment sizeof(T) * N, so load/store compile to a
/// single vector memory instruction (LDG.E.128 / STG.E.128 for 16-byte vectors).
///
/// Template params: T trivially copyable (fp16_t, bf16_t, fp32_t, fp8, ints, packed types);
/// N a power of two with sizeof(T) * N <= 32 bytes. 16 bytes is the portable maximum; 32 bytes is
/// legal but only a single instruction on SM100+ (gate it by architecture).
/// Element access: operator[], size(). Default construction leaves elements uninitialised.
template <typename T, std::size_t N>
struct alignas(sizeof(T) * N) AlignedVector {
  static_assert(N > 0 && (N & (N - 1)) == 0, "AlignedVector: N must be a power of two");
  static_assert(sizeof(T) * N <= 32, "AlignedVector: sizeof(T) * N must be <= 32 bytes");

  using value_type = T;
  using storage_type = typename detail::raw_storage<sizeof(T) * N>::type;
  static_assert(sizeof(storage_type) == sizeof(T) * N);

  T data[N];

  /// Number of elements N.
  static constexpr SGL_DEVICE std::size_t size() { return N; }

  /// Loads vector number `offset` of `ptr`, i.e. elements ptr[offset * N .. offset * N + N - 1].
  /// `ptr` must be aligned to sizeof(T) * N bytes.
  SGL_DEVICE void load(const void* ptr, int64_t offset = 0) {
    *reinterpret_cast<storage_type*>(data) = static_cast<const storage_type*>(ptr)[offset];
  }

  /// Stores this vector as vector number `offset` of `ptr` (elements offset * N ..); same alignment rule.
  SGL_DEVICE void store(void* ptr, int64_t offset = 0) const {
    static_cast<storage_type*>(ptr)[offset] = *reinterpret_cast<const storage_type*>(data);
  }

  /// Sets every element to `value`.
  SGL_DEVICE void fill(const T& value) {
#pragma unroll
    for (std::size_t i = 0; i < N; ++i) data[i] = value;
  }

  /// Element i (0 <= i < N, unchecked).
  SGL_DEVICE T& operator[](std::size_t i) { return data[i]; }
  SGL_DEVICE const T& operator[](std::size_t i) const { return data[i]; }
};

}  // namespace device
