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

/// 16-byte load through the coherent path (plain ld.global, as the norm kernels compile to), for
/// comparison with the restrict-const loads (LDG.CONSTANT) of the probe.
SGL_DEVICE void load_plain(device::AlignedVector<bf16_t, 8>& v, const bf16_t* p, int index) {
  uint4 u;
  asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
               : "l"(reinterpret_cast<const uint4*>(p) + index));
  memcpy(&v, &u, 16);
}

/// Padding that makes the kernel's parameter block kBytes larger (launch-latency probe).
template <int kBytes>
struct ParamPad {
  int64_t words[kBytes / 8];
};

template <int kVecs, bool kPlain = false, bool kReduce = true, int kPadBytes = 8>
__global__ void row_probe_kernel(const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, bf16_t* __restrict__ out,
                                 int64_t w_row_stride, const ParamPad<kPadBytes> pad) {
  using vec_t = device::AlignedVector<bf16_t, 8>;
  constexpr int kThreads = 512 / kVecs;
  constexpr int kWarps = kThreads / 32;
  __shared__ alignas(16) float smem[32];
  const int t = threadIdx.x;
  const bf16_t* xr = x + blockIdx.x * 4096;
  bf16_t* outr = out + blockIdx.x * 4096;
  w += blockIdx.x * w_row_stride + pad.words[0];  // w_row_stride 0: every CTA reads the same weight; 4096: a copy per CTA
  device::pdl_wait_primary();
  device::pdl_launch_dependents();
  vec_t xv[kVecs], wv[kVecs];
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if constexpr (kPlain) load_plain(xv[j], xr, t + j * kThreads); else xv[j].load(xr, t + j * kThreads);
  }
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if constexpr (kPlain) load_plain(wv[j], w, t + j * kThreads); else wv[j].load(w, t + j * kThreads);
  }
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float f = device::cast<fp32_t>(xv[j][i]);
      s = fmaf(f, f, s);
    }
  }
  if constexpr (kReduce) s = device::warp::reduce_sum<float>(s);
  if constexpr (kReduce && kWarps > 1) {
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

// out, x: [rows, 4096] bf16 contiguous; w: [4096] (or [rows, 4096] with w_row_stride 4096);
// vecs in {1, 2, 4, 8, 16}.
void row_probe(tvm::ffi::TensorView out, tvm::ffi::TensorView x, tvm::ffi::TensorView w, int64_t vecs,
               int64_t w_row_stride) {
  const DLDevice device = x.device();
  auto* xp = static_cast<const bf16_t*>(x.data_ptr());
  auto* wp = static_cast<const bf16_t*>(w.data_ptr());
  auto* op = static_cast<bf16_t*>(out.data_ptr());
  const uint32_t rows = static_cast<uint32_t>(x.size(0));
  host::LaunchKernel launch(rows, static_cast<uint32_t>(512 / (vecs % 100)), device);
  launch.enable_pdl(true);
  const ParamPad<8> pad8{};
  const ParamPad<256> pad256{};
  const ParamPad<512> pad512{};
  switch (vecs) {
    case 302: return launch(row_probe_kernel<2, false, true, 256>, xp, wp, op, w_row_stride, pad256);  // +256 B of parameters
    case 402: return launch(row_probe_kernel<2, false, true, 512>, xp, wp, op, w_row_stride, pad512);  // +512 B
    case 1: return launch(row_probe_kernel<1>, xp, wp, op, w_row_stride, pad8);
    case 2: return launch(row_probe_kernel<2>, xp, wp, op, w_row_stride, pad8);
    case 102: return launch(row_probe_kernel<2, true>, xp, wp, op, w_row_stride, pad8);
    case 202: return launch(row_probe_kernel<2, false, false>, xp, wp, op, w_row_stride, pad8);  // no reduction
    case 4: return launch(row_probe_kernel<4>, xp, wp, op, w_row_stride, pad8);
    case 8: return launch(row_probe_kernel<8>, xp, wp, op, w_row_stride, pad8);
    default: return launch(row_probe_kernel<16>, xp, wp, op, w_row_stride, pad8);
  }
}

}  // namespace
