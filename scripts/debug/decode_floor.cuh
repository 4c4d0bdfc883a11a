// Decode floor probes shaped like rmsnorm [rows, 4096] bf16: one CTA per row of 4096 / 8 / kVecs
// threads, each loading kVecs 16-byte vectors of x and of the weight after the PDL wait, a warp
// reduction, a cross-warp sum through shared memory (LDS.128 when >= 4 warps), scale, store.
#pragma once
#include <sgl_kernel/tensor.h>
#include <sgl_kernel/type.cuh>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/vec.cuh>
#include <sgl_kernel/warp.cuh>

namespace {

template <int kVecs>
__global__ void row_probe_kernel(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, bf16_t* __restrict__ out) {
  using vec_t = device::AlignedVector<bf16_t, 8>;
  constexpr int kThreads = 512 / kVecs;
  constexpr int kWarps = kThreads / 32;
  __shared__ alignas(16) float smem[32];
  const int t = threadIdx.x;
  const bf16_t* xr = x + blockIdx.x * 4096;
  bf16_t* outr = out + blockIdx.x * 4096;
  device::pdl_wait_primary();
  device::pdl_launch_dependents();
  vec_t xv[kVecs], wv[kVecs];
#pragma unroll
  for (int j = 0; j < kVecs; ++j) xv[j].load(xr, t + j * kThreads);
#pragma unroll
  for (int j = 0; j < kVecs; ++j) wv[j].load(w, t + j * kThreads);
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float f = device::cast<fp32_t>(xv[j][i]);
      s = fmaf(f, f, s);
    }
  }
  s = device::warp::reduce_sum<float>(s);
  if constexpr (kWarps > 1) {
    if (t % 32 == 0) smem[t / 32] = s;
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
    s = total;
  }
  const float scale = rsqrtf(s * (1.0f / 4096) + 1e-6f);
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    vec_t y;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      y[i] = device::cast<bf16_t>(device::cast<fp32_t>(xv[j][i]) * scale * device::cast<fp32_t>(wv[j][i]));
    }
    y.store(outr, t + j * kThreads);
  }
}

// out, x: [rows, 4096] bf16 contiguous; w: [4096]; vecs in {1, 2, 4, 8, 16}.
void row_probe(tvm::ffi::TensorView out, tvm::ffi::TensorView x, tvm::ffi::TensorView w, int64_t vecs) {
  const DLDevice device = x.device();
  auto* xp = static_cast<const bf16_t*>(x.data_ptr());
  auto* wp = static_cast<const bf16_t*>(w.data_ptr());
  auto* op = static_cast<bf16_t*>(out.data_ptr());
  const uint32_t rows = static_cast<uint32_t>(x.size(0));
  host::LaunchKernel launch(rows, static_cast<uint32_t>(512 / vecs), device);
  launch.enable_pdl(true);
  switch (vecs) {
    case 1: return launch(row_probe_kernel<1>, xp, wp, op);
    case 2: return launch(row_probe_kernel<2>, xp, wp, op);
    case 4: return launch(row_probe_kernel<4>, xp, wp, op);
    case 8: return launch(row_probe_kernel<8>, xp, wp, op);
    default: return launch(row_probe_kernel<16>, xp, wp, op);
  }
}

}  // namespace
