// downcast_fp8: k_out[loc[i] * mult + offset] = fp8_e4m3(clamp(k[i] / k_scale, -448, 448)), and the
// same for v, for every token i.
//
// Rounding path (what the tests hold bit for bit against torch): x is widened to fp32 exactly, divided
// by the fp32 scale with a correctly rounded division (__fdiv_rn: no reciprocal is formed), and the
// quotient is rounded once to e4m3, to nearest even, saturating at +-448 (cvt.rn.satfinite, which
// equals the clamp followed by the rounding). +-inf -> +-448; NaN -> 0x7F whatever its sign.
// The original rounds 1 / scale and the product to the input dtype first; the two agree bit for bit
// when the scale is a power of two (both extra roundings are exact then), and otherwise can differ
// by one e4m3 step near a rounding midpoint.
//
// Destination rows whose slot loc[i] * mult + offset (exact, 128-bit) lies outside [0, num_slots)
// are skipped: nothing is written out of bounds and there is no device trap.
//
// Work unit: one thread converts one vector (kVec elements of one head) of up to kMaxRowsPerThread
// rows; a row is (token, k or v), k and v of a token adjacent. The source loads do not depend on loc,
// so they are in flight together with the loc load. Moves num_tokens * H * D * 2 * (sizeof(T) + 1)
// bytes, plus loc.
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, Symbolic{Size,DType,Device}, verify_no_{partial,self}_overlap
#include <sgl_kernel/utils.h>   // For div_ceil, RuntimeCheck

#include <sgl_kernel/runtime.cuh>  // For runtime::get_sm_count
#include <sgl_kernel/utils.cuh>    // For LaunchKernel, SGL_DEVICE, fp16_t, bf16_t, fp8_e4m3_t, pointer::offset
#include <sgl_kernel/vec.cuh>      // For AlignedVector

#include <algorithm>
#include <cstdint>
#include <cuda_fp8.h>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

namespace {

/// One of k / v: its source rows, destination rows and scale.
struct DowncastSide {
  const void* src;           // [num_tokens, num_heads, head_dim] of T
  void* dst;                 // [num_slots, num_heads, head_dim] e4m3 bytes
  const float* scale;        // [1], on the device
  int64_t src_token_stride;  // elements of T
  int64_t src_head_stride;   // elements of T
  int64_t dst_token_stride;  // bytes
  int64_t dst_head_stride;   // bytes
};

/// Kernel arguments of downcast_fp8.
struct DowncastFp8Params {
  DowncastSide k;
  DowncastSide v;
  const void* loc;  // [num_tokens] int32 or int64, loc_stride elements apart
  int64_t loc_stride;
  int64_t num_tokens;
  int64_t num_slots;  // valid destination rows: [0, num_slots)
  int64_t mult;
  int64_t offset;
  uint32_t vecs_per_head;    // head_dim / kVec
  uint32_t vecs_per_row;     // num_heads * vecs_per_head
  uint32_t span;             // threads per row in a block: min(vecs_per_row, kThreads)
  uint32_t rows_per_pass;    // rows a block covers at once: kThreads / span
  uint32_t chunks_per_row;   // blocks along a row: div_ceil(vecs_per_row, kThreads)
  uint32_t rows_per_thread;  // 1 .. kMaxRowsPerThread
  bool int32_loc;
};

/// Launch facts of downcast_fp8.
struct DowncastFp8Config {
  static constexpr uint32_t kThreads = 256;
  static constexpr uint32_t kMaxRowsPerThread = 4;   // vectors in flight per thread at large sizes
  static constexpr int64_t kResidentThreads = 2048;  // per SM (H100/H200)
};

/// The destination row of `token`, or -1 when loc * mult + offset is outside [0, num_slots).
SGL_DEVICE int64_t destination_row(const DowncastFp8Params& p, int64_t token) {
  const int64_t i = token * p.loc_stride;
  const int64_t loc =
      p.int32_loc ? int64_t{static_cast<const int32_t*>(p.loc)[i]} : static_cast<const int64_t*>(p.loc)[i];
  const __int128 slot = static_cast<__int128>(loc) * p.mult + p.offset;  // exact: no wrap-around into range
  return (slot >= 0 && slot < p.num_slots) ? static_cast<int64_t>(slot) : int64_t{-1};
}

/// e4m3 byte of fp32 `y`: RNE, saturating at +-448 (= clamp then round); NaN -> 0x7F.
SGL_DEVICE uint8_t e4m3_byte(float y) {
  const auto b = static_cast<uint8_t>(__nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3));
  return y != y ? uint8_t{0x7F} : b;
}

/// kVec elements of T -> kVec e4m3 bytes of x / scale (pairs through cvt.rn.satfinite.e4m3x2).
template <typename T, int kVec>
SGL_DEVICE device::AlignedVector<uint8_t, kVec> downcast(const device::AlignedVector<T, kVec>& x, float scale) {
  device::AlignedVector<uint8_t, kVec> q;
  if constexpr (kVec == 1) {
    q[0] = e4m3_byte(__fdiv_rn(static_cast<float>(x[0]), scale));
  } else {
#pragma unroll
    for (int i = 0; i < kVec; i += 2) {
      const float2 y{__fdiv_rn(static_cast<float>(x[i]), scale), __fdiv_rn(static_cast<float>(x[i + 1]), scale)};
      const auto pair = static_cast<uint16_t>(__nv_cvt_float2_to_fp8x2(y, __NV_SATFINITE, __NV_E4M3));
      q[i] = y.x != y.x ? uint8_t{0x7F} : static_cast<uint8_t>(pair & 0xFF);
      q[i + 1] = y.y != y.y ? uint8_t{0x7F} : static_cast<uint8_t>(pair >> 8);
    }
  }
  return q;
}

/// Block b covers rows [(b / chunks_per_row) * rows_per_block, ...) and vectors [(b % chunks_per_row)
/// * kThreads, ...) of each; thread t takes row t / span (+ u * rows_per_pass) and vector t % span.
template <typename T, int kVec>
__global__ void __launch_bounds__(DowncastFp8Config::kThreads) downcast_fp8_kernel(const DowncastFp8Params p) {
  constexpr uint32_t kThreads = DowncastFp8Config::kThreads;
  constexpr uint32_t kMaxRows = DowncastFp8Config::kMaxRowsPerThread;
  using in_vec = device::AlignedVector<T, kVec>;

  const uint32_t row_in_pass = threadIdx.x / p.span;
  const uint32_t block_rows = blockIdx.x / p.chunks_per_row;
  const uint32_t vec = (blockIdx.x - block_rows * p.chunks_per_row) * kThreads + (threadIdx.x - row_in_pass * p.span);
  if (row_in_pass >= p.rows_per_pass || vec >= p.vecs_per_row) return;
  const uint32_t head = vec / p.vecs_per_head;
  const uint32_t head_vec = vec - head * p.vecs_per_head;
  const int64_t num_rows = 2 * p.num_tokens;
  const int64_t first_row = int64_t{block_rows} * p.rows_per_pass * p.rows_per_thread + row_in_pass;

  in_vec x[kMaxRows];
#pragma unroll
  for (uint32_t u = 0; u < kMaxRows; ++u) {
    const int64_t row = first_row + int64_t{u} * p.rows_per_pass;
    if (u < p.rows_per_thread && row < num_rows) {
      const DowncastSide& s = (row & 1) ? p.v : p.k;
      const auto* src = static_cast<const T*>(s.src) + (row >> 1) * s.src_token_stride + head * s.src_head_stride;
      x[u].load(src, head_vec);
    }
  }
#pragma unroll
  for (uint32_t u = 0; u < kMaxRows; ++u) {
    const int64_t row = first_row + int64_t{u} * p.rows_per_pass;
    if (u < p.rows_per_thread && row < num_rows) {
      const DowncastSide& s = (row & 1) ? p.v : p.k;
      const int64_t slot = destination_row(p, row >> 1);
      if (slot >= 0) {
        void* dst = device::pointer::offset(s.dst, slot * s.dst_token_stride + head * s.dst_head_stride);
        downcast<T, kVec>(x[u], *s.scale).store(dst, head_vec);
      }
    }
  }
}

/// Widest vector (8, 4, 2 or 1 elements) that head_dim, every data pointer and every stride of a
/// dim of more than one element is a multiple of (sources in elements of 2 bytes, outputs in bytes).
inline int downcast_fp8_vector(const DowncastFp8Params& p, int64_t head_dim, int64_t num_heads) {
  const auto address = [](const void* ptr, int64_t unit) {
    return static_cast<uint64_t>(reinterpret_cast<std::uintptr_t>(ptr)) / static_cast<uint64_t>(unit);
  };
  uint64_t bits = 8 | static_cast<uint64_t>(head_dim);
  for (const DowncastSide* s : {&p.k, &p.v}) {
    bits |= address(s->src, 2) | address(s->dst, 1);
    if (p.num_tokens > 1) bits |= static_cast<uint64_t>(s->src_token_stride);
    if (p.num_slots > 1) bits |= static_cast<uint64_t>(s->dst_token_stride);
    if (num_heads > 1) bits |= static_cast<uint64_t>(s->src_head_stride | s->dst_head_stride);
  }
  return static_cast<int>(bits & (~bits + 1));  // the lowest set bit: at most 8
}

/// Verifies `t` as [rows, num_heads, head_dim] with the last stride 1 and the others free.
inline void verify_heads(
    tvm::ffi::TensorView t,
    const char* name,
    host::SymbolicSize& rows,
    host::SymbolicSize& heads,
    host::SymbolicSize& dim,
    host::SymbolicSize& token_stride,
    host::SymbolicSize& head_stride,
    host::SymbolicDType& dtype,
    host::SymbolicDevice& device) {
  host::TensorMatcher({rows, heads, dim})
      .with_strides({token_stride, head_stride, 1})
      .with_dtype(dtype)
      .with_device(device)
      .verify(t, name);
}

/// downcast_fp8(k, v, k_out, v_out, k_scale, v_scale, loc, mult, offset).
///
/// T: fp16_t or bf16_t. k, v [num_tokens, num_heads, head_dim] of T; k_out, v_out [num_slots,
/// num_heads, head_dim] uint8 or fp8 e4m3 (the bytes); token and head strides free, last stride 1.
/// k_scale, v_scale [1] float32; loc [num_tokens] int32 or int64, any stride. One CUDA device; the
/// outputs share no memory with any input. Throws PanicError (Python RuntimeError) before any launch
/// on a mismatch; nothing is launched for 0 tokens, 0 slots or empty rows.
template <typename T>
void downcast_fp8(
    tvm::ffi::TensorView k,
    tvm::ffi::TensorView v,
    tvm::ffi::TensorView k_out,
    tvm::ffi::TensorView v_out,
    tvm::ffi::TensorView k_scale,
    tvm::ffi::TensorView v_scale,
    tvm::ffi::TensorView loc,
    int64_t mult,
    int64_t offset) {
  using namespace host;
  using Config = DowncastFp8Config;

  // Validate
  SymbolicSize num_tokens{"num_tokens"}, num_heads{"num_heads"}, head_dim{"head_dim"}, num_slots{"num_slots"};
  SymbolicSize k_ts{"k_token_stride"}, k_hs{"k_head_stride"}, v_ts{"v_token_stride"}, v_hs{"v_head_stride"};
  SymbolicSize ko_ts{"k_out_token_stride"}, ko_hs{"k_out_head_stride"};
  SymbolicSize vo_ts{"v_out_token_stride"}, vo_hs{"v_out_head_stride"}, loc_stride{"loc_stride"};
  SymbolicDType src_dtype, out_dtype, loc_dtype;
  src_dtype.set_options<T>();
  out_dtype.set_options<uint8_t, fp8_e4m3_t>();
  loc_dtype.set_options<int32_t, int64_t>();
  SymbolicDevice device_;
  device_.set_options<kDLCUDA>();
  verify_heads(k, "k", num_tokens, num_heads, head_dim, k_ts, k_hs, src_dtype, device_);
  verify_heads(v, "v", num_tokens, num_heads, head_dim, v_ts, v_hs, src_dtype, device_);
  verify_heads(k_out, "k_out", num_slots, num_heads, head_dim, ko_ts, ko_hs, out_dtype, device_);
  verify_heads(v_out, "v_out", num_slots, num_heads, head_dim, vo_ts, vo_hs, out_dtype, device_);
  TensorMatcher({1}).with_dtype<float>().with_device(device_).verify(k_scale, "k_scale").verify(v_scale, "v_scale");
  TensorMatcher({num_tokens}).with_strides({loc_stride}).with_dtype(loc_dtype).with_device(device_).verify(loc, "loc");
  const tvm::ffi::TensorView* inputs[] = {&k, &v, &loc, &k_scale, &v_scale};
  const char* input_names[] = {"k", "v", "loc", "k_scale", "v_scale"};
  for (int i = 0; i < 5; ++i) {
    verify_no_partial_overlap(k_out, "k_out", *inputs[i], input_names[i], /*allow_same=*/false);
    verify_no_partial_overlap(v_out, "v_out", *inputs[i], input_names[i], /*allow_same=*/false);
  }
  verify_no_partial_overlap(k_out, "k_out", v_out, "v_out", /*allow_same=*/false);
  verify_no_self_overlap(k_out, "k_out");
  verify_no_self_overlap(v_out, "v_out");

  // Unwrap
  DowncastFp8Params p{};
  p.k = DowncastSide{
      k.data_ptr(),
      k_out.data_ptr(),
      static_cast<const float*>(k_scale.data_ptr()),
      k_ts.unwrap(),
      k_hs.unwrap(),
      ko_ts.unwrap(),
      ko_hs.unwrap()};
  p.v = DowncastSide{
      v.data_ptr(),
      v_out.data_ptr(),
      static_cast<const float*>(v_scale.data_ptr()),
      v_ts.unwrap(),
      v_hs.unwrap(),
      vo_ts.unwrap(),
      vo_hs.unwrap()};
  p.loc = loc.data_ptr();
  p.loc_stride = loc_stride.unwrap();
  p.num_tokens = num_tokens.unwrap();
  p.num_slots = num_slots.unwrap();
  p.mult = mult;
  p.offset = offset;
  p.int32_loc = loc_dtype.is_type<int32_t>();
  const int64_t heads = num_heads.unwrap(), dim = head_dim.unwrap();
  const DLDevice device = device_.unwrap();
  if (p.num_tokens == 0 || p.num_slots == 0 || heads == 0 || dim == 0) return;

  // Configure: the vector width; rows of a block; more rows per thread past one wave of threads
  const int vec = downcast_fp8_vector(p, dim, heads);
  const int64_t vecs_per_row = heads * (dim / vec);
  RuntimeCheck(
      vecs_per_row < (int64_t{1} << 31),
      "downcast_fp8: num_heads * head_dim = ",
      heads * dim,
      " elements per token: expected fewer than 2^31 vectors of ",
      vec);
  p.vecs_per_head = static_cast<uint32_t>(dim / vec);
  p.vecs_per_row = static_cast<uint32_t>(vecs_per_row);
  p.span = static_cast<uint32_t>(std::min<int64_t>(vecs_per_row, Config::kThreads));
  p.rows_per_pass = Config::kThreads / p.span;
  p.chunks_per_row = static_cast<uint32_t>(div_ceil(vecs_per_row, int64_t{Config::kThreads}));
  const int64_t num_rows = 2 * p.num_tokens;
  const int64_t resident = int64_t{runtime::get_sm_count(device.device_id)} * Config::kResidentThreads;
  const bool one_wave = num_rows * vecs_per_row <= resident;
  p.rows_per_thread = one_wave ? 1 : Config::kMaxRowsPerThread;
  const int64_t blocks = div_ceil(num_rows, int64_t{p.rows_per_pass} * p.rows_per_thread) * p.chunks_per_row;
  RuntimeCheck(
      blocks < (int64_t{1} << 31),
      "downcast_fp8: ",
      p.num_tokens,
      " tokens of ",
      heads * dim,
      " elements need ",
      blocks,
      " blocks: expected fewer than 2^31");

  // Launch
  const auto launch = [&](auto kernel) {
    LaunchKernel(static_cast<uint32_t>(blocks), Config::kThreads, device)(kernel, p);
  };
  switch (vec) {
    case 8:
      return launch(downcast_fp8_kernel<T, 8>);
    case 4:
      return launch(downcast_fp8_kernel<T, 4>);
    case 2:
      return launch(downcast_fp8_kernel<T, 2>);
    default:
      return launch(downcast_fp8_kernel<T, 1>);
  }
}

}  // namespace
