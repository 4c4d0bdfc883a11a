// Shared device helpers of the KV-cache kernels (row_scatter, downcast_fp8): a multiply-shift
// divider for 32-bit ids and a source load that ptxas cannot sink below a later condition.
#pragma once

#include <sgl_kernel/utils.cuh>  // For SGL_DEVICE
#include <sgl_kernel/vec.cuh>    // For AlignedVector

#include <cstdint>

namespace {

/// The quotient n / d of 0 <= n < 2^31 by a divisor 1 <= d < 2^31 fixed at launch, as one 64-bit
/// multiply and a shift: multiplier = floor(2^shift / d) + 1 with shift = 31 + ceil(log2 d). Exact:
/// the multiplier exceeds 2^shift / d by at most 1, so n * multiplier / 2^shift exceeds n / d by
/// less than n * d / 2^shift < 1 / d, which never reaches the next integer (n / d's fraction is at
/// most 1 - 1 / d). Example: d = 72 gives shift 38, multiplier 3817748708; n = 143 -> 1, 144 -> 2.
struct RowDivider {
  uint64_t multiplier;  // floor(2^shift / d) + 1, at most 2^32
  uint32_t shift;       // 31 + ceil(log2 d)

  static RowDivider make(uint32_t d) {
    uint32_t log2_ceil = 0;
    while ((uint64_t{1} << log2_ceil) < d) ++log2_ceil;
    const uint32_t shift = 31 + log2_ceil;
    return RowDivider{.multiplier = (uint64_t{1} << shift) / d + 1, .shift = shift};
  }

  SGL_DEVICE uint32_t divide(uint32_t n) const { return static_cast<uint32_t>((uint64_t{n} * multiplier) >> shift); }
};

/// Loads vector `i` of `src` (a Vec = AlignedVector of 1 to 16 bytes, aligned) with ld.relaxed.gpu:
/// a strong load, which the compiler issues where the code has it. A plain (weak) load whose value
/// only a conditional store uses is sunk under the condition by ptxas, so the source load waits for
/// the index load: two memory latencies instead of one (seen in row_scatter's flat kernel SASS; an
/// empty volatile asm, a "memory" clobber and .nc/.cg/.cs/L1::no_allocate/L2::cache_hint loads were
/// all sunk). The data is read once, so skipping L1 (strong loads are served by L2) costs nothing.
template <typename Vec>
SGL_DEVICE Vec load_issued_here(const void* src, uint32_t i) {
  using storage_t = typename Vec::storage_type;
  constexpr int kBytes = sizeof(storage_t);
  const storage_t* p = static_cast<const storage_t*>(src) + i;
  storage_t raw;
  if constexpr (kBytes == 16) {
    asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(raw.x), "=r"(raw.y), "=r"(raw.z), "=r"(raw.w)
                 : "l"(p));
  } else if constexpr (kBytes == 8) {
    asm volatile("ld.relaxed.gpu.global.v2.u32 {%0, %1}, [%2];" : "=r"(raw.x), "=r"(raw.y) : "l"(p));
  } else if constexpr (kBytes == 4) {
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(raw) : "l"(p));
  } else {
    uint32_t word;  // 1 and 2 bytes: zero-extended into a 32-bit register
    if constexpr (kBytes == 2) {
      asm volatile("ld.relaxed.gpu.global.u16 %0, [%1];" : "=r"(word) : "l"(p));
    } else {
      asm volatile("ld.relaxed.gpu.global.u8 %0, [%1];" : "=r"(word) : "l"(p));
    }
    raw = static_cast<storage_t>(word);
  }
  Vec v;
  *reinterpret_cast<storage_t*>(&v) = raw;
  return v;
}

}  // namespace
