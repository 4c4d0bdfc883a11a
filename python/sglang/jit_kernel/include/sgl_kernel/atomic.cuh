// Atomic operations missing from CUDA: device::atomic::max and device::atomic::fmax for float.
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

/// Atomically sets *addr = fmaxf(*addr, value) for fp32 in global or shared memory; returns the old
/// value. Unlike max(), NaN is ignored on either side as fmaxf ignores it: a NaN already in *addr is
/// replaced by value, and a NaN value leaves *addr unchanged. A compare-and-swap loop: meant for one
/// update per CTA (a reduction's final value), not for contended per-element use.
SGL_DEVICE float fmax(float* addr, float value) {
  int* word = reinterpret_cast<int*>(addr);
  int old = *reinterpret_cast<volatile int*>(word);
  while (true) {
    const float merged = fmaxf(__int_as_float(old), value);
    if (__float_as_int(merged) == old) return __int_as_float(old);
    const int seen = atomicCAS(word, old, __float_as_int(merged));
    if (seen == old) return __int_as_float(old);
    old = seen;
  }
}

}  // namespace device::atomic
