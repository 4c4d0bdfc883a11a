// One warp on the host, for topk_rows.cuh's kernels compiled by g++ (test_topk_rows_emulated.py):
// the 32 lanes are ucontext coroutines on one thread, switched round robin at every warp
// collective (shuffle, ballot, reduce_max, __syncwarp), so every lane reaches a collective before
// any lane reads its result, as on the device. Launches run the whole grid as one warp
// (blockDim 32, gridDim 1): the kernels are grid-stride, so every row is still routed, by one warp
// in order. CUDA spellings the kernels use are macros or functions here; expf / tanhf are the host
// libm's (both kernels under test call the same ones). Only what topk_rows.cuh needs.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <dlpack/dlpack.h>
#include <functional>
#include <ucontext.h>

namespace warp_emulation {

struct Dim3 {
  uint32_t x, y, z;
};

enum Collective { kShuffleIndex, kShuffleXor, kBallot, kReduceMax };

inline constexpr int kLanes = 32;
inline constexpr size_t kStackBytes = 1 << 18;
inline int current_lane = 0;
inline ucontext_t main_context;
inline ucontext_t lane_context[kLanes];
inline uint64_t lane_value[kLanes];
inline uint32_t lane_arg[kLanes];
inline uint64_t lane_result[kLanes];
inline int arrived = 0;
inline int finished = 0;
inline std::function<void()> lane_body;
inline const void* last_kernel = nullptr;  // the kernel of the last LaunchKernel call

inline Dim3 thread_index() { return Dim3{static_cast<uint32_t>(current_lane), 0, 0}; }

/// Switches to the next lane (round robin).
inline void yield_lane() {
  const int from = current_lane;
  current_lane = (current_lane + 1) % kLanes;
  swapcontext(&lane_context[from], &lane_context[current_lane]);
}

/// The calling lane's result of a collective over every lane's (value, arg); the last lane to
/// arrive computes all results, and each lane reads its own when its turn comes back.
inline uint64_t collective(Collective kind, uint64_t value, uint32_t arg) {
  const int lane = current_lane;
  lane_value[lane] = value;
  lane_arg[lane] = arg;
  if (++arrived == kLanes) {
    arrived = 0;
    uint64_t ballot = 0;
    uint32_t max = 0;
    for (int l = 0; l < kLanes; ++l) {
      ballot |= (lane_value[l] != 0 ? uint64_t{1} : 0) << l;
      max = std::max(max, static_cast<uint32_t>(lane_value[l]));
    }
    for (int l = 0; l < kLanes; ++l) {
      switch (kind) {
        case kShuffleIndex:
          lane_result[l] = lane_value[lane_arg[l] % kLanes];
          break;
        case kShuffleXor:
          lane_result[l] = lane_value[(l ^ lane_arg[l]) % kLanes];
          break;
        case kBallot:
          lane_result[l] = ballot;
          break;
        case kReduceMax:
          lane_result[l] = max;
          break;
      }
    }
  }
  yield_lane();
  return lane_result[lane];
}

inline void lane_entry() {
  lane_body();
  if (++finished == kLanes) setcontext(&main_context);
  yield_lane();
}

/// Runs `body` on 32 lanes until every lane returns (every lane must pass the same collectives).
inline void run_warp(std::function<void()> body) {
  static char* stacks[kLanes];
  lane_body = std::move(body);
  arrived = 0;
  finished = 0;
  for (int l = 0; l < kLanes; ++l) {
    if (stacks[l] == nullptr) stacks[l] = static_cast<char*>(std::malloc(kStackBytes));
    getcontext(&lane_context[l]);
    lane_context[l].uc_stack.ss_sp = stacks[l];
    lane_context[l].uc_stack.ss_size = kStackBytes;
    lane_context[l].uc_link = nullptr;
    makecontext(&lane_context[l], lane_entry, 0);
  }
  current_lane = 0;
  swapcontext(&main_context, &lane_context[0]);
}

template <typename T>
uint64_t to_bits(T v) {
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  return bits;
}

template <typename T>
T from_bits(uint64_t bits) {
  T v;
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}

}  // namespace warp_emulation

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(threads)
#define __shared__ static  // one warp at a time: a function's static array is its block's memory
#define threadIdx (warp_emulation::thread_index())
#define blockIdx (warp_emulation::Dim3{0, 0, 0})
#define blockDim (warp_emulation::Dim3{32, 1, 1})
#define gridDim (warp_emulation::Dim3{1, 1, 1})
#define SGL_DEVICE inline

struct uint2 {
  uint32_t x, y;
};
struct alignas(16) uint4 {
  uint32_t x, y, z, w;
};

template <typename T>
T __shfl_sync(uint32_t, T v, uint32_t src, int = 32) {
  using namespace warp_emulation;
  return from_bits<T>(collective(kShuffleIndex, to_bits(v), src));
}
template <typename T>
T __shfl_xor_sync(uint32_t, T v, uint32_t mask, int = 32) {
  using namespace warp_emulation;
  return from_bits<T>(collective(kShuffleXor, to_bits(v), mask));
}
inline uint32_t __ballot_sync(uint32_t, bool p) {
  return static_cast<uint32_t>(warp_emulation::collective(warp_emulation::kBallot, p ? 1 : 0, 0));
}
inline uint32_t __reduce_max_sync(uint32_t, uint32_t v) {
  return static_cast<uint32_t>(warp_emulation::collective(warp_emulation::kReduceMax, v, 0));
}
inline void __syncwarp(uint32_t = 0xFFFFFFFFu) { warp_emulation::collective(warp_emulation::kReduceMax, 0, 0); }
inline int __ffs(uint32_t x) { return x != 0 ? __builtin_ctz(x) + 1 : 0; }
inline uint32_t __float_as_uint(float f) { return static_cast<uint32_t>(warp_emulation::to_bits(f)); }
inline float __uint_as_float(uint32_t u) { return warp_emulation::from_bits<float>(u); }
inline float __fmul_rn(float a, float b) {
  volatile float r = a * b;  // rounded, never contracted into a later add
  return r;
}
inline float __fadd_rn(float a, float b) {
  volatile float r = a + b;
  return r;
}

// sgl_kernel/utils.cuh, utils.h and warp.cuh, as far as topk_rows.cuh uses them.
namespace device {
inline constexpr uint32_t kWarpThreads = 32;
inline void pdl_wait_primary() {}
inline void pdl_launch_dependents() {}
namespace warp {
template <typename T, uint32_t kNumLanes = kWarpThreads>
T reduce_sum(T value) {  // warp.cuh's butterfly, in its order
  for (uint32_t mask = kNumLanes / 2; mask > 0; mask >>= 1) {
    value = value + __shfl_xor_sync(0xffffffffu, value, mask, kWarpThreads);
  }
  return value;
}
template <typename T, uint32_t kNumLanes = kWarpThreads>
T reduce_max(T value) {
  for (uint32_t mask = kNumLanes / 2; mask > 0; mask >>= 1) {
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, mask, kWarpThreads));
  }
  return value;
}
}  // namespace warp
}  // namespace device

namespace host {
template <typename T>
T div_ceil(T a, T b) {
  return (a + b - 1) / b;
}
template <typename... Args>
void RuntimeCheck(bool ok, Args&&...) {
  if (!ok) std::abort();
}
/// Runs the kernel on the emulated warp (grid and block sizes ignored: see the file comment).
struct LaunchKernel {
  LaunchKernel(uint32_t, uint32_t, DLDevice) {}
  LaunchKernel& enable_pdl(bool) { return *this; }
  template <typename Kernel, typename Params>
  void operator()(Kernel kernel, const Params& params) {
    warp_emulation::last_kernel = reinterpret_cast<const void*>(kernel);
    warp_emulation::run_warp([&] { kernel(params); });
  }
};
}  // namespace host
