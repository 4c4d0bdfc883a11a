// Device-side utilities and the host kernel launcher.
//
//   fp16_t, bf16_t, fp32_t, fp64_t, fp8_e4m3_t, fp8_e5m2_t     scalar aliases (global namespace)
//   fp16x2_t, bf16x2_t, fp32x2_t, fp8x2_e4m3_t, fp8x2_e5m2_t  packed pairs (global namespace)
//   SGL_DEVICE                      __forceinline__ __device__
//   device::kWarpThreads            32
//   device::load_as / store_as      typed access through void*
//   device::pointer::offset         byte-offset arithmetic in device code
//   device::pdl_wait_primary / pdl_launch_dependents   Programmatic Dependent Launch (SM90+)
//   host::RuntimeDeviceCheck        cudaError_t -> PanicError
//   host::detail::cached_device_attribute   per-device cached cudaDeviceGetAttribute
//   host::LaunchKernel              stream/device resolving, error checking launcher
#pragma once

#include <sgl_kernel/utils.h>  // For PanicError, Panic, RuntimeCheck, detail::panic_at

#include <array>
#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <dlpack/dlpack.h>
#include <source_location>
#include <tvm/ffi/extra/c_env_api.h>
#include <utility>

// ---------------------------------------------------------------------------------------------
// Type aliases (global namespace, as used by kernels and by make_cpp_args on the Python side).
// ---------------------------------------------------------------------------------------------

using fp16_t = __half;                 ///< IEEE binary16.
using bf16_t = __nv_bfloat16;          ///< bfloat16.
using fp32_t = float;                  ///< IEEE binary32.
using fp64_t = double;                 ///< IEEE binary64.
using fp8_e4m3_t = __nv_fp8_e4m3;      ///< FP8 E4M3 (torch.float8_e4m3fn).
using fp8_e5m2_t = __nv_fp8_e5m2;      ///< FP8 E5M2 (torch.float8_e5m2).
using fp16x2_t = __half2;              ///< Two fp16 in one 32-bit register.
using bf16x2_t = __nv_bfloat162;       ///< Two bf16 in one 32-bit register.
using fp32x2_t = float2;               ///< Two fp32 (8 bytes, 8-byte aligned).
using fp8x2_e4m3_t = __nv_fp8x2_e4m3;  ///< Two FP8 E4M3 in 16 bits.
using fp8x2_e5m2_t = __nv_fp8x2_e5m2;  ///< Two FP8 E5M2 in 16 bits.

/// Qualifier for every device helper: inlined, device-only.
#define SGL_DEVICE __forceinline__ __device__

namespace device {

/// Number of threads in a warp on every supported NVIDIA GPU.
inline constexpr uint32_t kWarpThreads = 32;

/// Returns `static_cast<const T*>(ptr)[offset]`; `offset` counts elements of T (not bytes).
/// `ptr + offset` must be aligned to alignof(T).
template <typename T>
SGL_DEVICE T load_as(const void* ptr, int64_t offset = 0) {
  return static_cast<const T*>(ptr)[offset];
}

/// Writes `val` to `static_cast<T*>(ptr)[offset]`; `offset` counts elements of T (not bytes).
/// `ptr + offset` must be aligned to alignof(T).
template <typename T>
SGL_DEVICE void store_as(void* ptr, const T& val, int64_t offset = 0) {
  static_cast<T*>(ptr)[offset] = val;
}

namespace pointer {

/// Returns `ptr` advanced by the sum of `offsets` in BYTES (device version of host::pointer::offset).
template <std::integral... Offsets>
SGL_DEVICE void* offset(void* ptr, Offsets... offsets) {
  return static_cast<char*>(ptr) + (static_cast<int64_t>(0) + ... + static_cast<int64_t>(offsets));
}

/// Const overload: byte offset that keeps the pointer const.
template <std::integral... Offsets>
SGL_DEVICE const void* offset(const void* ptr, Offsets... offsets) {
  return static_cast<const char*>(ptr) + (static_cast<int64_t>(0) + ... + static_cast<int64_t>(offsets));
}

}  // namespace pointer

/// PDL: blocks until the preceding kernel in the stream (the primary) has completed and its memory
/// is visible. Call before the first read of data the primary produces. A no-op below SM90 and when
/// the kernel was not launched with PDL enabled (LaunchKernel::enable_pdl).
SGL_DEVICE void pdl_wait_primary() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/// PDL: signals that the next kernel in the stream (the dependent) may start launching now. Its
/// own pdl_wait_primary() still waits for this kernel to finish. A no-op below SM90.
SGL_DEVICE void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace device

namespace host {

/// Throws a PanicError "CUDA error: <name> (<description>)" naming the caller's file:line when
/// `error != cudaSuccess`. The (non-sticky) last-error state is cleared first so the failure does
/// not resurface in a later unrelated CUDA call (e.g. inside PyTorch).
inline void RuntimeDeviceCheck(cudaError_t error, std::source_location loc = std::source_location::current()) {
  if (error != cudaSuccess) [[unlikely]] {
    (void)cudaGetLastError();
    detail::panic_at(loc, "CUDA error: ", cudaGetErrorName(error), " (", cudaGetErrorString(error), ")");
  }
}

/// Checks (and clears) cudaGetLastError(); throws like RuntimeDeviceCheck(cudaError_t) on failure.
inline void RuntimeDeviceCheck(std::source_location loc = std::source_location::current()) {
  RuntimeDeviceCheck(cudaGetLastError(), loc);
}

namespace detail {

/// Device attribute kAttr of CUDA device `device_id`, queried once and then served from a lock-free
/// per-device cache (0 = not queried yet, so only positive attributes may be cached: SM count,
/// compute capability). Racing first calls may both query; they store the same value. Throws
/// PanicError (at `loc`) for an invalid device id. runtime.cuh's get_sm_count / get_cc_major use it.
template <cudaDeviceAttr kAttr>
[[nodiscard]] inline int cached_device_attribute(int device_id, const std::source_location& loc) {
  constexpr int kMaxDevices = 64;
  static std::array<std::atomic<int>, kMaxDevices> cache{};
  if (device_id >= 0 && device_id < kMaxDevices) {
    const int cached = cache[device_id].load(std::memory_order_relaxed);
    if (cached > 0) return cached;
  }
  int value = 0;
  RuntimeDeviceCheck(cudaDeviceGetAttribute(&value, kAttr, device_id), loc);
  if (device_id >= 0 && device_id < kMaxDevices) cache[device_id].store(value, std::memory_order_relaxed);
  return value;
}

}  // namespace detail

/// One-shot kernel launcher: `LaunchKernel(grid, block, device_or_stream[, smem])(kernel, args...)`.
///
/// - From a `DLDevice` (must be kDLCUDA): the stream is TVM-FFI's current stream for that device
///   (`TVMFFIEnvGetStream`, i.e. torch's current stream when called from PyTorch), and the launch
///   runs with that device current (switched with cudaSetDevice only if it differs, then restored),
///   so a tensor on cuda:1 launches on GPU 1 even while cuda:0 is current.
/// - From a `cudaStream_t`: launches on that stream with whatever device is current.
/// - `grid` / `block` accept anything convertible to dim3. A grid or block with 0 threads/blocks
///   throws a PanicError at construction; callers must return early on empty input.
/// - `.enable_pdl(b)` requests Programmatic Dependent Launch (cudaLaunchAttributeProgrammatic-
///   StreamSerialization); honoured only on a device of compute capability 9.0 or newer, dropped on
///   older ones (A100), so callers need no capability check of their own.
/// - `.cluster(n)` launches thread block clusters; `.cooperative(b)` a cooperative grid (the one
///   cooperative_groups::this_grid().sync() needs).
/// - `operator()(kernel, args...)` launches with cudaLaunchKernelEx (each arg converted to the
///   kernel's parameter type) and throws a PanicError naming the CUDA error and the file:line where
///   the LaunchKernel was constructed; a module without code for the device (built for other
///   architectures) also names the device's compute capability. No device queries happen on the
///   success path.
class LaunchKernel {
 public:
  /// Launch on `device`'s current TVM-FFI stream with `device` made current.
  LaunchKernel(
      dim3 grid,
      dim3 block,
      DLDevice device,
      std::size_t smem_bytes = 0,
      std::source_location loc = std::source_location::current())
      : grid_(grid), block_(block), smem_bytes_(smem_bytes), device_id_(device.device_id), loc_(loc) {
    if (device.device_type != kDLCUDA) [[unlikely]] {
      detail::panic_at(
          loc,
          "LaunchKernel: expected a CUDA device (device_type ",
          static_cast<int>(kDLCUDA),
          "), got device_type ",
          static_cast<int>(device.device_type));
    }
    stream_ = static_cast<cudaStream_t>(TVMFFIEnvGetStream(device.device_type, device.device_id));
    check_config();
  }

  /// Launch on an explicit `stream` with the current device.
  LaunchKernel(
      dim3 grid,
      dim3 block,
      cudaStream_t stream,
      std::size_t smem_bytes = 0,
      std::source_location loc = std::source_location::current())
      : grid_(grid), block_(block), smem_bytes_(smem_bytes), stream_(stream), device_id_(-1), loc_(loc) {
    check_config();
  }

  /// Enables (or disables) Programmatic Dependent Launch for this launch; returns *this for chaining.
  /// The kernel should call device::pdl_wait_primary() before consuming the previous kernel's output.
  /// PDL is set only when the launch device's compute capability is 9.0 or newer (queried once per
  /// device, then cached). The gate is the device at run time, not SGL_CUDA_ARCH: one host binary
  /// serves every target of a multi-arch module ("8.0 9.0" defines SGL_CUDA_ARCH=800, yet must use
  /// PDL on an H100). That is safe because a device of capability >= 9.0 only runs SASS of its own
  /// major version (code=sm_XX, no PTX), whose pdl_wait_primary() is compiled in (__CUDA_ARCH__ >= 900).
  LaunchKernel& enable_pdl(bool enable = true) {
    pdl_ = enable && device_cc_major() >= 9;
    return *this;
  }

  /// Launches the grid as clusters of `size` consecutive CTAs along x (thread block clusters; `size`
  /// in 1..8, the portable maximum, dividing grid.x; 1 launches without clusters); returns *this.
  /// Throws PanicError when size > 1 and the launch device's compute capability is below 9.0: the
  /// caller picks a cluster kernel only for 9.0+ devices (is_cluster_device).
  LaunchKernel& cluster(uint32_t size) {
    if (size < 1 || size > 8 || grid_.x % size != 0) [[unlikely]] {
      detail::panic_at(loc_, "LaunchKernel: cluster size ", size, " must be in 1..8 and divide grid.x = ", grid_.x);
    }
    if (size > 1 && device_cc_major() < 9) [[unlikely]] {
      detail::panic_at(loc_, "LaunchKernel: thread block clusters need compute capability 9.0 or newer");
    }
    cluster_ = size;
    return *this;
  }

  /// Launches the grid cooperatively (or not; returns *this): cudaLaunchAttributeCooperative, which
  /// makes every block co-resident and gives the launch the driver's own grid barrier, so the kernel
  /// may call cooperative_groups::this_grid().sync() (undefined behaviour in a launch without it).
  /// The launch fails (PanicError naming cudaErrorCooperativeLaunchTooLarge) when the grid exceeds
  /// the co-resident blocks (cudaOccupancyMaxActiveBlocksPerMultiprocessor for this block size and
  /// smem, times the SM count), and on a device without cudaDevAttrCooperativeLaunch: the caller
  /// sizes the grid from those queries and checks the attribute. Each launch gets its own barrier,
  /// so concurrent cooperative launches on other streams do not interfere. Not combined with
  /// enable_pdl by any caller yet: whether the driver honours both at once is untested.
  LaunchKernel& cooperative(bool enable = true) {
    cooperative_ = enable;
    return *this;
  }

  /// Whether the launch device can run thread block clusters (compute capability 9.0 or newer).
  bool is_cluster_device() const { return device_cc_major() >= 9; }

  /// Launches `kernel<<<grid, block, smem, stream>>>(args...)`; throws PanicError on launch failure.
  template <typename... KernelArgs, typename... Args>
  void operator()(void (*kernel)(KernelArgs...), Args&&... args) const {
    static_assert(sizeof...(KernelArgs) == sizeof...(Args), "LaunchKernel: argument count mismatch");
    cudaLaunchAttribute attrs[3];
    cudaLaunchConfig_t config{};
    config.gridDim = grid_;
    config.blockDim = block_;
    config.dynamicSmemBytes = smem_bytes_;
    config.stream = stream_;
    config.attrs = attrs;
    config.numAttrs = 0;
    if (pdl_) {
      attrs[config.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attrs[config.numAttrs].val.programmaticStreamSerializationAllowed = 1;
      ++config.numAttrs;
    }
    if (cluster_ > 1) {
      attrs[config.numAttrs].id = cudaLaunchAttributeClusterDimension;
      attrs[config.numAttrs].val.clusterDim.x = cluster_;
      attrs[config.numAttrs].val.clusterDim.y = 1;
      attrs[config.numAttrs].val.clusterDim.z = 1;
      ++config.numAttrs;
    }
    if (cooperative_) {
      attrs[config.numAttrs].id = cudaLaunchAttributeCooperative;
      attrs[config.numAttrs].val.cooperative = 1;
      ++config.numAttrs;
    }
    int previous_device = -1;
    if (device_id_ >= 0) {
      RuntimeDeviceCheck(cudaGetDevice(&previous_device), loc_);
      if (previous_device != device_id_) {
        RuntimeDeviceCheck(cudaSetDevice(device_id_), loc_);
      } else {
        previous_device = -1;  // nothing to restore
      }
    }
    const cudaError_t error = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
    if (previous_device >= 0) {
      (void)cudaSetDevice(previous_device);
    }
    if (error == cudaErrorNoKernelImageForDevice) [[unlikely]] {
      no_image_error();
    }
    RuntimeDeviceCheck(error, loc_);
  }

 private:
  /// Compute capability major of the launch device (the current one for a stream launch).
  int device_cc_major() const {
    int device = device_id_;
    if (device < 0) RuntimeDeviceCheck(cudaGetDevice(&device), loc_);
    return detail::cached_device_attribute<cudaDevAttrComputeCapabilityMajor>(device, loc_);
  }

  /// Throws the error of a launch on a device the module has no code for, naming its capability.
  [[noreturn]] void no_image_error() const {
    (void)cudaGetLastError();
    int device = device_id_, major = 0, minor = 0;
    if (device < 0) (void)cudaGetDevice(&device);
    (void)cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    (void)cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    detail::panic_at(
        loc_,
        "CUDA error: cudaErrorNoKernelImageForDevice: this JIT module has no code for cuda:",
        device,
        " (compute capability ",
        major,
        ".",
        minor,
        "); build it for that GPU (SGLANG_JIT_CUDA_ARCH=",
        major,
        ".",
        minor,
        ", or unset to target the visible GPUs); sglang.jit_kernel supports "
        "compute capability 8.0 and newer");
  }

  void check_config() const {
    const uint64_t num_blocks = uint64_t{grid_.x} * grid_.y * grid_.z;
    const uint64_t num_threads = uint64_t{block_.x} * block_.y * block_.z;
    if (num_blocks == 0) [[unlikely]] {
      detail::panic_at(
          loc_,
          "LaunchKernel: grid has 0 blocks (grid = (",
          grid_.x,
          ", ",
          grid_.y,
          ", ",
          grid_.z,
          ")); return before launching on empty input");
    }
    if (num_threads == 0) [[unlikely]] {
      detail::panic_at(
          loc_, "LaunchKernel: block has 0 threads (block = (", block_.x, ", ", block_.y, ", ", block_.z, "))");
    }
  }

  dim3 grid_;
  dim3 block_;
  std::size_t smem_bytes_;
  cudaStream_t stream_{nullptr};
  int device_id_;  // -1: launch on the current device
  bool pdl_{false};
  uint32_t cluster_{1};  // CTAs per thread block cluster (1: no clusters)
  bool cooperative_{false};
  std::source_location loc_;
};

}  // namespace host
