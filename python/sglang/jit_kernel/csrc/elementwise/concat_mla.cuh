// concat_mla: out[n, h, :] = cat(a[n, h, :], b[n, h or 0, :]) as raw bytes, for the MLA key and
// query assembly (concat_mla_k: k = cat(k_nope, k_rope broadcast over the heads); concat_mla_absorb_q:
// q = cat(q_nope_absorbed, q_rope)).
//
// The row sizes kABytes / kBBytes are compile-time knobs (the module is built per pair; DeepSeek's
// are 256 + 128 for k and 1024 + 128 for q, bf16), so a thread's vector -> (head, part, offset) map
// is a division by a constant. One thread moves one vector of kVecBytes. The b row of a broadcast
// (head stride 0) is read by every head and comes from L1/L2 after the first.
// Moves num_tokens * heads * (2 * (kABytes + kBBytes)) bytes (b once per token when broadcast).
//
// Block order, by token count. Below kTokenMajorMinTokens a 2-D grid: block (x, y) covers token x
// and the y-th kThreads vectors of its heads * row vectors, so even one token spreads over
// heads * row / (kThreads * kVecBytes) blocks (128 heads x 384 bytes: 12 blocks). From
// kTokenMajorMinTokens on a 1-D grid in token-major order (block u: token u / head_blocks, chunk
// u % head_blocks): the 2-D grid dispatches blockIdx.x (the token) fastest, so on a large grid the
// blocks resident together take one 4 KiB chunk from each of ~1000 tokens (48 KiB apart for
// DeepSeek k) and the grid sweeps the tensor head_blocks times (12 for k, 36 for q), re-reading a
// broadcast b each sweep; token-major, they cover consecutive bytes in one sweep. The threshold is
// where token-major measured faster (docs/perf_notes.md, concat_mla).
//
// PDL: the kernel waits for the previous kernel (griddepcontrol.wait) before its first global load
// (a and b may be its output; out may be what it reads) and then releases the next kernel at once,
// so the next launch overlaps this one (norm_rows.cuh's pdl_wait_then_release says why in that order).
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, Symbolic{Size,DType,Device}, verify_no_partial_overlap, verify_no_self_overlap
#include <sgl_kernel/utils.h>  // For RuntimeCheck, div_ceil

#include <sgl_kernel/utils.cuh>  // For LaunchKernel, device::pointer::offset, device::pdl_*
#include <sgl_kernel/vec.cuh>    // For AlignedVector

#include <algorithm>
#include <cstdint>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include "../kvcache/access.cuh"  // For RowDivider

namespace {

/// Kernel arguments of concat_mla; strides in bytes.
struct ConcatMlaParams {
  void* out;      // [num_tokens, num_heads, kABytes + kBBytes]
  const void* a;  // [num_tokens, num_heads, kABytes]
  const void* b;  // [num_tokens, num_heads or 1, kBBytes]; head stride 0 when broadcast
  int64_t out_token_stride, out_head_stride;
  int64_t a_token_stride, a_head_stride;
  int64_t b_token_stride, b_head_stride;
  int64_t num_tokens;
  uint32_t num_heads;
  // Token-major block order (from kTokenMajorMinTokens tokens): 1-D grid, block u -> (token u /
  // head_blocks, chunk u % head_blocks), u < num_units = num_tokens * head_blocks < 2^31; 0 units:
  // the 2-D grid.
  uint32_t head_blocks;
  uint32_t num_units;
  RowDivider unit_divider;  // divides by head_blocks
};

/// Launch facts of concat_mla.
struct ConcatMlaConfig {
  static constexpr uint32_t kThreads = 256;                   // threads per block, one vector each
  static constexpr int64_t kMaxTokenBlocks = (1u << 31) - 1;  // grid.x cap; blocks loop over tokens
  static constexpr int64_t kMaxHeadBlocks = 65535;            // grid.y cap; blocks loop over vectors
  static constexpr int64_t kMaxUnitBlocks = 1 << 20;          // token-major grid cap; blocks loop
  static constexpr int64_t kTokenMajorMinTokens = 1024;       // token-major block order from here on
};

template <int64_t kABytes, int64_t kBBytes, int kVecBytes>
__global__ void __launch_bounds__(ConcatMlaConfig::kThreads) concat_mla_kernel(const ConcatMlaParams params) {
  using vec_t = device::AlignedVector<uint8_t, kVecBytes>;
  constexpr uint32_t kAVecs = kABytes / kVecBytes;
  constexpr uint32_t kRowVecs = (kABytes + kBBytes) / kVecBytes;
  const uint32_t token_vecs = params.num_heads * kRowVecs;  // < 2^32, checked by the launcher
  device::pdl_wait_primary();                               // before the first global load (see the file comment)
  device::pdl_launch_dependents();

  const auto copy_vector = [&](int64_t n, uint32_t i) {
    const uint32_t head = i / kRowVecs;
    const uint32_t col = i - head * kRowVecs;  // vector within the output row
    const bool from_a = col < kAVecs;
    const void* src = from_a  //
                          ? device::pointer::offset(params.a, n * params.a_token_stride, head * params.a_head_stride)
                          : device::pointer::offset(params.b, n * params.b_token_stride, head * params.b_head_stride);
    void* dst = device::pointer::offset(params.out, n * params.out_token_stride, head * params.out_head_stride);
    vec_t v;
    v.load(src, from_a ? col : col - kAVecs);
    v.store(dst, col);
  };

  if (params.num_units > 0) {  // token-major: the blocks running together cover consecutive bytes
    for (uint32_t u = blockIdx.x; u < params.num_units; u += gridDim.x) {  // u + gridDim.x < 2^32
      const uint32_t n = params.unit_divider.divide(u);
      const uint32_t i = (u - n * params.head_blocks) * ConcatMlaConfig::kThreads + threadIdx.x;
      if (i < token_vecs) copy_vector(n, i);
    }
    return;
  }
  for (int64_t n = blockIdx.x; n < params.num_tokens; n += gridDim.x) {
    for (uint32_t i = blockIdx.y * ConcatMlaConfig::kThreads + threadIdx.x; i < token_vecs;
         i += gridDim.y * ConcatMlaConfig::kThreads) {
      copy_vector(n, i);
    }
  }
}

/// From kTokenMajorMinTokens tokens on, the 1-D token-major grid when its units fit 31 bits (else,
/// and below, the 2-D grid).
template <int64_t kABytes, int64_t kBBytes, int kVecBytes>
void launch_concat_mla(ConcatMlaParams params, DLDevice device) {
  using namespace host;
  using Config = ConcatMlaConfig;
  constexpr int64_t kRowVecs = (kABytes + kBBytes) / kVecBytes;
  const int64_t head_blocks = div_ceil(int64_t{params.num_heads} * kRowVecs, int64_t{Config::kThreads});
  dim3 grid(
      static_cast<uint32_t>(std::min(params.num_tokens, Config::kMaxTokenBlocks)),
      static_cast<uint32_t>(std::min(head_blocks, Config::kMaxHeadBlocks)));
  const bool token_major = params.num_tokens >= Config::kTokenMajorMinTokens;
  if (token_major && head_blocks < (int64_t{1} << 31) / params.num_tokens) {
    params.head_blocks = static_cast<uint32_t>(head_blocks);
    params.num_units = static_cast<uint32_t>(params.num_tokens * head_blocks);
    params.unit_divider = RowDivider::make(params.head_blocks);
    grid = dim3(static_cast<uint32_t>(std::min<int64_t>(params.num_units, Config::kMaxUnitBlocks)));
  }
  LaunchKernel(grid, Config::kThreads, device).enable_pdl()(concat_mla_kernel<kABytes, kBBytes, kVecBytes>, params);
}

/// concat_mla<kABytes, kBBytes>(out, a, b): out[n, h] = cat(a[n, h], b[n, h]) (b[n, 0] when b has
/// one head: a broadcast); the block order follows the token count (file comment).
///
/// out [num_tokens, num_heads, out_dim], a [num_tokens, num_heads, a_dim], b [num_tokens, num_heads
/// or 1, b_dim]: one dtype of whole bytes, token and head strides free, last stride 1; a_dim and
/// b_dim of kABytes and kBBytes bytes, out_dim = a_dim + b_dim; one CUDA device; out shares no
/// element with a or b. Throws PanicError (Python RuntimeError) before any launch on a mismatch;
/// nothing is launched for 0 tokens or 0 heads.
template <int64_t kABytes, int64_t kBBytes>
void concat_mla(tvm::ffi::TensorView out, tvm::ffi::TensorView a, tvm::ffi::TensorView b) {
  using namespace host;
  static_assert(kABytes > 0 && kBBytes > 0, "concat_mla: both parts need at least one byte");

  // Validate
  SymbolicSize num_tokens{"num_tokens"}, num_heads{"num_heads"}, b_heads{"b_heads"};
  SymbolicSize out_dim{"out_dim"}, a_dim{"a_dim"}, b_dim{"b_dim"};
  SymbolicSize out_sn{"out_token_stride"}, out_sh{"out_head_stride"};
  SymbolicSize a_sn{"a_token_stride"}, a_sh{"a_head_stride"}, b_sn{"b_token_stride"}, b_sh{"b_head_stride"};
  SymbolicDType dtype;
  SymbolicDevice device_;
  device_.set_options<kDLCUDA>();
  TensorMatcher({num_tokens, num_heads, out_dim})
      .with_strides({out_sn, out_sh, 1})
      .with_dtype(dtype)
      .with_device(device_)
      .verify(out, "out");
  TensorMatcher({num_tokens, num_heads, a_dim})
      .with_strides({a_sn, a_sh, 1})
      .with_dtype(dtype)
      .with_device(device_)
      .verify(a, "a");
  TensorMatcher({num_tokens, b_heads, b_dim})
      .with_strides({b_sn, b_sh, 1})
      .with_dtype(dtype)
      .with_device(device_)
      .verify(b, "b");
  const DLDataType dt = dtype.unwrap();
  RuntimeCheck(dt.bits % 8 == 0 && dt.lanes == 1, "concat_mla: dtype of ", int{dt.bits}, " bits: expected whole bytes");
  const int64_t elem = dt.bits / 8;
  RuntimeCheck(
      a_dim.unwrap() * elem == kABytes && b_dim.unwrap() * elem == kBBytes,
      "concat_mla: rows of ",
      a_dim.unwrap() * elem,
      " + ",
      b_dim.unwrap() * elem,
      " bytes: this module is built for ",
      kABytes,
      " + ",
      kBBytes);
  RuntimeCheck(
      out_dim.unwrap() == a_dim.unwrap() + b_dim.unwrap(),
      "concat_mla: out row of ",
      out_dim.unwrap(),
      " elements: expected a_dim + b_dim = ",
      a_dim.unwrap() + b_dim.unwrap());
  RuntimeCheck(
      b_heads.unwrap() == 1 || b_heads.unwrap() == num_heads.unwrap(),
      "concat_mla: b has ",
      b_heads.unwrap(),
      " heads: expected 1 (broadcast) or num_heads = ",
      num_heads.unwrap());
  // A token's vectors are counted in 32 bits (even with 1-byte vectors, and the loop step added).
  RuntimeCheck(
      num_heads.unwrap() * (kABytes + kBBytes) <= (int64_t{1} << 31),
      "concat_mla: num_heads = ",
      num_heads.unwrap(),
      ": expected at most 2^31 output bytes per token");
  verify_no_partial_overlap(out, "out", a, "a", /*allow_same=*/false);
  verify_no_partial_overlap(out, "out", b, "b", /*allow_same=*/false);
  verify_no_self_overlap(out, "out");

  // Unwrap
  const bool broadcast = b_heads.unwrap() == 1;
  const ConcatMlaParams params{
      .out = out.data_ptr(),
      .a = a.data_ptr(),
      .b = b.data_ptr(),
      .out_token_stride = out_sn.unwrap() * elem,
      .out_head_stride = out_sh.unwrap() * elem,
      .a_token_stride = a_sn.unwrap() * elem,
      .a_head_stride = a_sh.unwrap() * elem,
      .b_token_stride = b_sn.unwrap() * elem,
      .b_head_stride = broadcast ? 0 : b_sh.unwrap() * elem,
      .num_tokens = num_tokens.unwrap(),
      .num_heads = static_cast<uint32_t>(num_heads.unwrap()),
  };
  const DLDevice device = device_.unwrap();
  if (params.num_tokens == 0 || params.num_heads == 0) return;

  // Configure: the widest vector every address, part size and used stride allows
  const auto address = [](const void* p) { return static_cast<uint64_t>(reinterpret_cast<std::uintptr_t>(p)); };
  uint64_t bits = 16 | address(params.out) | address(params.a) | address(params.b) | kABytes | kBBytes;
  if (params.num_tokens > 1) {
    bits |= static_cast<uint64_t>(params.out_token_stride | params.a_token_stride | params.b_token_stride);
  }
  if (params.num_heads > 1) {
    bits |= static_cast<uint64_t>(params.out_head_stride | params.a_head_stride | params.b_head_stride);
  }
  const uint64_t vec_bytes = bits & (~bits + 1);  // the lowest set bit: at most 16

  // Launch
  switch (vec_bytes) {
    case 16:
      return launch_concat_mla<kABytes, kBBytes, 16>(params, device);
    case 8:
      return launch_concat_mla<kABytes, kBBytes, 8>(params, device);
    case 4:
      return launch_concat_mla<kABytes, kBBytes, 4>(params, device);
    case 2:
      return launch_concat_mla<kABytes, kBBytes, 2>(params, device);
    default:
      return launch_concat_mla<kABytes, kBBytes, 1>(params, device);
  }
}

}  // namespace
