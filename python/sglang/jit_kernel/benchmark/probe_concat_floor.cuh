// concat_mla_k floor probe (driver: probe_concat_floor.py): the op's read / write byte mix with the
// simplest access pattern. src holds 2n 16-byte vectors, dst 3n; warp w reads src vectors
// [64w, 64w + 64) (lane l: 64w + l and 64w + 32 + l, both loads first) and writes dst vectors
// [96w, 96w + 96) (lane l: 96w + l, + 32 + l, + 64 + l: its first, second and first again), so one
// launch reads 2 bytes for every 3 it writes, contiguous on both sides, every warp access 512
// contiguous bytes (full sectors), with no index arithmetic beyond t: concat_mla_k's
// [T, 128, 192] <- [T, 128, 128] bf16 mix (the [T, 1, 64] rope rows, 1/384 of the bytes, left out).
// What it bounds: the DRAM rate of a write-heavy (3:2) stream, against the 1 GiB copy's 1:1. (The
// first version, thread t on vectors 2t, 2t + 1 and 3t .. 3t + 2, wrote half-sectors per
// instruction and ran at 65 % of copy: it bounded nothing.)
#pragma once
#include <sgl_kernel/tensor.h>  // For tvm::ffi::TensorView
#include <sgl_kernel/utils.h>   // For RuntimeCheck

#include <sgl_kernel/utils.cuh>  // For LaunchKernel, SGL_DEVICE

#include <cstdint>

namespace {

__global__ void __launch_bounds__(256) concat_floor_kernel(const uint4* src, uint4* dst, int64_t pairs) {
  const int64_t t = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (t >= pairs) return;  // pairs is a multiple of 32 (host-checked): whole warps
  const int64_t warp_first = t & ~int64_t{31};
  const int64_t lane = t & 31;
  const uint4* s = src + 2 * warp_first;
  uint4* d = dst + 3 * warp_first;
  const uint4 a = s[lane];
  const uint4 b = s[32 + lane];
  d[lane] = a;
  d[32 + lane] = b;
  d[64 + lane] = a;
}

/// concat_floor(src, dst): src contiguous with 2n 16-byte vectors, dst contiguous with 3n (any dtype;
/// the driver passes bf16 [T, 128, 128] and [T, 128, 192]).
void concat_floor(tvm::ffi::TensorView src, tvm::ffi::TensorView dst) {
  int64_t src_bytes = 2, dst_bytes = 2;  // bf16
  for (int i = 0; i < src.ndim(); ++i) src_bytes *= src.size(i);
  for (int i = 0; i < dst.ndim(); ++i) dst_bytes *= dst.size(i);
  host::RuntimeCheck(
      src_bytes % 1024 == 0 && dst_bytes * 2 == src_bytes * 3, "concat_floor: sizes ", src_bytes, ", ", dst_bytes);
  const int64_t pairs = src_bytes / 32;
  if (pairs == 0) return;
  const auto blocks = static_cast<uint32_t>((pairs + 255) / 256);
  host::LaunchKernel(blocks, 256, src.device())(
      concat_floor_kernel, static_cast<const uint4*>(src.data_ptr()), static_cast<uint4*>(dst.data_ptr()), pairs);
}

}  // namespace
