// Downcast floor probe (driver: probe_downcast_floor.py): downcast_fp8's access pattern and nothing
// more. k, v [T, H, D] contiguous bf16 are read; k_out, v_out [S, H, D] contiguous bytes are written at
// row loc[i] (int64, every entry a valid distinct slot: no bounds test); each output byte is the high
// byte of its bf16 element (truncation: no scale, no division, no rounding). Rows are laid end to end
// as downcast_fp8's flat kernel does (row = 2 * token + 0 for k, 1 for v); H * D must be a power of
// two of at least 512 elements (the row of an element is a shift: no division in the floor). Every load of a thread (loc, sources) is issued before its stores; loads are
// ld.relaxed.gpu (L2, not L1), as the kernel's load_issued_here. Modes (the lane layouts compared):
//   0  "flat layout":  a thread takes 16 elements: two 16-byte loads 16 bytes apart (each warp load
//                      instruction touches every 32-byte sector of a 1 KiB span and uses half of each),
//                      one 16-byte store: the default kernel's layout.
//   1  "coalesced x1": a thread takes 8 elements: one 16-byte load (each warp instruction 512
//                      contiguous bytes), one 8-byte store.
//   2  "coalesced x2": a thread takes vectors lane and lane + 32 of its warp's 64 8-element vectors:
//                      two 16-byte loads, two 8-byte stores, all sectors fully used by every
//                      instruction (the "coalesced" variant's layout).
#pragma once
#include <sgl_kernel/tensor.h>  // For tvm::ffi::TensorView
#include <sgl_kernel/utils.h>   // For RuntimeCheck

#include <sgl_kernel/utils.cuh>  // For LaunchKernel, SGL_DEVICE

#include <cstdint>

namespace {

struct DowncastFloorParams {
  const uint16_t* k;  // [T, row_elems] bf16 bits
  const uint16_t* v;
  uint8_t* k_out;  // [S, row_elems]
  uint8_t* v_out;
  const int64_t* loc;  // [T]
  int64_t row_elems;   // H * D: a power of two, >= 512
  int row_shift;       // log2(row_elems)
  int64_t total;       // 2 * T * row_elems: elements of all rows
};

/// 16 source bytes at `p` through ld.relaxed.gpu (served by L2).
SGL_DEVICE uint4 load_strong16(const void* p) {
  uint4 u;
  asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
               : "l"(p));
  return u;
}

/// The high bytes of the four bf16 in two words -> one word of four bytes.
SGL_DEVICE uint32_t high_bytes(uint32_t a, uint32_t b) { return __byte_perm(a, b, 0x7531); }

/// Element e (a multiple of 8) of the rows laid end to end: its source, token and column.
SGL_DEVICE void locate(const DowncastFloorParams& p, int64_t e, const uint16_t*& src, int64_t& token, int64_t& col) {
  const int64_t row = e >> p.row_shift;
  col = e - (row << p.row_shift);
  token = row >> 1;
  src = ((row & 1) ? p.v : p.k) + token * p.row_elems + col;
}

/// The destination of element e (column col of its row) in slot `slot`.
SGL_DEVICE uint8_t* destination(const DowncastFloorParams& p, int64_t e, int64_t slot, int64_t col) {
  const int64_t row = e >> p.row_shift;
  return ((row & 1) ? p.v_out : p.k_out) + slot * p.row_elems + col;
}

template <int kMode>
__global__ void __launch_bounds__(256) downcast_floor_kernel(const DowncastFloorParams p) {
  const int64_t t = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if constexpr (kMode == 0) {
    const int64_t e = t * 16;
    if (e >= p.total) return;
    const uint16_t* src;
    int64_t token, col;
    locate(p, e, src, token, col);
    const int64_t slot = p.loc[token];
    const uint4 a = load_strong16(src);
    const uint4 b = load_strong16(src + 8);
    const uint4 q{high_bytes(a.x, a.y), high_bytes(a.z, a.w), high_bytes(b.x, b.y), high_bytes(b.z, b.w)};
    *reinterpret_cast<uint4*>(destination(p, e, slot, col)) = q;
  } else if constexpr (kMode == 1) {
    const int64_t e = t * 8;
    if (e >= p.total) return;
    const uint16_t* src;
    int64_t token, col;
    locate(p, e, src, token, col);
    const int64_t slot = p.loc[token];
    const uint4 a = load_strong16(src);
    *reinterpret_cast<uint2*>(destination(p, e, slot, col)) = uint2{high_bytes(a.x, a.y), high_bytes(a.z, a.w)};
  } else {
    const int64_t lane = threadIdx.x & 31;
    const int64_t warp_first = (t - lane) * 16;  // the warp's 64 vectors: 512 elements of one row
    if (warp_first >= p.total) return;
    const int64_t e0 = warp_first + lane * 8;  // and e0 + 256, the same row
    const uint16_t* src;
    int64_t token, col;
    locate(p, e0, src, token, col);
    const int64_t slot = p.loc[token];
    const uint4 a = load_strong16(src);
    const uint4 b = load_strong16(src + 256);
    uint8_t* dst = destination(p, e0, slot, col);
    *reinterpret_cast<uint2*>(dst) = uint2{high_bytes(a.x, a.y), high_bytes(a.z, a.w)};
    *reinterpret_cast<uint2*>(dst + 256) = uint2{high_bytes(b.x, b.y), high_bytes(b.z, b.w)};
  }
}

/// downcast_floor(k, v, k_out, v_out, loc, mode): see the file comment. No validation beyond the
/// row size: the driver passes contiguous bf16 [T, H, D], uint8 [S, H, D] and int64 [T] valid slots.
void downcast_floor(
    tvm::ffi::TensorView k,
    tvm::ffi::TensorView v,
    tvm::ffi::TensorView k_out,
    tvm::ffi::TensorView v_out,
    tvm::ffi::TensorView loc,
    int64_t mode) {
  DowncastFloorParams p{};
  p.k = static_cast<const uint16_t*>(k.data_ptr());
  p.v = static_cast<const uint16_t*>(v.data_ptr());
  p.k_out = static_cast<uint8_t*>(k_out.data_ptr());
  p.v_out = static_cast<uint8_t*>(v_out.data_ptr());
  p.loc = static_cast<const int64_t*>(loc.data_ptr());
  p.row_elems = k.size(1) * k.size(2);
  p.total = 2 * k.size(0) * p.row_elems;
  while ((int64_t{1} << p.row_shift) < p.row_elems) ++p.row_shift;
  host::RuntimeCheck(
      p.row_elems >= 512 && (int64_t{1} << p.row_shift) == p.row_elems,
      "downcast_floor: H * D = ",
      p.row_elems,
      ": expected a power of two >= 512");
  host::RuntimeCheck(mode >= 0 && mode <= 2, "downcast_floor: mode = ", mode, ": expected 0, 1 or 2");
  if (p.total == 0) return;
  const int64_t per_thread = mode == 1 ? 8 : 16;
  const auto blocks = static_cast<uint32_t>((p.total / per_thread + 255) / 256);
  const DLDevice device = k.device();
  if (mode == 0) {
    host::LaunchKernel(blocks, 256, device)(downcast_floor_kernel<0>, p);
  } else if (mode == 1) {
    host::LaunchKernel(blocks, 256, device)(downcast_floor_kernel<1>, p);
  } else {
    host::LaunchKernel(blocks, 256, device)(downcast_floor_kernel<2>, p);
  }
}

}  // namespace
