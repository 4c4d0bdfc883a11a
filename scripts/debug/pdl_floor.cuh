// Decode-latency floor probes: one CTA, PDL wait + trigger, then nothing / load+store / +block reduce.
#pragma once
#include <sgl_kernel/tensor.h>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/vec.cuh>
#include <sgl_kernel/warp.cuh>
#include <sgl_kernel/type.cuh>

namespace {

template <int kMode>
__global__ void floor_kernel(const bf16_t* __restrict__ in, bf16_t* __restrict__ out) {
  using vec_t = device::AlignedVector<bf16_t, 8>;
  __shared__ float smem[32];
  device::pdl_wait_primary();
  device::pdl_launch_dependents();
  if constexpr (kMode == 0) {
    return;
  } else {
    vec_t x;
    x.load(in, threadIdx.x);
    float scale = 2.0f;
    if constexpr (kMode >= 2) {
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float f = device::cast<fp32_t>(x[i]);
        s = fmaf(f, f, s);
      }
      s = device::warp::reduce_sum<float>(s);
      if constexpr (kMode == 2) {
        if (threadIdx.x % 32 == 0) smem[threadIdx.x / 32] = s;
        __syncthreads();
        s = threadIdx.x % 32 < blockDim.x / 32 ? smem[threadIdx.x % 32] : 0.f;
        s = device::warp::reduce_sum<float>(s);
      }
      scale = rsqrtf(s * (1.0f / 4096) + 1e-6f);
    }
    vec_t y;
#pragma unroll
    for (int i = 0; i < 8; ++i) y[i] = device::cast<bf16_t>(device::cast<fp32_t>(x[i]) * scale);
    y.store(out, threadIdx.x);
  }
}

// mode 0: empty; 1: load+store; 2: load + block reduce + store; 3: load + warp reduce + store.
void floor_probe(tvm::ffi::TensorView out, tvm::ffi::TensorView in, int64_t mode, int64_t threads, int64_t pdl) {
  const DLDevice device = in.device();
  auto* i = static_cast<const bf16_t*>(in.data_ptr());
  auto* o = static_cast<bf16_t*>(out.data_ptr());
  host::LaunchKernel launch(1, static_cast<uint32_t>(threads), device);
  launch.enable_pdl(pdl != 0);
  switch (mode) {
    case 0: return launch(floor_kernel<0>, i, o);
    case 1: return launch(floor_kernel<1>, i, o);
    case 2: return launch(floor_kernel<2>, i, o);
    default: return launch(floor_kernel<3>, i, o);
  }
}

}  // namespace
