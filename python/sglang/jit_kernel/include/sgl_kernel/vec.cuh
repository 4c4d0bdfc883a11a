// Vectorised global/shared memory access.
//
//   device::AlignedVector<T, N>   N elements of T moved with one 2/4/8/16-byte access (two 16-byte
//                                 accesses for 32 bytes below SM100); load / store optionally
//                                 carry an L2 eviction priority (device::L2Policy)
//   device::L2Policy              an L2 eviction priority for global accesses (createpolicy, SM80+):
//                                 l2_evict_last_policy(), l2_evict_normal_policy()
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

/// An L2 eviction priority for global loads and stores: the 64-bit cache policy operand of
/// `ld/st.global.L2::cache_hint` (PTX createpolicy, SM80+). The priority applies to the L2 lines
/// the access touches: evict_last lines are replaced after evict_normal ones, and a later access
/// with another policy sets the line's priority again.
struct L2Policy {
  uint64_t bits;
};

/// Whether this compilation pass has L2 cache hints (SM80+); without them the policy accessors
/// below are plain accesses.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
inline constexpr bool kHasL2CacheHints = false;
#else
inline constexpr bool kHasL2CacheHints = true;
#endif

/// Every line the access touches becomes evict_last (replaced after evict_normal lines).
SGL_DEVICE L2Policy l2_evict_last_policy() {
  L2Policy policy{0};
  if constexpr (kHasL2CacheHints) {
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy.bits));
  }
  return policy;
}

/// Every line the access touches becomes evict_normal (the default priority): a store under this
/// policy returns lines an evict_last load marked to the default.
SGL_DEVICE L2Policy l2_evict_normal_policy() {
  L2Policy policy{0};
  if constexpr (kHasL2CacheHints) {
    asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(policy.bits));
  }
  return policy;
}

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

  /// load(ptr, offset) with an L2 eviction priority for the lines it touches. `ptr` must point to
  /// global memory. 2-, 4-, 8- and 16-byte vectors (other sizes do not compile, so that a hinted
  /// load is never paired with an unhinted store by accident); below SM80 a plain load. The asm
  /// is a compiler barrier for the front end; ptxas schedules it like any global load (after a PDL
  /// wait or barrier it follows in the code, in order with same-address accesses of the thread).
  SGL_DEVICE void load(const void* ptr, int64_t offset, L2Policy policy) {
    static_assert(sizeof(storage_type) >= 2 && sizeof(storage_type) <= 16, "L2-policy load: 2 to 16 bytes");
    const storage_type* src = static_cast<const storage_type*>(ptr) + offset;
    storage_type* dst = reinterpret_cast<storage_type*>(data);
    if constexpr (!kHasL2CacheHints) {
      (void)policy;
      *dst = *src;
    } else if constexpr (sizeof(storage_type) == 16) {
      asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                   : "=r"(dst->x), "=r"(dst->y), "=r"(dst->z), "=r"(dst->w)
                   : "l"(src), "l"(policy.bits)
                   : "memory");
    } else if constexpr (sizeof(storage_type) == 8) {
      asm volatile("ld.global.L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;"
                   : "=r"(dst->x), "=r"(dst->y)
                   : "l"(src), "l"(policy.bits)
                   : "memory");
    } else if constexpr (sizeof(storage_type) == 4) {
      asm volatile("ld.global.L2::cache_hint.u32 %0, [%1], %2;" : "=r"(*dst) : "l"(src), "l"(policy.bits) : "memory");
    } else if constexpr (sizeof(storage_type) == 2) {
      asm volatile("ld.global.L2::cache_hint.u16 %0, [%1], %2;" : "=h"(*dst) : "l"(src), "l"(policy.bits) : "memory");
    }
  }

  /// store(ptr, offset) with an L2 eviction priority for the lines it touches; same rules as the
  /// policy load (global memory, 2/4/8/16-byte vectors, a plain store below SM80).
  SGL_DEVICE void store(void* ptr, int64_t offset, L2Policy policy) const {
    static_assert(sizeof(storage_type) >= 2 && sizeof(storage_type) <= 16, "L2-policy store: 2 to 16 bytes");
    storage_type* dst = static_cast<storage_type*>(ptr) + offset;
    const storage_type* src = reinterpret_cast<const storage_type*>(data);
    if constexpr (!kHasL2CacheHints) {
      (void)policy;
      *dst = *src;
    } else if constexpr (sizeof(storage_type) == 16) {
      asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(dst),
                   "r"(src->x),
                   "r"(src->y),
                   "r"(src->z),
                   "r"(src->w),
                   "l"(policy.bits)
                   : "memory");
    } else if constexpr (sizeof(storage_type) == 8) {
      asm volatile(
          "st.global.L2::cache_hint.v2.u32 [%0], {%1, %2}, %3;" ::"l"(dst), "r"(src->x), "r"(src->y), "l"(policy.bits)
          : "memory");
    } else if constexpr (sizeof(storage_type) == 4) {
      asm volatile("st.global.L2::cache_hint.u32 [%0], %1, %2;" ::"l"(dst), "r"(*src), "l"(policy.bits) : "memory");
    } else if constexpr (sizeof(storage_type) == 2) {
      asm volatile("st.global.L2::cache_hint.u16 [%0], %1, %2;" ::"l"(dst), "h"(*src), "l"(policy.bits) : "memory");
    }
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
