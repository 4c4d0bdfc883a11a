// Occupancy and device-property queries for launch configuration (persistent-kernel sizing).
//
//   host::runtime::get_blocks_per_sm(kernel, block_dim, smem)   occupancy on the current device
//   host::runtime::get_sm_count(device_id)                      SM count (cached per device)
//   host::runtime::get_cc_major(device_id)                      compute capability major (cached)
#pragma once

#include <sgl_kernel/utils.cuh>  // For RuntimeDeviceCheck, detail::cached_device_attribute

#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>
#include <source_location>

namespace host::runtime {

/// Maximum resident blocks per SM of `kernel` with `block_dim` threads and `smem_bytes` dynamic
/// shared memory, on the CURRENT device (cudaOccupancyMaxActiveBlocksPerMultiprocessor).
/// Not cached (the answer depends on the kernel): cache it in a function-local static at the call
/// site, as in `static const uint32_t occ = get_blocks_per_sm(kernel, 256);`.
/// Throws PanicError on CUDA errors.
template <typename... KernelArgs>
[[nodiscard]] inline uint32_t get_blocks_per_sm(
    void (*kernel)(KernelArgs...),
    uint32_t block_dim,
    std::size_t smem_bytes = 0,
    std::source_location loc = std::source_location::current()) {
  int num_blocks = 0;
  RuntimeDeviceCheck(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&num_blocks, kernel, static_cast<int>(block_dim), smem_bytes), loc);
  return static_cast<uint32_t>(num_blocks);
}

/// Number of streaming multiprocessors of CUDA device `device_id` (cached after the first call).
/// Throws PanicError for an invalid device id.
[[nodiscard]] inline uint32_t get_sm_count(int device_id, std::source_location loc = std::source_location::current()) {
  return static_cast<uint32_t>(host::detail::cached_device_attribute<cudaDevAttrMultiProcessorCount>(device_id, loc));
}

/// Compute capability major version of CUDA device `device_id` (9 for H100/H200; cached).
/// Throws PanicError for an invalid device id.
[[nodiscard]] inline int get_cc_major(int device_id, std::source_location loc = std::source_location::current()) {
  return host::detail::cached_device_attribute<cudaDevAttrComputeCapabilityMajor>(device_id, loc);
}

}  // namespace host::runtime
