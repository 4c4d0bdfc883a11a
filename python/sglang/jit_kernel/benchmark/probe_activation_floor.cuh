// Gated-activation floor probe (driver: probe_activation_floor.py): silu_and_mul's access pattern with
// the least compute. input [T, 2H] contiguous bf16 (gate | up), out [T, H] contiguous bf16; H a
// multiple of 8 * kVecs. Thread i of the one-shot grid takes kVecs 16-byte vectors of the flattened
// [T, H / 8] vector grid (vectors i * kVecs .. i * kVecs + kVecs - 1, consecutive in a row: a row's
// vector count is a multiple of kVecs), loads every gate and up vector first, then stores
// out = gate + up (8 bf16 adds per vector: the whole compute), so the probe moves silu_and_mul's bytes
// with the same 16-byte accesses and none of its arithmetic. With PDL (mode bit 16) it waits for the
// previous kernel before its first load and releases the next one right after, as the op does. With
// mode bit 32 ("sfu") it computes silu's least arithmetic instead of the add: per element
// round(g * rcp.approx(1 + ex2.approx(-g * log2 e))) * u rounded again (3 fp32 instructions and the two
// MUFU operations every silu(g) = g / (1 + exp(-g)) needs, against the op's 5 and the same 2), so the
// row bounds the op by its bytes plus the special-function unit's work (16 MUFU results per clock
// per SM on sm_90).
// What it bounds: at T = 1 / 64 (a fraction of a wave, L2-resident input in a replayed graph) the
// launch, one load round trip and the store drain; at 2048 / 16384 the bandwidth of L2 / DRAM.
#pragma once
#include <sgl_kernel/tensor.h>  // For tvm::ffi::TensorView
#include <sgl_kernel/utils.h>   // For RuntimeCheck

#include <sgl_kernel/utils.cuh>  // For LaunchKernel, SGL_DEVICE, bf16x2_t, pdl_wait_primary

#include <cstdint>

namespace {

struct ActFloorParams {
  const uint4* input;  // [T, 2 * vecs_per_row] 16-byte vectors
  uint4* out;          // [T, vecs_per_row]
  int64_t vecs_per_row;
  int64_t total_vecs;  // T * vecs_per_row
};

/// op(gate pair, up pair) over the four bf16 pairs of two 16-byte vectors.
template <typename Op>
SGL_DEVICE uint4 map_pairs(uint4 a, uint4 b, Op op) {
  uint4 r;
  const auto* x = reinterpret_cast<const __nv_bfloat162*>(&a);
  const auto* y = reinterpret_cast<const __nv_bfloat162*>(&b);
  auto* z = reinterpret_cast<__nv_bfloat162*>(&r);
#pragma unroll
  for (int i = 0; i < 4; ++i) z[i] = op(x[i], y[i]);
  return r;
}

/// Two bf16 adds.
SGL_DEVICE __nv_bfloat162 add2(__nv_bfloat162 x, __nv_bfloat162 y) { return __hadd2(x, y); }

/// Two silu(gate) * up in bf16 with the least arithmetic (ex2.approx, rcp.approx; see the file comment).
SGL_DEVICE __nv_bfloat162 silu_min2(__nv_bfloat162 x, __nv_bfloat162 y) {
  const float2 g = __bfloat1622float2(x);
  const float2 u = __bfloat1622float2(y);
  float e0, e1, r0, r1;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e0) : "f"(g.x * -1.4426950408889634f));
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e1) : "f"(g.y * -1.4426950408889634f));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r0) : "f"(1.0f + e0));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r1) : "f"(1.0f + e1));
  const float2 act = __bfloat1622float2(__floats2bfloat162_rn(g.x * r0, g.y * r1));
  return __floats2bfloat162_rn(act.x * u.x, act.y * u.y);
}

template <int kVecs, bool kPdl, bool kSfu>
__global__ void __launch_bounds__(1024) act_floor_kernel(const ActFloorParams p) {
  const int64_t first = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * kVecs;
  if constexpr (kPdl) device::pdl_wait_primary();
  if constexpr (kPdl) device::pdl_launch_dependents();
  if (first >= p.total_vecs) return;
  const int64_t row = first / p.vecs_per_row;
  const int64_t col = first - row * p.vecs_per_row;
  const uint4* gate = p.input + row * 2 * p.vecs_per_row + col;
  const uint4* up = gate + p.vecs_per_row;
  uint4 g[kVecs], u[kVecs];
#pragma unroll
  for (int v = 0; v < kVecs; ++v) {
    g[v] = gate[v];
    u[v] = up[v];
  }
  uint4* dst = p.out + row * p.vecs_per_row + col;
#pragma unroll
  for (int v = 0; v < kVecs; ++v) dst[v] = kSfu ? map_pairs(g[v], u[v], silu_min2) : map_pairs(g[v], u[v], add2);
}

template <int kVecs, bool kSfu>
void launch_act_floor(const ActFloorParams& p, uint32_t threads, bool pdl, DLDevice device) {
  const int64_t thread_count = (p.total_vecs + kVecs - 1) / kVecs;
  const auto blocks = static_cast<uint32_t>((thread_count + threads - 1) / threads);
  if (pdl) {
    host::LaunchKernel(blocks, threads, device).enable_pdl(true)(act_floor_kernel<kVecs, true, kSfu>, p);
  } else {
    host::LaunchKernel(blocks, threads, device)(act_floor_kernel<kVecs, false, kSfu>, p);
  }
}

template <bool kSfu>
void launch_act_floor_vecs(const ActFloorParams& p, int64_t vecs, uint32_t threads, bool pdl, DLDevice device) {
  if (vecs == 1) {
    launch_act_floor<1, kSfu>(p, threads, pdl, device);
  } else if (vecs == 2) {
    launch_act_floor<2, kSfu>(p, threads, pdl, device);
  } else {
    launch_act_floor<4, kSfu>(p, threads, pdl, device);
  }
}

/// act_floor(input, out, mode, threads): mode = vectors per thread (1, 2 or 4) | 16 for PDL | 32 for
/// silu's least arithmetic instead of the add; threads
/// per CTA in {32, ..., 1024}. No validation beyond the shapes the probe needs: the driver passes
/// contiguous bf16 [T, 2H] and [T, H] with H a multiple of 8 * vectors per thread.
void act_floor(tvm::ffi::TensorView input, tvm::ffi::TensorView out, int64_t mode, int64_t threads) {
  const int64_t vecs = mode & 15;
  const bool pdl = (mode & 16) != 0;
  const bool sfu = (mode & 32) != 0;
  host::RuntimeCheck(
      vecs == 1 || vecs == 2 || vecs == 4, "act_floor: vectors per thread ", vecs, ": expected 1, 2 or 4");
  host::RuntimeCheck(threads >= 32 && threads <= 1024 && threads % 32 == 0, "act_floor: threads = ", threads);
  const int64_t hidden = out.size(1);
  host::RuntimeCheck(hidden % (8 * vecs) == 0, "act_floor: H = ", hidden, ": expected a multiple of ", 8 * vecs);
  ActFloorParams p{};
  p.input = static_cast<const uint4*>(input.data_ptr());
  p.out = static_cast<uint4*>(out.data_ptr());
  p.vecs_per_row = hidden / 8;
  p.total_vecs = out.size(0) * p.vecs_per_row;
  if (p.total_vecs == 0) return;
  const DLDevice device = input.device();
  const auto t = static_cast<uint32_t>(threads);
  if (sfu) {
    launch_act_floor_vecs<true>(p, vecs, t, pdl, device);
  } else {
    launch_act_floor_vecs<false>(p, vecs, t, pdl, device);
  }
}

}  // namespace
