// Access-pattern probes for the fused add's bytes at [rows, 4096] bf16: read x and r, write
// r' = round(x + r) and x' = round(r' * s) (s = rsqrt of the row's mean square when reducing, else
// a constant), in place (x' over x, r' over r) or into separate buffers. Which pattern, load / store
// cache policy and work split keeps in-place writes at the copy rate?
//   kMode 0: one CTA per 4096-element row, kThreads x kVecs 16-byte vectors (our norm kernels);
//   kMode 1: flat elementwise, each CTA kThreads x kVecs consecutive vectors (torch's pattern).
//   kFour: 4 streams (the fused add); otherwise 2 (x -> x', rmsnorm's bytes).
//   kLoad:  0 ld.global, 1 L2 evict_first policy, 2 ld.global.cs, 3 L2 evict_last policy.
//   kStore: 0 st.global, 1 st.global.cs, 2 L2 evict_first policy, 3 L2 evict_last policy.
#pragma once
#include <sgl_kernel/tensor.h>
#include <sgl_kernel/type.cuh>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/vec.cuh>
#include <sgl_kernel/warp.cuh>

#include <cooperative_groups.h>

namespace {

template <int kLoad>
SGL_DEVICE uint4 probe_load(const uint4* p, uint64_t policy) {
  uint4 u;
  if constexpr (kLoad == 0) {
    asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w) : "l"(p));
  } else if constexpr (kLoad == 2) {
    asm volatile("ld.global.cs.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w) : "l"(p));
  } else {
    asm volatile("ld.global.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w) : "l"(p), "l"(policy));
  }
  return u;
}

template <int kStore>
SGL_DEVICE void probe_store(uint4* p, uint4 u, uint64_t policy) {
  if constexpr (kStore == 0) {
    asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(u.x), "r"(u.y), "r"(u.z), "r"(u.w) : "memory");
  } else if constexpr (kStore == 1) {
    asm volatile("st.global.cs.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(u.x), "r"(u.y), "r"(u.z), "r"(u.w) : "memory");
  } else {
    asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1,%2,%3,%4}, %5;" ::"l"(p), "r"(u.x), "r"(u.y), "r"(u.z),
                 "r"(u.w), "l"(policy)
                 : "memory");
  }
}

template <int kHint>
SGL_DEVICE uint64_t probe_policy() {
  uint64_t policy = 0;
  if constexpr (kHint == 1 || kHint == 2) {
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  } else if constexpr (kHint == 3) {
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  }
  return policy;
}

SGL_DEVICE float2 bf2_to_f2(uint32_t bits) {
  return make_float2(__uint_as_float(bits << 16), __uint_as_float(bits & 0xffff0000u));
}

SGL_DEVICE uint32_t f2_to_bf2(float2 f) {
  const bf16x2_t p = __float22bfloat162_rn(f);
  uint32_t u;
  memcpy(&u, &p, 4);
  return u;
}

SGL_DEVICE uint4 add4(uint4 a, uint4 b) {
  auto add = [](uint32_t x, uint32_t y) {
    const float2 fx = bf2_to_f2(x), fy = bf2_to_f2(y);
    return f2_to_bf2(make_float2(fx.x + fy.x, fx.y + fy.y));
  };
  return make_uint4(add(a.x, b.x), add(a.y, b.y), add(a.z, b.z), add(a.w, b.w));
}

SGL_DEVICE uint4 scale4(uint4 a, float s) {
  auto mul = [s](uint32_t x) {
    const float2 f = bf2_to_f2(x);
    return f2_to_bf2(make_float2(f.x * s, f.y * s));
  };
  return make_uint4(mul(a.x), mul(a.y), mul(a.z), mul(a.w));
}

SGL_DEVICE float sumsq4(uint4 a) {
  float s = 0.f;
  for (uint32_t u : {a.x, a.y, a.z, a.w}) {
    const float2 f = bf2_to_f2(u);
    s = fmaf(f.x, f.x, fmaf(f.y, f.y, s));
  }
  return s;
}

/// PDL wait, then this thread's kVecs vectors of x (and of r with kFour) at base + threadIdx.x +
/// j * kThreads under load policy kLoad.
template <int kThreads, int kVecs, bool kFour, int kLoad>
SGL_DEVICE void probe_wait_and_load(const uint4* x, const uint4* r, int64_t base, uint4 (&xv)[kVecs],
                                    uint4 (&rv)[kVecs]) {
  const uint64_t policy = probe_policy<kLoad>();
  const int64_t first = base + threadIdx.x;
  device::pdl_wait_primary();
  device::pdl_launch_dependents();
#pragma unroll
  for (int j = 0; j < kVecs; ++j) xv[j] = probe_load<kLoad>(x + first + j * kThreads, policy);
  if constexpr (kFour) {
#pragma unroll
    for (int j = 0; j < kVecs; ++j) rv[j] = probe_load<kLoad>(r + first + j * kThreads, policy);
  }
}

template <int kMode, int kThreads, int kVecs, bool kFour, bool kReduce, int kLoad, int kStore>
__global__ void __launch_bounds__(kThreads) stream_probe_kernel(const uint4* x, const uint4* r, uint4* x_out,
                                                                uint4* r_out) {
  __shared__ alignas(16) float smem[32];
  const int t = threadIdx.x;
  // 4096 bf16 = 512 vectors per row.
  const int64_t base = kMode == 0 ? int64_t{blockIdx.x} * 512 : int64_t{blockIdx.x} * kThreads * kVecs;
  const uint64_t store_policy = probe_policy<kStore>();
  uint4 xv[kVecs], rv[kVecs];
  probe_wait_and_load<kThreads, kVecs, kFour, kLoad>(x, r, base, xv, rv);
  if constexpr (kFour) {
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      xv[j] = add4(xv[j], rv[j]);
      probe_store<kStore>(r_out + base + t + j * kThreads, xv[j], store_policy);
    }
  }
  float s = 1.0001f;
  if constexpr (kReduce) {
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < kVecs; ++j) sum += sumsq4(xv[j]);
    sum = device::warp::reduce_sum<float>(sum);
    if (t % 32 == 0) smem[t / 32] = sum;
    __syncthreads();
    float total = 0.f;
#pragma unroll
    for (int i = 0; i < kThreads / 128; ++i) {
      const float4 a = reinterpret_cast<const float4*>(smem)[i];
      total += (a.x + a.y) + (a.z + a.w);
    }
    s = rsqrtf(total * (1.0f / 4096) + 1e-6f);
  }
#pragma unroll
  for (int j = 0; j < kVecs; ++j) probe_store<kStore>(x_out + base + t + j * kThreads, scale4(xv[j], s), store_policy);
}

/// kMode 2: a cluster of 512 / (kThreads * kVecs) CTAs per row, each CTA a slice of it; the row's
/// sum of squares combined through distributed shared memory (four streams, always reduced).
template <int kThreads, int kVecs, int kLoad, int kStore>
__global__ void __launch_bounds__(kThreads) stream_probe_cluster_kernel(const uint4* x, const uint4* r, uint4* x_out,
                                                                        uint4* r_out) {
  constexpr int kCluster = 512 / (kThreads * kVecs);
  __shared__ alignas(16) float smem[32];
  __shared__ float cta_total;
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int t = threadIdx.x;
  const uint32_t rank = cluster.block_rank();
  const int64_t base = int64_t{blockIdx.x / kCluster} * 512 + rank * (kThreads * kVecs);
  const uint64_t store_policy = probe_policy<kStore>();
  uint4 xv[kVecs], rv[kVecs];
  probe_wait_and_load<kThreads, kVecs, true, kLoad>(x, r, base, xv, rv);
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    xv[j] = add4(xv[j], rv[j]);
    probe_store<kStore>(r_out + base + t + j * kThreads, xv[j], store_policy);
    sum += sumsq4(xv[j]);
  }
  sum = device::warp::reduce_sum<float>(sum);
  if (t % 32 == 0) smem[t / 32] = sum;
  __syncthreads();
  if (t == 0) {
    float total = 0.f;
#pragma unroll
    for (int i = 0; i < kThreads / 32; ++i) total += smem[i];
    cta_total = total;
  }
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
  float total = 0.f;
#pragma unroll
  for (int c = 0; c < kCluster; ++c) total += *cluster.map_shared_rank(&cta_total, c);
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");  // done reading the others' smem
  const float s = rsqrtf(total * (1.0f / 4096) + 1e-6f);
#pragma unroll
  for (int j = 0; j < kVecs; ++j) probe_store<kStore>(x_out + base + t + j * kThreads, scale4(xv[j], s), store_policy);
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");  // nobody still reads ours
}

/// Launches the probe, or with query returns registers * 100 + resident CTAs per SM.
template <int kMode, int kThreads, int kVecs, bool kFour, bool kReduce, int kLoad, int kStore>
int64_t launch_stream_probe(const uint4* x, const uint4* r, uint4* xo, uint4* ro, int64_t total_vecs, DLDevice device,
                            bool query) {
  if constexpr (kMode == 2) {
    auto* kernel = stream_probe_cluster_kernel<kThreads, kVecs, kLoad, kStore>;
    if (query) {
      cudaFuncAttributes attr{};
      cudaFuncGetAttributes(&attr, kernel);
      return attr.numRegs * 100;
    }
    cudaLaunchAttribute attrs[2];
    attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[0].val.programmaticStreamSerializationAllowed = 1;
    attrs[1].id = cudaLaunchAttributeClusterDimension;
    attrs[1].val.clusterDim.x = 512 / (kThreads * kVecs);
    attrs[1].val.clusterDim.y = 1;
    attrs[1].val.clusterDim.z = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<uint32_t>(total_vecs / (kThreads * kVecs)));
    config.blockDim = dim3(kThreads);
    config.stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(device.device_type, device.device_id));
    config.attrs = attrs;
    config.numAttrs = 2;
    host::RuntimeDeviceCheck(cudaLaunchKernelEx(&config, kernel, x, r, xo, ro));
    return 0;
  } else {
    auto* kernel = stream_probe_kernel<kMode, kThreads, kVecs, kFour, kReduce, kLoad, kStore>;
    if (query) {
      cudaFuncAttributes attr{};
      cudaFuncGetAttributes(&attr, kernel);
      int blocks = 0;
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, 0);
      return attr.numRegs * 100 + blocks;
    }
    const int64_t per_cta = kMode == 0 ? 512 : kThreads * kVecs;
    host::LaunchKernel launch(static_cast<uint32_t>(total_vecs / per_cta), kThreads, device);
    launch.enable_pdl(true);
    launch(kernel, x, r, xo, ro);
    return 0;
  }
}

// x, r, x_out, r_out: [rows, 4096] bf16 contiguous (x_out may be x, r_out may be r). code:
//   decimal digits MTVFRLS = mode, threads/128 (1, 2, 4), vecs, four streams, reduce, load, store.
int64_t stream_probe(tvm::ffi::TensorView x, tvm::ffi::TensorView r, tvm::ffi::TensorView x_out,
                     tvm::ffi::TensorView r_out, int64_t code, bool query) {
  const DLDevice device = x.device();
  auto* xp = static_cast<const uint4*>(x.data_ptr());
  auto* rp = static_cast<const uint4*>(r.data_ptr());
  auto* xo = static_cast<uint4*>(x_out.data_ptr());
  auto* ro = static_cast<uint4*>(r_out.data_ptr());
  const int64_t total = x.size(0) * 512;
#define PROBE_CASE(M, T, V, F, R, L, S)                                                       \
  case M * 1000000 + (T / 128) * 100000 + V * 10000 + F * 1000 + R * 100 + L * 10 + S:       \
    return launch_stream_probe<M, T, V, F, R, L, S>(xp, rp, xo, ro, total, device, query);
  switch (code) {
    // our pattern: one CTA per row, 256 x 2, four streams, with / without the reduction
    PROBE_CASE(0, 256, 2, 1, 1, 0, 0)
    PROBE_CASE(0, 256, 2, 1, 0, 0, 0)
    PROBE_CASE(0, 256, 2, 1, 1, 0, 1)
    PROBE_CASE(0, 256, 2, 1, 1, 0, 2)
    PROBE_CASE(0, 256, 2, 1, 1, 0, 3)
    PROBE_CASE(0, 256, 2, 1, 1, 1, 0)
    PROBE_CASE(0, 256, 2, 1, 1, 2, 0)
    PROBE_CASE(0, 256, 2, 1, 1, 1, 1)
    PROBE_CASE(0, 256, 2, 1, 1, 3, 2)
    PROBE_CASE(0, 512, 1, 1, 1, 0, 0)
    PROBE_CASE(0, 128, 4, 1, 1, 0, 0)
    // rmsnorm's two streams
    PROBE_CASE(0, 256, 2, 0, 1, 0, 0)
    PROBE_CASE(0, 256, 2, 0, 1, 0, 1)
    PROBE_CASE(0, 256, 2, 0, 1, 1, 0)
    // flat elementwise (torch-like)
    PROBE_CASE(1, 128, 1, 1, 0, 0, 0)
    PROBE_CASE(1, 128, 4, 1, 0, 0, 0)
    PROBE_CASE(1, 256, 2, 1, 0, 0, 0)
    PROBE_CASE(1, 128, 4, 0, 0, 0, 0)
    // wave 2: CTA size vs vectors per thread, evict_last stores, clusters
    PROBE_CASE(1, 64, 1, 1, 0, 0, 0)
    PROBE_CASE(1, 256, 1, 1, 0, 0, 0)
    PROBE_CASE(1, 512, 1, 1, 0, 0, 0)
    PROBE_CASE(1, 128, 2, 1, 0, 0, 0)
    PROBE_CASE(1, 128, 1, 1, 0, 0, 3)
    PROBE_CASE(0, 512, 1, 1, 1, 0, 3)
    PROBE_CASE(0, 512, 1, 1, 0, 0, 0)
    PROBE_CASE(0, 256, 2, 1, 1, 3, 0)
    PROBE_CASE(0, 256, 2, 1, 1, 3, 3)
    PROBE_CASE(0, 128, 4, 1, 1, 0, 3)
    PROBE_CASE(2, 128, 1, 1, 1, 0, 0)
    PROBE_CASE(2, 128, 1, 1, 1, 0, 3)
    PROBE_CASE(2, 256, 1, 1, 1, 0, 0)
    PROBE_CASE(2, 256, 1, 1, 1, 0, 3)
    PROBE_CASE(2, 128, 2, 1, 1, 0, 0)
    default:
      host::RuntimeCheck(false, "stream_probe: unknown code ", code);
  }
  return 0;
#undef PROBE_CASE
}

}  // namespace
