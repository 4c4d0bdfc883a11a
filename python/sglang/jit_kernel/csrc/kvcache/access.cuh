// Shared pieces of the KV-cache kernels (row_scatter, store_cache, store_cache_quant, downcast_fp8,
// concat_mla, rope_fp8_kvcache): the row part,
// launch facts and flat layout of the row scatter, a multiply-shift divider for 32-bit ids, a source
// load that ptxas cannot sink below a later condition, and the caches' aliasing and scale checks. No kernels: a
// launcher that includes this file compiles only its own.
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, SymbolicDevice, kAnySize, verify_no_partial_overlap, verify_no_self_overlap
#include <sgl_kernel/utils.h>  // For RuntimeCheck

#include <sgl_kernel/utils.cuh>  // For SGL_DEVICE, device::kWarpThreads, device::pointer::offset
#include <sgl_kernel/vec.cuh>    // For AlignedVector

#include <cstdint>
#include <dlpack/dlpack.h>
#include <initializer_list>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/optional.h>
#include <utility>

namespace {

/// One part of every row: where the source rows are and where their bytes go in a slot row.
struct RowPart {
  const void* src;     // [num_rows, bytes], rows src_stride bytes apart
  void* dst;           // [num_slots, >= bytes]: this part's first byte in slot 0, rows dst_stride apart
  int64_t src_stride;  // bytes between source rows
  int64_t dst_stride;  // bytes between slot rows
  int64_t num_vecs;    // vectors (of the launch's vector width) per row of this part
  int64_t chunk_vecs;  // vectors per warp chunk: div_ceil(num_vecs, num_split)
};

/// Launch facts of row_scatter.
struct RowScatterConfig {
  static constexpr uint32_t kThreads = 256;                            // threads per block
  static constexpr uint32_t kWarps = kThreads / device::kWarpThreads;  // warps per block
  static constexpr int kUnroll = 4;                                    // vectors in flight per lane
  static constexpr int64_t kMaxBlocks = 1 << 20;                       // grid cap; warps loop
  static constexpr int64_t kFullWarps = 64;                            // resident warps per SM (H100/H200)
  static constexpr int64_t kMaxFlatVecs = int64_t{1} << 31;            // flat kernel: 32-bit vector ids
  static constexpr int kWideVecsPerThread = 2;                         // flat kernel, wide copies
};

/// The quotient n / d of 0 <= n < 2^31 by a divisor 1 <= d < 2^31 fixed at launch, as one 64-bit
/// multiply and a shift: multiplier = floor(2^shift / d) + 1 with shift = 31 + ceil(log2 d). Exact:
/// the multiplier exceeds 2^shift / d by at most 1, so n * multiplier / 2^shift exceeds n / d by at
/// most n / 2^shift < 1 / d (2^shift >= 2^31 * d > n * d), which never reaches the next integer (n /
/// d's fraction is at most 1 - 1 / d). Example: d = 72 gives shift 38, multiplier 3817748708; n = 143 -> 1, 144 -> 2.
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

/// Vector g of the rows laid end to end (the flat layout of row_scatter and store_cache_quant: each
/// row is part 0's vectors, then part 1's): its source row, where its part's slot rows are, and
/// which vector of the part's row it is.
struct FlatVector {
  const void* src;     // the source row of the vector's part (vector `vec` of it)
  void* dst;           // the part's first byte in slot 0
  int64_t dst_stride;  // bytes between the part's slot rows
  uint32_t row;        // the row: entry `row` of the indices
  uint32_t vec;        // the vector within the part's row
  bool second;         // in part 1
};

/// Locates vector g (< 2^31) of rows of `row_vecs` vectors, part 0 holding part0.num_vecs of them;
/// `divider` divides by row_vecs.
SGL_DEVICE FlatVector locate_flat_vector(
    uint32_t g, const RowPart& part0, const RowPart& part1, uint32_t row_vecs, const RowDivider& divider) {
  const uint32_t row = divider.divide(g);
  const uint32_t col = g - row * row_vecs;
  const uint32_t part0_vecs = static_cast<uint32_t>(part0.num_vecs);
  const bool second = col >= part0_vecs;
  // Field by field (not a reference to one of the two parts): keeps kernel params in constant space.
  const int64_t src_stride = second ? part1.src_stride : part0.src_stride;
  return FlatVector{
      .src = device::pointer::offset(second ? part1.src : part0.src, int64_t{row} * src_stride),
      .dst = second ? part1.dst : part0.dst,
      .dst_stride = second ? part1.dst_stride : part0.dst_stride,
      .row = row,
      .vec = second ? col - part0_vecs : col,
      .second = second};
}

/// Loads vector `i` of `src` (a Vec = AlignedVector of 1 to 16 bytes, aligned) with ld.relaxed.gpu:
/// a strong load, which the compiler issues where the code has it. A plain (weak) load whose value
/// only a conditional store uses is sunk under the condition by ptxas, so the source load waits for
/// the index load: two memory latencies instead of one. An empty volatile asm, a "memory" clobber or
/// a cache-qualified load (.nc, .cg, .cs, L1::no_allocate, L2::cache_hint) does not keep it in place;
/// a strong load does. The data is read once, so skipping L1 (strong loads are served by L2) costs
/// nothing.
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

/// Refuses (host::PanicError, before any launch) KV-cache destinations that could corrupt their
/// inputs or each other: a cache sharing memory with any of `sources` (name, tensor), caches whose
/// own slot rows overlap (expanded, row stride 0), or two caches sharing memory.
inline void verify_kv_caches_disjoint(
    const tvm::ffi::TensorView& k_cache,
    const tvm::ffi::TensorView& v_cache,
    std::initializer_list<std::pair<const char*, const tvm::ffi::TensorView*>> sources) {
  for (const auto& [cache_name, cache] : {std::pair{"k_cache", &k_cache}, std::pair{"v_cache", &v_cache}}) {
    for (const auto& [name, source] : sources) {
      host::verify_no_partial_overlap(*cache, cache_name, *source, name, /*allow_same=*/false);
    }
  }
  host::verify_no_self_overlap(k_cache, "k_cache");
  host::verify_no_self_overlap(v_cache, "v_cache");
  host::verify_no_partial_overlap(k_cache, "k_cache", v_cache, "v_cache", /*allow_same=*/false);
}

/// The static scales of a quantizing KV-cache write (store_cache_quant, rope_fp8_kvcache): each of
/// `k_scale` / `v_scale` none or one fp32 on `device` ([1], any stride), given only with its inverse
/// scale at 1 (one of the two), sharing no memory with the caches. Returns the device pointers
/// (nullptr where none is given); refuses anything else with host::PanicError naming `op`.
inline std::pair<const float*, const float*> bind_kv_scales(
    const char* op,
    const tvm::ffi::TensorView& k_cache,
    const tvm::ffi::TensorView& v_cache,
    const tvm::ffi::Optional<tvm::ffi::TensorView>& k_scale,
    const tvm::ffi::Optional<tvm::ffi::TensorView>& v_scale,
    double k_inv_scale,
    double v_inv_scale,
    DLDevice device) {
  using namespace host;
  SymbolicDevice device_;
  device_.set_options<kDLCUDA>();
  device_.set_value(device);
  const float* pointers[2] = {nullptr, nullptr};
  const tvm::ffi::Optional<tvm::ffi::TensorView>* scales[2] = {&k_scale, &v_scale};
  const double inv_scales[2] = {k_inv_scale, v_inv_scale};
  const char* names[2] = {"k_scale", "v_scale"};
  for (int side = 0; side < 2; ++side) {
    if (!scales[side]->has_value()) continue;
    const tvm::ffi::TensorView scale = scales[side]->value();
    TensorMatcher({1}).with_strides({kAnySize}).with_dtype<float>().with_device(device_).verify(scale, names[side]);
    RuntimeCheck(
        inv_scales[side] == 1.0,
        op,
        ": ",
        names[side],
        " and its inv_scale = ",
        inv_scales[side],
        " both given: expected one of the two");
    verify_kv_caches_disjoint(k_cache, v_cache, {{names[side], &scale}});
    pointers[side] = static_cast<const float*>(scale.data_ptr());
  }
  return {pointers[0], pointers[1]};
}

}  // namespace
