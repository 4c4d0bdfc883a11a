// Decode floor probe (driver: probe_decode_floor.py), shaped like rmsnorm [rows, 4096] bf16 and
// nothing more: one CTA per row of 512 / kVecs threads, each loading kVecs 16-byte vectors of x
// and of the weight after the PDL wait, a warp reduction, a cross-warp sum through shared memory
// (LDS.128 when there are >= 4 warps), scale, store. No strides, tails, options or validation:
// the driver checks the result against an fp32 reference. What it measured: docs/perf_notes.md
// ("Decode floor, measured with the same bytes", "Our decode kernel against the bare probe").
#pragma once
#include <sgl_kernel/tensor.h>  // For tvm::ffi::TensorView

#include <sgl_kernel/type.cuh>   // For device::cast
#include <sgl_kernel/utils.cuh>  // For LaunchKernel, SGL_DEVICE, bf16_t, fp32_t, pdl_wait_primary, pdl_launch_dependents
#include <sgl_kernel/vec.cuh>    // For AlignedVector
#include <sgl_kernel/warp.cuh>   // For warp::reduce_sum

#include <cstdint>
#include <cstring>

namespace {

constexpr int kProbeHidden = 4096;  // elements per row
constexpr int kProbeRowVecs = 512;  // 16-byte vectors per row (4096 bf16)

/// 16-byte load through the coherent path (plain ld.global, as the norm kernels compile to), for
/// comparison with the restrict-const loads (LDG.CONSTANT) the probe compiles to otherwise.
SGL_DEVICE void load_plain(device::AlignedVector<bf16_t, 8>& v, const bf16_t* p, int index) {
  uint4 u;
  asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
               : "l"(reinterpret_cast<const uint4*>(p) + index));
  memcpy(&v, &u, 16);
}

/// Thread t's kVecs vectors of a row: vector t + j * kThreads for j < kVecs (coalesced per j).
template <int kVecs, int kThreads, bool kPlain>
SGL_DEVICE void load_row_vectors(device::AlignedVector<bf16_t, 8> (&v)[kVecs], const bf16_t* row, int t) {
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if constexpr (kPlain) {
      load_plain(v[j], row, t + j * kThreads);
    } else {
      v[j].load(row, t + j * kThreads);
    }
  }
}

/// One row per CTA. x, out: [rows, 4096]; w: [4096] (w_row_stride 0: every CTA reads the same
/// weight) or [rows, 4096] (w_row_stride 4096: a weight copy per CTA).
template <int kVecs, bool kPlain>
__global__ void row_probe_kernel(
    const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, bf16_t* __restrict__ out, int64_t w_row_stride) {
  using vec_t = device::AlignedVector<bf16_t, 8>;
  constexpr int kThreads = kProbeRowVecs / kVecs;
  constexpr int kWarps = kThreads / 32;
  __shared__ alignas(16) float smem[32];
  const int t = threadIdx.x;
  const bf16_t* x_row = x + int64_t{blockIdx.x} * kProbeHidden;  // [4096]
  bf16_t* out_row = out + int64_t{blockIdx.x} * kProbeHidden;    // [4096]
  const bf16_t* w_row = w + int64_t{blockIdx.x} * w_row_stride;  // [4096]
  device::pdl_wait_primary();
  device::pdl_launch_dependents();
  vec_t xv[kVecs], wv[kVecs];
  load_row_vectors<kVecs, kThreads, kPlain>(xv, x_row, t);  // all of x's loads, then the weight's
  load_row_vectors<kVecs, kThreads, kPlain>(wv, w_row, t);
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float f = device::cast<fp32_t>(xv[j][i]);
      sum = fmaf(f, f, sum);
    }
  }
  sum = device::warp::reduce_sum<float>(sum);
  if constexpr (kWarps > 1) {
    if (t % 32 == 0) smem[t / 32] = sum;
    __syncthreads();
    float total = 0.f;
    if constexpr (kWarps >= 4) {
#pragma unroll
      for (int i = 0; i < kWarps / 4; ++i) {
        const float4 a = reinterpret_cast<const float4*>(smem)[i];
        total += (a.x + a.y) + (a.z + a.w);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kWarps; ++i) total += smem[i];
    }
    sum = total;
  }
  const float scale = rsqrtf(sum * (1.0f / kProbeHidden) + 1e-6f);
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    vec_t y;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      y[i] = device::cast<bf16_t>(device::cast<fp32_t>(xv[j][i]) * scale * device::cast<fp32_t>(wv[j][i]));
    }
    y.store(out_row, t + j * kThreads);
  }
}

/// out = rmsnorm(x) * w per row, with PDL. out, x: [rows, 4096] bf16 contiguous; w: [4096] or
/// [rows, 4096] (see w_row_stride). code: vectors per thread in {1, 2, 4, 8, 16} (512 / code
/// threads per CTA), or 102 for 256 x 2 with plain ld.global loads.
void row_probe(
    tvm::ffi::TensorView out, tvm::ffi::TensorView x, tvm::ffi::TensorView w, int64_t code, int64_t w_row_stride) {
  const auto* x_ptr = static_cast<const bf16_t*>(x.data_ptr());
  const auto* w_ptr = static_cast<const bf16_t*>(w.data_ptr());
  auto* out_ptr = static_cast<bf16_t*>(out.data_ptr());
  const auto rows = static_cast<uint32_t>(x.size(0));
  const int64_t vecs = code == 102 ? 2 : code;
  host::LaunchKernel launch(rows, static_cast<uint32_t>(kProbeRowVecs / vecs), x.device());
  launch.enable_pdl(true);
  switch (code) {
    case 1:
      return launch(row_probe_kernel<1, false>, x_ptr, w_ptr, out_ptr, w_row_stride);
    case 2:
      return launch(row_probe_kernel<2, false>, x_ptr, w_ptr, out_ptr, w_row_stride);
    case 102:
      return launch(row_probe_kernel<2, true>, x_ptr, w_ptr, out_ptr, w_row_stride);
    case 4:
      return launch(row_probe_kernel<4, false>, x_ptr, w_ptr, out_ptr, w_row_stride);
    case 8:
      return launch(row_probe_kernel<8, false>, x_ptr, w_ptr, out_ptr, w_row_stride);
    default:
      return launch(row_probe_kernel<16, false>, x_ptr, w_ptr, out_ptr, w_row_stride);
  }
}

}  // namespace
