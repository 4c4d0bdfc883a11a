// Compile smoke test for include/sgl_kernel: includes every header, instantiates every template for
// fp16/bf16/fp32 in device and host code, compiles the tutorial's Step 1 scale.cuh verbatim, and
// exports TVM-FFI functions that check_headers.py calls (host-side checks run without a GPU).
//
// Build (see check_headers.py, which runs this):
//   nvcc -std=c++20 -O3 --expt-relaxed-constexpr -Xcompiler -fPIC -shared
//        -gencode=arch=compute_90,code=sm_90 -DSGL_CUDA_ARCH=900
//        -I python/sglang/jit_kernel/include -I <tvm_ffi include> smoke.cu -o smoke.so
//        -L<tvm_ffi lib> -ltvm_ffi -L<cuda>/lib64 -lcudart
#include <sgl_kernel/tensor.h>  // For TensorMatcher, SymbolicSize, SymbolicDType, SymbolicDevice, data_ptr
#include <sgl_kernel/utils.h>   // For Panic, RuntimeCheck, div_ceil, irange, pointer::offset

#include <sgl_kernel/atomic.cuh>   // For atomic::max
#include <sgl_kernel/cta.cuh>      // For cta::reduce_max, cta::reduce_sum, cta::reduce_max_nonneg
#include <sgl_kernel/math.cuh>     // For math::max/min/abs/sqrt/rsqrt/exp/sin/cos
#include <sgl_kernel/runtime.cuh>  // For runtime::get_blocks_per_sm, get_sm_count, get_cc_major
#include <sgl_kernel/tile.cuh>     // For tile::Memory
#include <sgl_kernel/type.cuh>     // For dtype_trait, packed_t, cast
#include <sgl_kernel/utils.cuh>    // For LaunchKernel, SGL_DEVICE, load_as, store_as, pdl_*, aliases
#include <sgl_kernel/vec.cuh>      // For AlignedVector
#include <sgl_kernel/warp.cuh>     // For warp::reduce_sum, warp::reduce_max, warp::reduce_max_nonneg

#include <cmath>
#include <cstdint>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>
#include <type_traits>

// The tutorial's Step 1 code, copied verbatim (defines scale<T> in an anonymous namespace).
#include "../../../../../test/tutorial_verbatim/scale.cuh"  // the tutorial's Step 1, verbatim

// ------------------------------------------------------------------------------------------------
// Compile-time checks
// ------------------------------------------------------------------------------------------------

static_assert(std::is_same_v<packed_t<fp16_t>, fp16x2_t>);
static_assert(std::is_same_v<packed_t<bf16_t>, bf16x2_t>);
static_assert(std::is_same_v<packed_t<fp32_t>, fp32x2_t>);
static_assert(std::is_same_v<packed_t<fp8_e4m3_t>, fp8x2_e4m3_t>);
static_assert(device::kWarpThreads == 32);
static_assert(sizeof(device::AlignedVector<bf16_t, 8>) == 16 && alignof(device::AlignedVector<bf16_t, 8>) == 16);
static_assert(device::AlignedVector<fp32_t, 4>::size() == 4);
static_assert(host::div_ceil(4097, 256) == 17);
static_assert(host::div_ceil(uint32_t{0}, 8u) == 0);
static_assert(
    host::div_ceil(int64_t{4096}, 256) == 16 && std::is_same_v<decltype(host::div_ceil(int64_t{1}, 2)), int64_t>);
static_assert(host::dtype_equal(host::dl_dtype_v<bf16_t>, DLDataType{kDLBfloat, 16, 1}));
static_assert(host::dtype_equal(host::dl_dtype_v<fp16_t>, DLDataType{kDLFloat, 16, 1}));
static_assert(host::dtype_equal(host::dl_dtype_v<fp8_e4m3_t>, DLDataType{kDLFloat8_e4m3fn, 8, 1}));
static_assert([] {
  int64_t total = 0;
  for (auto i : host::irange(5)) total += i;              // 0+1+2+3+4
  for (auto i : host::irange(2, int64_t{4})) total += i;  // 2+3
  for (auto i : host::irange(3, 1)) total += 100 * i;     // empty
  return total;
}() == 15);

// ------------------------------------------------------------------------------------------------
// Device: one kernel touching every device API
// ------------------------------------------------------------------------------------------------

namespace {

constexpr uint32_t kSmokeThreads = 256;
constexpr int kNumResults = 16;

struct SmokeParams {
  const void* src;  // [n] of T
  void* dst;        // [n] of T, dst = |src| in T
  float* results;   // [kNumResults] fp32, results[2] pre-filled with -inf by the caller
  int64_t n;
};

// Launched with one CTA of kSmokeThreads threads. Writes:
//   results[0] = sum(src) (fp32), results[1] = max|src|, results[2] = max(src) via atomic::max,
//   results[3] = warp sum of lane ids (496), results[4] = 16-lane sum at lane 16 (376),
//   results[5] = warp max of lane ids (31), results[6..13] = math on T(0.5) in T, results[14] =
//   packed round trip of (1.5, -2.25), results[15] = load_as/store_as/pointer::offset probe (42).
template <typename T>
__global__ void smoke_kernel(const SmokeParams params) {
  using namespace device;
  using vec_t = AlignedVector<T, 16 / sizeof(T)>;
  __shared__ float smem[kSmokeThreads / kWarpThreads];
  __shared__ float smem_max[kSmokeThreads / kWarpThreads];
  __shared__ float smem_max_bits[kSmokeThreads / kWarpThreads];

  pdl_wait_primary();

  float sum = 0.0f, max_abs = 0.0f, max_val = -INFINITY;
  const auto vec_mem = tile::Memory<vec_t>::cta();
  const int64_t n_vecs = params.n / static_cast<int64_t>(vec_t::size());
  for (int64_t k = 0; vec_mem.in_bound(n_vecs, k); ++k) {
    vec_t v = vec_mem.load(params.src, k);
    vec_t out;
    out.fill(dtype_trait<T>::from(0.0f));
#pragma unroll
    for (std::size_t i = 0; i < vec_t::size(); ++i) {
      const float x = cast<fp32_t>(v[i]);
      sum += x;
      max_abs = math::max(max_abs, math::abs(x));
      max_val = math::max<fp32_t>(max_val, x);
      out[i] = math::abs(v[i]);
    }
    vec_mem.store(params.dst, out, k);
  }
  const auto mem = tile::Memory<T>(threadIdx.x, blockDim.x);
  for (int64_t k = 0;; ++k) {  // scalar tail
    const int64_t i = n_vecs * static_cast<int64_t>(vec_t::size()) + mem.index(k);
    if (i >= params.n) break;
    const T x = load_as<T>(params.src, i);
    sum += cast<fp32_t>(x);
    max_abs = math::max(max_abs, math::abs(cast<fp32_t>(x)));
    max_val = math::max(max_val, cast<fp32_t>(x));
    store_as<T>(params.dst, math::abs(x), i);
  }

  cta::reduce_sum(sum, smem);
  cta::reduce_max(max_abs, smem_max, 0.0f);
  cta::reduce_max_nonneg(max_abs, smem_max_bits);  // the same value (max_abs >= 0, never NaN)
  atomic::max(&params.results[2], max_val);
  __syncthreads();

  const uint32_t lane = threadIdx.x % kWarpThreads;
  const float lane_sum = warp::reduce_sum(static_cast<float>(lane));
  const float half_sum = warp::reduce_sum<float, 16>(static_cast<float>(lane));
  const float lane_max = warp::reduce_max(static_cast<float>(lane));
  const float lane_max_bits = warp::reduce_max_nonneg(static_cast<float>(lane));
  const T lane_max_t = warp::reduce_max(cast<T>(static_cast<float>(lane)));
  const T lane_sum_t = warp::reduce_sum<T, 4>(cast<T>(1.0f));

  if (threadIdx.x == 0) {
    params.results[0] = smem[0];
    params.results[1] = fmaxf(smem_max[0], smem_max_bits[0]);
    params.results[3] = lane_sum;
    params.results[5] =
        lane_max + (cast<fp32_t>(lane_max_t) - 31.0f) + (cast<fp32_t>(lane_sum_t) - 4.0f) + (lane_max_bits - 31.0f);
    const T h = cast<T>(0.5f);
    params.results[6] = cast<fp32_t>(math::exp(h));
    params.results[7] = cast<fp32_t>(math::sqrt(h));
    params.results[8] = cast<fp32_t>(math::rsqrt(h));
    params.results[9] = cast<fp32_t>(math::sin(h));
    params.results[10] = cast<fp32_t>(math::cos(h));
    params.results[11] = cast<fp32_t>(math::min(h, cast<T>(-1.0f)));
    params.results[12] = cast<fp32_t>(math::abs(cast<T>(-3.0f)));
    params.results[13] = cast<fp32_t>(dtype_trait<T>::max(h, dtype_trait<T>::from(2)));
    // packed round trip: fp32x2 -> packed_t<T> -> fp32x2 (exact for these values)
    const packed_t<T> p = cast<packed_t<T>>(fp32x2_t{1.5f, -2.25f});
    const fp32x2_t q = cast<fp32x2_t, packed_t<T>>(math::max(p, p));
    params.results[14] = q.x + q.y;  // -0.75
    // load_as / store_as / pointer::offset on a scratch int in shared memory
    __shared__ int scratch[4];
    store_as<int>(pointer::offset(static_cast<void*>(scratch), sizeof(int)), 42, 1);  // scratch[2]
    params.results[15] = static_cast<float>(load_as<int>(pointer::offset(static_cast<const void*>(scratch), 8)));
  }
  if (threadIdx.x == 16) params.results[4] = half_sum;

  pdl_launch_dependents();
}

// Host launcher for smoke_kernel; exercises TensorMatcher, SymbolicDType dispatch, LaunchKernel
// (device form, smem, PDL) and the runtime queries.
template <typename T>
void smoke(tvm::ffi::TensorView dst, tvm::ffi::TensorView src, tvm::ffi::TensorView results) {
  using namespace host;
  // validate
  SymbolicSize N{"num_elements"};
  SymbolicDevice device_;
  device_.set_options<kDLCUDA>();
  TensorMatcher({N}).with_dtype<T>().with_device<kDLCUDA>(device_).verify(src, "src").verify(dst, "dst");
  TensorMatcher({kNumResults}).with_dtype<fp32_t>().with_device<kDLCUDA>(device_).verify(results, "results");
  // unwrap
  const int64_t n = N.unwrap();
  const DLDevice device = device_.unwrap();
  RuntimeCheck(n > 0, "smoke: num_elements must be > 0, got ", n);
  // configure
  static const uint32_t occupancy = runtime::get_blocks_per_sm(smoke_kernel<T>, kSmokeThreads);
  const uint32_t num_sm = runtime::get_sm_count(device.device_id);
  RuntimeCheck(occupancy > 0 && num_sm > 0 && runtime::get_cc_major(device.device_id) >= 9, "smoke needs SM90");
  const SmokeParams params{data_ptr<const void>(src), data_ptr(dst), data_ptr<float>(results), n};
  // launch
  LaunchKernel(1, kSmokeThreads, device, /*smem=*/0).enable_pdl(true)(smoke_kernel<T>, params);
}

// ------------------------------------------------------------------------------------------------
// Host-only checks (no GPU needed): each throws a PanicError that Python sees as RuntimeError.
// ------------------------------------------------------------------------------------------------

// [num_tokens, 4096], bf16 or fp16, any device; optional second tensor must share num_tokens.
void match_2d(tvm::ffi::TensorView x) {
  using namespace host;
  SymbolicSize num_tokens{"num_tokens"};
  SymbolicSize hidden_size{"hidden_size"};
  hidden_size.set_value(4096);
  TensorMatcher({num_tokens, hidden_size}).with_dtype<bf16_t, fp16_t>().verify(x, "src");
}

// Same shape symbol across two tensors; default names ("tensor #k").
void match_pair(tvm::ffi::TensorView a, tvm::ffi::TensorView b) {
  using namespace host;
  SymbolicSize N{"num_tokens"}, D{"hidden_size"};
  SymbolicDType dtype;
  dtype.set_options<fp32_t, bf16_t>();
  TensorMatcher({N, D}).with_dtype(dtype).verify(a).verify(b);
  RuntimeCheck(dtype.is_type<fp32_t>() || dtype.is_type<bf16_t>(), "dtype not bound");
}

// Requires CUDA: a CPU tensor fails with "device expected cuda, got cpu:0".
void match_cuda(tvm::ffi::TensorView x) {
  using namespace host;
  SymbolicDevice device;
  TensorMatcher({kAnySize}).with_device<kDLCUDA>(device).verify(x, "x");
}

// Explicit strides [S, 1] with a fixed 2nd dim of 8; returns the bound row stride.
int64_t match_strided(tvm::ffi::TensorView x) {
  using namespace host;
  SymbolicSize S{"row_stride"};
  TensorMatcher({-1, 8}).with_strides({S, 1}).with_dtype<fp32_t>().verify(x, "x");
  return S.unwrap();
}

// Contiguity (default) check.
void match_contiguous(tvm::ffi::TensorView x) {
  using namespace host;
  TensorMatcher({-1, -1}).verify(x, "x");
}

// Panic / RuntimeCheck / unwrap of an unbound symbol, selected by `which`.
int64_t raise_error(int64_t which) {
  using namespace host;
  if (which == 0) Panic("explicit panic with value ", which);
  RuntimeCheck(which != 1, "runtime check with value ", which);
  if (which == 2) return SymbolicSize{"unbound_size"}.unwrap();
  if (which == 3) LaunchKernel(0, 256, DLDevice{kDLCUDA, 0})(smoke_kernel<fp32_t>, SmokeParams{});
  if (which == 4) LaunchKernel(dim3(1, 0), 256, cudaStream_t{nullptr})(smoke_kernel<fp32_t>, SmokeParams{});
  if (which == 5) RuntimeDeviceCheck(cudaErrorInvalidValue);
  return which;
}

// utils.h arithmetic: div_ceil + irange + pointer::offset, returned as one number.
int64_t utils_probe(int64_t a, int64_t b) {
  int64_t total = host::div_ceil(a, b);  // ceil(a / b)
  for (auto i : host::irange(b)) total += i;
  static char buffer[64];
  const void* p = host::pointer::offset(static_cast<const void*>(buffer), 3, int64_t{5}, 2u);
  total += static_cast<const char*>(p) - buffer;  // + 10
  void* q = host::pointer::offset(static_cast<void*>(buffer), -0);
  total += static_cast<char*>(q) - buffer;  // + 0
  return total;
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(scale_fp16, (scale<fp16_t>));
TVM_FFI_DLL_EXPORT_TYPED_FUNC(scale_bf16, (scale<bf16_t>));
TVM_FFI_DLL_EXPORT_TYPED_FUNC(scale_fp32, (scale<fp32_t>));
TVM_FFI_DLL_EXPORT_TYPED_FUNC(smoke_fp16, (smoke<fp16_t>));
TVM_FFI_DLL_EXPORT_TYPED_FUNC(smoke_bf16, (smoke<bf16_t>));
TVM_FFI_DLL_EXPORT_TYPED_FUNC(smoke_fp32, (smoke<fp32_t>));
TVM_FFI_DLL_EXPORT_TYPED_FUNC(match_2d, match_2d);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(match_pair, match_pair);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(match_cuda, match_cuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(match_strided, match_strided);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(match_contiguous, match_contiguous);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(raise_error, raise_error);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(utils_probe, utils_probe);
