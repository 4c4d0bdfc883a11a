// Atomic operations missing from CUDA: device::atomic::max for float.
#pragma once

#include <sgl_kernel/utils.cuh>  // For SGL_DEVICE

namespace device::atomic {

/// Atomically sets *addr = max(*addr, value) for fp32 in global or shared memory; returns the old value.
///
/// Bit trick: for non-negative floats (sign bit clear) the int32 bit patterns order like the
/// floats, so atomicMax on int works; for negative floats (sign bit set, including -0.0) the uint32
/// patterns order in reverse, so atomicMin on unsigned works. Mixed signs resolve correctly in both
/// branches. -0.0 counts as smaller than +0.0. NaN inputs (either side) give unspecified results.
SGL_DEVICE float max(float* addr, float value) {
  if (__float_as_int(value) >= 0) {
    return __int_as_float(atomicMax(reinterpret_cast<int*>(addr), __float_as_int(value)));
  }
  return __uint_as_float(atomicMin(reinterpret_cast<unsigned int*>(addr), __float_as_uint(value)));
}

}  // namespace device::atomic
