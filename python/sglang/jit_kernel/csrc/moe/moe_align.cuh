// moe_align_block_size: group the flattened topk_ids by expert (a stable counting sort), each
// expert's segment padded up to a multiple of block_size, for the block-sparse expert GEMMs.
//
// Three kernels, picked by size (moe_align._launch, and the entry points' fallback past 1024
// experts): below 4096 routed ids (and at most 1024 experts) "small", one launch of up to 8 CTAs
// that each compute the whole layout and split the stores; from 4096 ids "split", a count launch
// over up to 64 CTAs and a scatter launch; rows of more than 1024 experts the one-CTA kernel. All three share the steps:
//   1. "sorting" warps each own a contiguous range of the flat ids (register tiles of 32 ids a
//      step) and count them into their own row of a [sort_warps, num_experts] table;
//   2. per expert, the rows become exclusive prefixes over the warps (the rank of a warp's first id
//      inside the segment), the counts are padded and scanned into the segment starts;
//   3. the sorting warps re-walk their ranges: ballots on the id bits group a step's lanes by
//      expert, a lane's slot is start + its warp's running rank + its rank among the lower lanes.
//      So a segment holds its flat indices in ascending order, the same bits every run, whichever
//      kernel runs. expert_ids, the padding, cumsum_buffer and num_tokens_post_pad are written
//      alongside.
// No atomics decide an order; no host sync (CUDA-graph safe). Ids outside [0, num_experts) are
// skipped: not counted, their flat index written nowhere.
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, SymbolicSize, SymbolicDevice, data_ptr, verify_no_partial_overlap
#include <sgl_kernel/utils.h>   // For RuntimeCheck, div_ceil

#include <sgl_kernel/utils.cuh>  // For LaunchKernel, SGL_DEVICE, kWarpThreads, RuntimeDeviceCheck, detail::cached_device_attribute

#include <algorithm>
#include <cstdint>
#include <dlpack/dlpack.h>
#include <limits>
#include <source_location>
#include <tvm/ffi/container/tensor.h>

namespace {

/// Kernel arguments of moe_align_block_size. The host proves numel + min(numel, num_experts) *
/// (block_size - 1) <= INT32_MAX, so every slot, block and flat index fits in int32.
template <typename T>
struct MoeAlignParams {
  const T* topk_ids;             // [numel], flat (row-major) routed expert of each (token, k)
  int32_t* sorted_token_ids;     // [sorted_len >= max padded total]
  int32_t* expert_ids;           // [expert_ids_len >= max padded total / block_size]
  int32_t* num_tokens_post_pad;  // [1]
  int32_t* cumsum_buffer;        // [>= num_experts + 1]
  int32_t numel;
  int32_t num_experts;
  int64_t sorted_len;
  int64_t expert_ids_len;
  int32_t block_size;    // a power of two
  int32_t sort_warps;    // warps 0 .. sort_warps-1 own ranges of ids_per_warp ids
  int32_t ids_per_warp;  // a multiple of 32
  bool pad_sorted_token_ids;
  int32_t peer_bits;  // bits of num_experts (the id value set [0, num_experts])
};

/// Launch facts: one CTA of kThreads; a sorting lane holds kItems ids (one tile) in registers.
struct MoeAlignConfig {
  static constexpr uint32_t kThreads = 1024;
  static constexpr int32_t kWarps = kThreads / device::kWarpThreads;
  static constexpr int32_t kItems = 16;
  static constexpr int32_t kTile = kItems * device::kWarpThreads;      // ids a warp walks per tile
  static constexpr int64_t kMinIdsPerWarp = 4 * device::kWarpThreads;  // fewer ids: fewer sorting warps
  static constexpr int64_t kMaxExperts = 8192;  // table + starts fit the smallest sm80+ opt-in smem
  static constexpr int64_t kMaxBlockSize = 1024;
  static constexpr int64_t kDefaultSmemBytes = 48 * 1024;  // above: opt in per launch
};

constexpr uint32_t kFullMask = 0xffffffffu;

/// Loads the tile of `warp_begin`'s range starting at flat index `tile`: lane `lane` gets the ids
/// at tile + u * 32 + lane (u < kItems, the array's length) as expert numbers, -1 for an id outside
/// [0, num_experts) or a position at or past `warp_end`. Coalesced: a step reads 32 consecutive ids.
template <typename T, int32_t kItems>
SGL_DEVICE void load_tile(
    const MoeAlignParams<T>& p, int32_t tile, int32_t warp_end, int32_t lane, int32_t (&expert)[kItems]) {
#pragma unroll
  for (int32_t u = 0; u < kItems; ++u) {
    const int32_t i = tile + u * device::kWarpThreads + lane;
    expert[u] = -1;
    if (i < warp_end) {
      const T v = p.topk_ids[i];
      if (v >= 0 && v < static_cast<T>(p.num_experts)) expert[u] = static_cast<int32_t>(v);
    }
  }
}

/// In-place exclusive prefix sum of data[0, n) by the whole CTA; data[n] gets the total. Thread
/// `tid` scans the contiguous chunk [tid * per, (tid + 1) * per). Ends with a __syncthreads().
SGL_DEVICE void cta_exclusive_scan(int32_t* data, int32_t n, int32_t* warp_sums, int32_t tid) {
  constexpr int32_t kThreads = MoeAlignConfig::kThreads;
  const int32_t lane = tid % device::kWarpThreads, warp = tid / device::kWarpThreads;
  const int32_t per = (n + kThreads - 1) / kThreads;
  const int32_t lo = std::min(tid * per, n), hi = std::min(lo + per, n);
  int32_t local = 0;
  for (int32_t i = lo; i < hi; ++i) local += data[i];
  int32_t inclusive = local;
#pragma unroll
  for (int32_t offset = 1; offset < device::kWarpThreads; offset <<= 1) {
    const int32_t v = __shfl_up_sync(kFullMask, inclusive, offset);
    if (lane >= offset) inclusive += v;
  }
  if (lane == device::kWarpThreads - 1) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {  // kWarps == 32: one lane per warp total
    int32_t w = warp_sums[lane];
#pragma unroll
    for (int32_t offset = 1; offset < device::kWarpThreads; offset <<= 1) {
      const int32_t v = __shfl_up_sync(kFullMask, w, offset);
      if (lane >= offset) w += v;
    }
    warp_sums[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  int32_t run = inclusive - local + (warp > 0 ? warp_sums[warp - 1] : 0);
  for (int32_t i = lo; i < hi; ++i) {
    const int32_t v = data[i];
    data[i] = run;
    run += v;
  }
  if (tid == kThreads - 1) data[n] = run;
  __syncthreads();
}

/// The lanes of the warp whose e equals this lane's (e in [-1, num_experts), -1 read as
/// num_experts), from one ballot per bit of the value: the same mask as __match_any_sync, built on
/// the vote unit (peer_bits ballots per 32 ids). Called by all 32 lanes.
SGL_DEVICE uint32_t ballot_peers(int32_t e, int32_t num_experts, int32_t peer_bits) {
  const auto v = static_cast<uint32_t>(e < 0 ? num_experts : e);
  uint32_t peers = kFullMask;
  for (int32_t b = 0; b < peer_bits; ++b) {
    const bool bit = ((v >> b) & 1u) != 0;
    const uint32_t set = __ballot_sync(kFullMask, bit);
    peers &= bit ? set : ~set;
  }
  return peers;
}

/// value into ptr[begin, end) by the whole CTA: 16-byte stores on the aligned middle.
SGL_DEVICE void cta_fill(int32_t* ptr, int64_t begin, int64_t end, int32_t value, int32_t tid) {
  constexpr int64_t kThreads = MoeAlignConfig::kThreads;
  if (begin >= end) return;
  const auto misalign = static_cast<int64_t>((reinterpret_cast<std::uintptr_t>(ptr + begin) / sizeof(int32_t)) % 4);
  const int64_t head_end = std::min(end, begin + (4 - misalign) % 4);
  const int64_t num_vec = (end - head_end) / 4;
  const int64_t tail_begin = head_end + num_vec * 4;
  if (tid < head_end - begin) ptr[begin + tid] = value;
  if (tid < end - tail_begin) ptr[tail_begin + tid] = value;
  int4* vec = reinterpret_cast<int4*>(ptr + head_end);
  const int4 v4 = make_int4(value, value, value, value);
  for (int64_t i = tid; i < num_vec; i += kThreads) vec[i] = v4;
}

/// Dynamic shared memory: rank [sort_warps, num_experts] | counts [num_experts] | starts [num_experts + 1].
template <typename T>
__global__ void __launch_bounds__(MoeAlignConfig::kThreads) moe_align_kernel(const MoeAlignParams<T> p) {
  using Config = MoeAlignConfig;
  extern __shared__ int32_t smem[];
  __shared__ int32_t warp_sums[Config::kWarps];
  const int32_t num_experts = p.num_experts;
  int32_t* rank = smem;                                 // [sort_warps, num_experts]
  int32_t* counts = smem + p.sort_warps * num_experts;  // [num_experts]
  int32_t* starts = counts + num_experts;               // [num_experts + 1]

  const auto tid = static_cast<int32_t>(threadIdx.x);
  const int32_t lane = tid % device::kWarpThreads, warp = tid / device::kWarpThreads;
  const bool sorter = warp < p.sort_warps;
  // The host picks ids_per_warp so that every sorting warp's range is non-empty.
  const int32_t warp_begin = warp * p.ids_per_warp;
  const int32_t warp_end = sorter ? std::min(warp_begin + p.ids_per_warp, p.numel) : 0;
  int32_t* my_rank = rank + warp * num_experts;  // [num_experts], this warp's row

  int32_t expert[Config::kItems];
  if (sorter) load_tile(p, warp_begin, warp_end, lane, expert);  // in flight while the table clears
  for (int32_t i = tid; i < p.sort_warps * num_experts; i += Config::kThreads) rank[i] = 0;
  __syncthreads();

  // 1. Histogram: each sorting warp counts its range into its own row (order-free, so atomics).
  if (sorter) {
    for (int32_t tile = warp_begin; tile < warp_end; tile += Config::kTile) {
      if (tile != warp_begin) load_tile(p, tile, warp_end, lane, expert);
#pragma unroll
      for (int32_t u = 0; u < Config::kItems; ++u) {
        if (tile + u * device::kWarpThreads >= warp_end) break;  // warp-uniform
        if (expert[u] >= 0) atomicAdd(&my_rank[expert[u]], 1);
      }
    }
  }
  __syncthreads();

  // 2a. Per expert: the rows become exclusive prefixes over the warps; counts; padded sizes.
  for (int32_t e = tid; e < num_experts; e += Config::kThreads) {
    int32_t run = 0;
    for (int32_t w = 0; w < p.sort_warps; ++w) {
      const int32_t c = rank[w * num_experts + e];
      rank[w * num_experts + e] = run;
      run += c;
    }
    counts[e] = run;
    starts[e] = (run + p.block_size - 1) & ~(p.block_size - 1);
  }
  __syncthreads();
  // 2b. Segment starts (starts[num_experts] = the padded total).
  cta_exclusive_scan(starts, num_experts, warp_sums, tid);
  const int32_t total = starts[num_experts];

  // 3. Scatter, in ascending flat index within each segment.
  if (sorter) {
    const uint32_t lower_lanes = (1u << lane) - 1u;
    const bool one_tile = warp_end - warp_begin <= Config::kTile;  // registers still hold it
    for (int32_t tile = warp_begin; tile < warp_end; tile += Config::kTile) {
      if (!one_tile) load_tile(p, tile, warp_end, lane, expert);
#pragma unroll
      for (int32_t u = 0; u < Config::kItems; ++u) {
        if (tile + u * device::kWarpThreads >= warp_end) break;  // warp-uniform: no lane is left in a sync
        const int32_t e = expert[u];
        const uint32_t peers = ballot_peers(e, num_experts, p.peer_bits);
        const int32_t leader = __ffs(peers) - 1;
        int32_t base = 0;
        if (lane == leader && e >= 0) {
          base = starts[e] + my_rank[e];
          my_rank[e] += __popc(peers);
        }
        base = __shfl_sync(kFullMask, base, leader);
        const int32_t slot = base + __popc(peers & lower_lanes);
        if (e >= 0 && slot < p.sorted_len) p.sorted_token_ids[slot] = tile + u * device::kWarpThreads + lane;
        __syncwarp();  // this step's rank update is seen by the next step's leader
      }
    }
  }

  // 3'. Block experts: block b belongs to the last expert whose segment starts at or before it.
  const int64_t num_blocks = std::min<int64_t>(total / p.block_size, p.expert_ids_len);
  for (int32_t b = tid; b < num_blocks; b += Config::kThreads) {
    const int32_t slot = b * p.block_size;
    int32_t lo = 0, hi = num_experts - 1;  // starts[0] = 0 <= slot
    while (lo < hi) {
      const int32_t mid = (lo + hi + 1) / 2;
      if (starts[mid] <= slot) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    p.expert_ids[b] = lo;
  }
  // 3''. Padding: a warp per expert fills its last block's free slots; the CTA fills the tail.
  if (p.pad_sorted_token_ids) {
    for (int32_t e = warp; e < num_experts; e += Config::kWarps) {
      const int32_t end = starts[e + 1];
      for (int32_t s = starts[e] + counts[e] + lane; s < end; s += device::kWarpThreads) {
        p.sorted_token_ids[s] = p.numel;
      }
    }
    cta_fill(p.sorted_token_ids, total, p.sorted_len, p.numel, tid);
  }
  for (int32_t e = tid; e <= num_experts; e += Config::kThreads) p.cumsum_buffer[e] = starts[e];
  if (tid == 0) *p.num_tokens_post_pad = total;
}

/// Lets `kernel` use `bytes` of dynamic shared memory on CUDA device `device_id` (its own setting
/// per device), as FlashInfer does before its launches; a host call, allowed during graph capture.
template <typename Kernel>
void allow_dynamic_smem(Kernel kernel, int64_t bytes, int device_id, const std::source_location& loc) {
  int previous = -1;
  host::RuntimeDeviceCheck(cudaGetDevice(&previous), loc);
  if (previous != device_id) host::RuntimeDeviceCheck(cudaSetDevice(device_id), loc);
  const cudaError_t error =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (previous != device_id) (void)cudaSetDevice(previous);
  host::RuntimeDeviceCheck(error, loc);
}

/// The validated arguments of a moe_align_block_size call as kernel arguments (sort_warps and
/// ids_per_warp left for the launcher), in `params`; false (nothing to launch) when numel == 0.
/// Throws PanicError (Python RuntimeError) on a mismatch (the rules: moe_align_block_size below).
template <typename T>
bool unwrap_moe_align(
    tvm::ffi::TensorView topk_ids,
    int64_t num_experts,
    int64_t block_size,
    tvm::ffi::TensorView sorted_token_ids,
    tvm::ffi::TensorView expert_ids,
    tvm::ffi::TensorView num_tokens_post_pad,
    tvm::ffi::TensorView cumsum_buffer,
    bool pad_sorted_token_ids,
    MoeAlignParams<T>& params,
    DLDevice& device_out) {
  using namespace host;
  using Config = MoeAlignConfig;

  // Validate
  SymbolicSize numel{"numel"};
  SymbolicSize sorted_len{"sorted_len"};
  SymbolicSize expert_ids_len{"expert_ids_len"};
  SymbolicSize cumsum_len{"cumsum_len"};
  SymbolicDevice device_;
  device_.set_options<kDLCUDA>();
  TensorMatcher({numel}).with_dtype<T>().with_device<kDLCUDA>(device_).verify(topk_ids, "topk_ids");
  TensorMatcher({sorted_len})
      .with_dtype<int32_t>()
      .with_device<kDLCUDA>(device_)
      .verify(sorted_token_ids, "sorted_token_ids");
  TensorMatcher({expert_ids_len}).with_dtype<int32_t>().with_device<kDLCUDA>(device_).verify(expert_ids, "expert_ids");
  TensorMatcher({1}).with_dtype<int32_t>().with_device<kDLCUDA>(device_).verify(
      num_tokens_post_pad, "num_tokens_post_pad");
  TensorMatcher({cumsum_len})
      .with_dtype<int32_t>()
      .with_device<kDLCUDA>(device_)
      .verify(cumsum_buffer, "cumsum_buffer");
  RuntimeCheck(
      num_experts >= 1 && num_experts <= Config::kMaxExperts,
      "num_experts must be in [1, ",
      Config::kMaxExperts,
      "], got ",
      num_experts);
  RuntimeCheck(
      block_size >= 1 && block_size <= Config::kMaxBlockSize && (block_size & (block_size - 1)) == 0,
      "block_size must be a power of two in [1, ",
      Config::kMaxBlockSize,
      "], got ",
      block_size);
  const int64_t n = numel.unwrap();
  const int64_t max_padded = n + std::min(n, num_experts) * (block_size - 1);
  RuntimeCheck(
      max_padded <= std::numeric_limits<int32_t>::max(),
      "topk_ids: numel + min(numel, num_experts) * ",
      "(block_size - 1) must fit in int32, got ",
      max_padded);
  RuntimeCheck(
      sorted_len.unwrap() >= max_padded,
      "sorted_token_ids: expected at least ",
      max_padded,
      " slots (the worst case), got ",
      sorted_len.unwrap());
  RuntimeCheck(
      expert_ids_len.unwrap() >= max_padded / block_size,
      "expert_ids: expected at least ",
      max_padded / block_size,
      " blocks (the worst case), got ",
      expert_ids_len.unwrap());
  RuntimeCheck(
      cumsum_len.unwrap() >= num_experts + 1,
      "cumsum_buffer: expected at least ",
      num_experts + 1,
      " entries, got ",
      cumsum_len.unwrap());
  const tvm::ffi::TensorView* views[] = {
      &topk_ids, &sorted_token_ids, &expert_ids, &num_tokens_post_pad, &cumsum_buffer};
  const char* names[] = {"topk_ids", "sorted_token_ids", "expert_ids", "num_tokens_post_pad", "cumsum_buffer"};
  for (int a = 1; a < 5; ++a) {
    for (int b = 0; b < a; ++b) verify_no_partial_overlap(*views[a], names[a], *views[b], names[b], false);
  }

  // Unwrap
  device_out = device_.unwrap();
  if (n == 0) return false;
  params = MoeAlignParams<T>{
      .topk_ids = data_ptr<const T>(topk_ids),
      .sorted_token_ids = data_ptr<int32_t>(sorted_token_ids),
      .expert_ids = data_ptr<int32_t>(expert_ids),
      .num_tokens_post_pad = data_ptr<int32_t>(num_tokens_post_pad),
      .cumsum_buffer = data_ptr<int32_t>(cumsum_buffer),
      .numel = static_cast<int32_t>(n),
      .num_experts = static_cast<int32_t>(num_experts),
      .sorted_len = sorted_len.unwrap(),
      .expert_ids_len = expert_ids_len.unwrap(),
      .block_size = static_cast<int32_t>(block_size),
      .sort_warps = 1,
      .ids_per_warp = 0,
      .pad_sorted_token_ids = pad_sorted_token_ids,
      .peer_bits = 32 - __builtin_clz(static_cast<uint32_t>(num_experts)),
  };

  return true;
}

/// The one-CTA kernel's launcher (any expert count): moe_align_block_size_small and
/// moe_align_block_size_split fall back to it for rows of more than 1024 experts; moe_align._launch
/// picks between those two by size. Groups topk_ids [numel] (T = int32_t | int64_t, contiguous) by expert into sorted_token_ids
/// [sorted_len] int32, the expert of each block into expert_ids [expert_ids_len] int32, the padded
/// total into num_tokens_post_pad [1] int32 and the segment starts into cumsum_buffer[0 ..
/// num_experts] (int32, >= num_experts + 1). Requires 1 <= num_experts <= 8192, block_size a power
/// of two <= 1024, sorted_len >= numel + min(numel, num_experts) * (block_size - 1) <= INT32_MAX
/// and expert_ids_len >= that / block_size; all on one CUDA device, disjoint. Throws PanicError
/// (Python RuntimeError) otherwise. numel == 0 returns without a launch and writes nothing.
template <typename T>
void moe_align_block_size(
    tvm::ffi::TensorView topk_ids,
    int64_t num_experts,
    int64_t block_size,
    tvm::ffi::TensorView sorted_token_ids,
    tvm::ffi::TensorView expert_ids,
    tvm::ffi::TensorView num_tokens_post_pad,
    tvm::ffi::TensorView cumsum_buffer,
    bool pad_sorted_token_ids) {
  using namespace host;
  using Config = MoeAlignConfig;
  const auto loc = std::source_location::current();
  MoeAlignParams<T> params;
  DLDevice device;
  if (!unwrap_moe_align<T>(
          topk_ids,
          num_experts,
          block_size,
          sorted_token_ids,
          expert_ids,
          num_tokens_post_pad,
          cumsum_buffer,
          pad_sorted_token_ids,
          params,
          device)) {
    return;
  }
  const int64_t n = params.numel;
  const int64_t fixed_ints = 2 * num_experts + 1;  // counts + starts
  // Configure: as many sorting warps as have >= kMinIdsPerWarp ids and a table row in shared memory
  const int64_t smem_limit =
      detail::cached_device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(device.device_id, loc);
  const int64_t static_bytes = int64_t{Config::kWarps} * sizeof(int32_t);
  const int64_t rows_fit = ((smem_limit - static_bytes) / int64_t{sizeof(int32_t)} - fixed_ints) / num_experts;
  RuntimeCheck(
      rows_fit >= 1,
      "num_experts = ",
      num_experts,
      " needs more shared memory than the device's ",
      smem_limit,
      " bytes");
  const int64_t wanted = std::clamp<int64_t>(div_ceil(n, Config::kMinIdsPerWarp), 1, Config::kWarps);
  const int64_t sort_warps_max = std::min(wanted, rows_fit);
  const int64_t ids_per_warp =
      div_ceil(div_ceil(n, sort_warps_max), int64_t{device::kWarpThreads}) * device::kWarpThreads;
  const int64_t sort_warps = div_ceil(n, ids_per_warp);  // every sorting warp has ids
  params.sort_warps = static_cast<int32_t>(sort_warps);
  params.ids_per_warp = static_cast<int32_t>(ids_per_warp);
  const int64_t smem_bytes = (sort_warps * num_experts + fixed_ints) * int64_t{sizeof(int32_t)};

  // Launch
  const auto kernel = moe_align_kernel<T>;
  if (smem_bytes + static_bytes > Config::kDefaultSmemBytes) {
    allow_dynamic_smem(kernel, smem_bytes, device.device_id, loc);
  }
  LaunchKernel(1, Config::kThreads, device, static_cast<std::size_t>(smem_bytes))(kernel, params);
}

// ---------------------------------------------------------------------------------------------
// "split": two launches over many CTAs, for large inputs (from 4096 routed ids; one CTA would walk
// 32k ids at 4096 tokens x top 8 alone).
//   1. count: CTA c owns the flat ids [c * chunk, (c + 1) * chunk) and writes its per-expert counts
//      into row c of a [num_ctas, num_experts] workspace table (shared-memory histogram; atomics
//      only count, they decide no order);
//   2. scatter (PDL-overlapped with 1): CTA c re-counts its chunk per warp (as the one-CTA kernel does),
//      sums the table's rows above c (the rank of its first id inside each segment) and all rows
//      (the counts), scans the padded counts into the segment starts and scatters its ids in
//      ascending flat index: the same bits as the one-CTA kernel. expert_ids, the padding, the tail,
//      cumsum_buffer and num_tokens_post_pad are spread over all CTAs. No global atomics, no
//      memset, no host sync.
// Rows of at most kMaxExperts experts (else the one-CTA kernel runs).
// ---------------------------------------------------------------------------------------------

struct MoeAlignSplitConfig {
  static constexpr uint32_t kCountThreads = 256;
  static constexpr uint32_t kThreads = MoeAlignConfig::kThreads;  // cta_exclusive_scan's block
  static constexpr int64_t kChunkQuantum = int64_t{MoeAlignConfig::kWarps} * device::kWarpThreads;
  static constexpr int64_t kMaxCtas = 64;
  static constexpr int64_t kMaxExperts = 1024;
};

template <typename T>
struct MoeAlignSplitParams {
  MoeAlignParams<T> base;  // sort_warps = 32, ids_per_warp = chunk / 32
  int32_t* table;          // [num_ctas, num_experts] workspace
  int32_t chunk;           // ids per CTA, a multiple of kChunkQuantum
  int32_t num_ctas;
};

template <typename T>
__global__ void __launch_bounds__(MoeAlignSplitConfig::kCountThreads)
    moe_align_count_kernel(const MoeAlignSplitParams<T> q) {
  extern __shared__ int32_t hist[];  // [num_experts]
  const MoeAlignParams<T>& p = q.base;
  const auto tid = static_cast<int32_t>(threadIdx.x);
  constexpr auto kThreads = static_cast<int32_t>(MoeAlignSplitConfig::kCountThreads);
  device::pdl_launch_dependents();  // the scatter CTAs may take their SMs now (they wait for us)
  for (int32_t e = tid; e < p.num_experts; e += kThreads) hist[e] = 0;
  __syncthreads();
  const int32_t begin = static_cast<int32_t>(blockIdx.x) * q.chunk;
  const int32_t end = std::min(begin + q.chunk, p.numel);
  for (int32_t i = begin + tid; i < end; i += kThreads) {
    const T v = p.topk_ids[i];
    if (v >= 0 && v < static_cast<T>(p.num_experts)) atomicAdd(&hist[static_cast<int32_t>(v)], 1);
  }
  __syncthreads();
  int32_t* row = q.table + static_cast<int64_t>(blockIdx.x) * p.num_experts;
  for (int32_t e = tid; e < p.num_experts; e += kThreads) row[e] = hist[e];
}

/// Dynamic shared memory: rank [32, num_experts] | counts [num_experts] | starts [num_experts + 1].
template <typename T>
__global__ void __launch_bounds__(MoeAlignSplitConfig::kThreads)
    moe_align_scatter_kernel(const MoeAlignSplitParams<T> q) {
  using Config = MoeAlignConfig;
  extern __shared__ int32_t smem[];
  __shared__ int32_t warp_sums[Config::kWarps];
  const MoeAlignParams<T>& p = q.base;
  const int32_t num_experts = p.num_experts;
  int32_t* rank = smem;                                   // [32, num_experts]
  int32_t* counts = smem + Config::kWarps * num_experts;  // [num_experts]
  int32_t* starts = counts + num_experts;                 // [num_experts + 1]

  const auto tid = static_cast<int32_t>(threadIdx.x);
  const auto cta = static_cast<int32_t>(blockIdx.x);
  const int32_t lane = tid % device::kWarpThreads, warp = tid / device::kWarpThreads;
  const int32_t cta_end = std::min(cta * q.chunk + q.chunk, p.numel);
  const int32_t warp_begin = cta * q.chunk + warp * p.ids_per_warp;
  const int32_t warp_end = std::min(warp_begin + p.ids_per_warp, cta_end);  // may be empty
  const bool sorter = warp_begin < warp_end;
  int32_t* my_rank = rank + warp * num_experts;

  // The ids were written before the count kernel started (stream order): readable before the wait.
  int32_t expert[Config::kItems];
  if (sorter) load_tile(p, warp_begin, warp_end, lane, expert);
  for (int32_t i = tid; i < Config::kWarps * num_experts; i += Config::kThreads) rank[i] = 0;
  __syncthreads();
  if (sorter) {
    for (int32_t tile = warp_begin; tile < warp_end; tile += Config::kTile) {
      if (tile != warp_begin) load_tile(p, tile, warp_end, lane, expert);
#pragma unroll
      for (int32_t u = 0; u < Config::kItems; ++u) {
        if (tile + u * device::kWarpThreads >= warp_end) break;  // warp-uniform
        if (expert[u] >= 0) atomicAdd(&my_rank[expert[u]], 1);
      }
    }
  }
  device::pdl_wait_primary();  // the count kernel's table
  __syncthreads();

  // Per expert: ids in the CTAs before this one, the total; the warp rows become exclusive
  // prefixes starting at the former.
  for (int32_t e = tid; e < num_experts; e += Config::kThreads) {
    int32_t above = 0, total = 0;
#pragma unroll 8
    for (int32_t c = 0; c < q.num_ctas; ++c) {
      const int32_t v = q.table[static_cast<int64_t>(c) * num_experts + e];
      above += c < cta ? v : 0;
      total += v;
    }
    int32_t run = above;
    for (int32_t w = 0; w < Config::kWarps; ++w) {
      const int32_t c = rank[w * num_experts + e];
      rank[w * num_experts + e] = run;
      run += c;
    }
    counts[e] = total;
    starts[e] = (total + p.block_size - 1) & ~(p.block_size - 1);
  }
  __syncthreads();
  cta_exclusive_scan(starts, num_experts, warp_sums, tid);
  const int32_t total = starts[num_experts];

  if (sorter) {
    const uint32_t lower_lanes = (1u << lane) - 1u;
    const bool one_tile = warp_end - warp_begin <= Config::kTile;
    for (int32_t tile = warp_begin; tile < warp_end; tile += Config::kTile) {
      if (!one_tile) load_tile(p, tile, warp_end, lane, expert);
#pragma unroll
      for (int32_t u = 0; u < Config::kItems; ++u) {
        if (tile + u * device::kWarpThreads >= warp_end) break;  // warp-uniform
        const int32_t e = expert[u];
        const uint32_t peers = ballot_peers(e, num_experts, p.peer_bits);
        const int32_t leader = __ffs(peers) - 1;
        int32_t base = 0;
        if (lane == leader && e >= 0) {
          base = starts[e] + my_rank[e];
          my_rank[e] += __popc(peers);
        }
        base = __shfl_sync(kFullMask, base, leader);
        const int32_t slot = base + __popc(peers & lower_lanes);
        if (e >= 0 && slot < p.sorted_len) p.sorted_token_ids[slot] = tile + u * device::kWarpThreads + lane;
        __syncwarp();
      }
    }
  }

  // The rest, spread over the grid.
  const int64_t gtid = int64_t{cta} * Config::kThreads + tid;
  const int64_t gthreads = int64_t{q.num_ctas} * Config::kThreads;
  const int64_t num_blocks = std::min<int64_t>(total / p.block_size, p.expert_ids_len);
  for (int64_t b = gtid; b < num_blocks; b += gthreads) {
    const auto slot = static_cast<int32_t>(b * p.block_size);
    int32_t lo = 0, hi = num_experts - 1;
    while (lo < hi) {
      const int32_t mid = (lo + hi + 1) / 2;
      if (starts[mid] <= slot) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    p.expert_ids[b] = lo;
  }
  if (p.pad_sorted_token_ids) {
    for (int32_t e = cta * Config::kWarps + warp; e < num_experts; e += q.num_ctas * Config::kWarps) {
      const int32_t end = starts[e + 1];
      for (int32_t s = starts[e] + counts[e] + lane; s < end; s += device::kWarpThreads) {
        p.sorted_token_ids[s] = p.numel;
      }
    }
    for (int64_t s = total + gtid; s < p.sorted_len; s += gthreads) p.sorted_token_ids[s] = p.numel;
  }
  if (cta == 0) {
    for (int32_t e = tid; e <= num_experts; e += Config::kThreads) p.cumsum_buffer[e] = starts[e];
    if (tid == 0) *p.num_tokens_post_pad = total;
  }
}

/// moe_align_block_size with the "split" variant: the same contract and outputs, plus
/// `workspace`, int32 of at least MoeAlignSplitConfig::kMaxCtas * num_experts entries (scratch,
/// any contents). num_experts > kMaxExperts runs the one-CTA kernel.
template <typename T>
void moe_align_block_size_split(
    tvm::ffi::TensorView topk_ids,
    int64_t num_experts,
    int64_t block_size,
    tvm::ffi::TensorView sorted_token_ids,
    tvm::ffi::TensorView expert_ids,
    tvm::ffi::TensorView num_tokens_post_pad,
    tvm::ffi::TensorView cumsum_buffer,
    bool pad_sorted_token_ids,
    tvm::ffi::TensorView workspace) {
  using namespace host;
  using Split = MoeAlignSplitConfig;
  const auto loc = std::source_location::current();
  if (num_experts > Split::kMaxExperts) {
    return moe_align_block_size<T>(
        topk_ids,
        num_experts,
        block_size,
        sorted_token_ids,
        expert_ids,
        num_tokens_post_pad,
        cumsum_buffer,
        pad_sorted_token_ids);
  }
  MoeAlignParams<T> params;
  DLDevice device;
  if (!unwrap_moe_align<T>(
          topk_ids,
          num_experts,
          block_size,
          sorted_token_ids,
          expert_ids,
          num_tokens_post_pad,
          cumsum_buffer,
          pad_sorted_token_ids,
          params,
          device)) {
    return;
  }
  SymbolicSize workspace_len{"workspace_len"};
  SymbolicDevice ws_device;
  ws_device.set_options<kDLCUDA>();
  TensorMatcher({workspace_len}).with_dtype<int32_t>().with_device<kDLCUDA>(ws_device).verify(workspace, "workspace");
  RuntimeCheck(ws_device.unwrap().device_id == device.device_id, "workspace: expected the device of topk_ids");
  RuntimeCheck(
      workspace_len.unwrap() >= Split::kMaxCtas * num_experts,
      "workspace: expected at least ",
      Split::kMaxCtas * num_experts,
      " entries, got ",
      workspace_len.unwrap());
  const int64_t n = params.numel;
  const int64_t chunk = std::max(
      Split::kChunkQuantum, div_ceil(div_ceil(n, Split::kMaxCtas), Split::kChunkQuantum) * Split::kChunkQuantum);
  MoeAlignSplitParams<T> q{
      .base = params,
      .table = data_ptr<int32_t>(workspace),
      .chunk = static_cast<int32_t>(chunk),
      .num_ctas = static_cast<int32_t>(div_ceil(n, chunk)),
  };
  q.base.sort_warps = MoeAlignConfig::kWarps;
  q.base.ids_per_warp = static_cast<int32_t>(chunk / MoeAlignConfig::kWarps);

  const auto count_bytes = static_cast<std::size_t>(num_experts * sizeof(int32_t));
  const int64_t scatter_bytes = (int64_t{MoeAlignConfig::kWarps} * num_experts + 2 * num_experts + 1) * 4;
  const int64_t static_bytes = int64_t{MoeAlignConfig::kWarps} * sizeof(int32_t);
  const auto scatter = moe_align_scatter_kernel<T>;
  if (scatter_bytes + static_bytes > MoeAlignConfig::kDefaultSmemBytes) {
    allow_dynamic_smem(scatter, scatter_bytes, device.device_id, loc);
  }
  LaunchKernel(static_cast<uint32_t>(q.num_ctas), Split::kCountThreads, device, count_bytes)(
      moe_align_count_kernel<T>, q);
  LaunchKernel(static_cast<uint32_t>(q.num_ctas), Split::kThreads, device, static_cast<std::size_t>(scatter_bytes))
      .enable_pdl(true)(scatter, q);
}

// ---------------------------------------------------------------------------------------------
// "small" (below moe_align.SPLIT_MIN_NUMEL = 4096 ids): the one-CTA algorithm with a shorter chain
// of dependent steps, for decode sizes. The same bits.
//   - PDL: the shared-memory clear and the barrier after it come before griddepcontrol.wait (no
//     global access there); the next kernel is released right after the wait.
//   - The padding past the worst-case total, [max_padded, sorted_len) (data-independent: most of
//     sorted_token_ids at decode sizes in sglang's sizing), is stored while the ids are in flight.
//   - Two barriers after the ids arrive, not five: the histogram also counts into one totals row,
//     so one warp scans the padded totals (a lane per run of experts, no barrier inside) while the
//     other warps turn the per-warp rows into prefixes over the warps.
//   - expert_ids and each segment's padding are written per expert (no binary search per block).
//   - num_ctas CTAs (host: ~kSlotsPerCta slots each, with padding) each compute the whole layout
//     (the same values in each) and split the stores: CTA c scatters the ranges of the warps w with
//     w % num_ctas == c; experts and the tail are spread over every CTA's warps and threads (sglang
//     sizes sorted_token_ids as numel + 257 * 63: tens of KB of stores at decode sizes).
// Rows of at most kMaxExperts experts (else the one-CTA kernel runs). Why each step is faster:
// docs/perf_notes.md ("moe_align small").
// ---------------------------------------------------------------------------------------------

struct MoeAlignSmallConfig {
  static constexpr uint32_t kThreads = 512;
  static constexpr int32_t kWarps = kThreads / device::kWarpThreads;
  static constexpr int32_t kItems = 8;  // a 256-id register tile: one tile per warp up to 4096 ids
  static constexpr int32_t kTile = kItems * device::kWarpThreads;
  static constexpr int32_t kScanWarp = kWarps - 1;                 // sorts only from 481 ids: free early at decode
  static constexpr int64_t kMinIdsPerWarp = device::kWarpThreads;  // 512 ids: one step per warp
  static constexpr int64_t kSlotsPerCta = 4096;                    // 16 KiB of sorted_token_ids
  static constexpr int64_t kMaxCtas = 8;
  static constexpr int64_t kMaxExperts = 1024;
};

template <typename T>
struct MoeAlignSmallParams {
  MoeAlignParams<T> base;  // sort_warps <= kWarps, ids_per_warp a multiple of 32
  int32_t max_padded;      // numel + min(numel, num_experts) * (block_size - 1) >= the padded total
  int32_t num_ctas;        // CTAs splitting the stores, in [1, kMaxCtas]
};

/// value into ptr[begin, end) by `threads` threads, this one `t` of them (a grid-stride loop):
/// 16-byte stores on the aligned middle. cta_fill with the thread count a parameter.
SGL_DEVICE void grid_fill(int32_t* ptr, int64_t begin, int64_t end, int32_t value, int64_t t, int64_t threads) {
  if (begin >= end) return;
  const auto misalign = static_cast<int64_t>((reinterpret_cast<std::uintptr_t>(ptr + begin) / sizeof(int32_t)) % 4);
  const int64_t head_end = std::min(end, begin + (4 - misalign) % 4);
  const int64_t num_vec = (end - head_end) / 4;
  const int64_t tail_begin = head_end + num_vec * 4;
  if (t < head_end - begin) ptr[begin + t] = value;
  if (t < end - tail_begin) ptr[tail_begin + t] = value;
  int4* vec = reinterpret_cast<int4*>(ptr + head_end);
  const int4 v4 = make_int4(value, value, value, value);
  for (int64_t i = t; i < num_vec; i += threads) vec[i] = v4;
}

/// Dynamic shared memory: rank [sort_warps, num_experts] | totals [num_experts] | starts [num_experts + 1].
template <typename T>
__global__ void __launch_bounds__(MoeAlignSmallConfig::kThreads)
    moe_align_small_kernel(const MoeAlignSmallParams<T> q) {
  using Config = MoeAlignSmallConfig;
  constexpr int32_t kItems = Config::kItems, kTile = Config::kTile;
  extern __shared__ int32_t smem[];
  const MoeAlignParams<T>& p = q.base;
  const int32_t num_experts = p.num_experts;
  int32_t* rank = smem;                                 // [sort_warps, num_experts]
  int32_t* totals = smem + p.sort_warps * num_experts;  // [num_experts]
  int32_t* starts = totals + num_experts;               // [num_experts + 1]

  const auto tid = static_cast<int32_t>(threadIdx.x);
  const auto cta = static_cast<int32_t>(blockIdx.x);
  const int32_t lane = tid % device::kWarpThreads, warp = tid / device::kWarpThreads;
  const int64_t gtid = int64_t{cta} * Config::kThreads + tid;
  const int64_t gthreads = int64_t{q.num_ctas} * Config::kThreads;
  const bool sorter = warp < p.sort_warps;
  const bool scatters = sorter && warp % q.num_ctas == cta;  // this CTA stores this warp's ids
  // The host picks ids_per_warp so that every sorting warp's range is non-empty.
  const int32_t warp_begin = warp * p.ids_per_warp;
  const int32_t warp_end = sorter ? std::min(warp_begin + p.ids_per_warp, p.numel) : 0;
  int32_t* my_rank = rank + warp * num_experts;  // [num_experts], this warp's row

  // 0. Before the wait: shared memory only (the rows and the totals start at zero).
  for (int32_t i = tid; i < (p.sort_warps + 1) * num_experts; i += Config::kThreads) smem[i] = 0;
  __syncthreads();
  device::pdl_wait_primary();  // the ids may be the previous kernel's output, the buffers its input
  device::pdl_launch_dependents();
  int32_t expert[kItems];
  if (sorter) load_tile(p, warp_begin, warp_end, lane, expert);
  if (p.pad_sorted_token_ids) grid_fill(p.sorted_token_ids, q.max_padded, p.sorted_len, p.numel, gtid, gthreads);

  // 1. Histogram: per warp (the rank rows) and per expert (the totals); atomics only count.
  if (sorter) {
    for (int32_t tile = warp_begin; tile < warp_end; tile += kTile) {
      if (tile != warp_begin) load_tile(p, tile, warp_end, lane, expert);
#pragma unroll
      for (int32_t u = 0; u < kItems; ++u) {
        if (tile + u * device::kWarpThreads >= warp_end) break;  // warp-uniform
        if (expert[u] >= 0) {
          atomicAdd(&my_rank[expert[u]], 1);
          atomicAdd(&totals[expert[u]], 1);
        }
      }
    }
  }
  __syncthreads();

  // 2. One warp: starts = exclusive scan of the padded totals. Lane l owns the run [l * per, l * per
  // + per); per is odd so the lanes' k-th entries fall in 32 distinct banks. The other warps
  // meanwhile: per expert, the rows become exclusive prefixes over the warps. Loads are grouped
  // ahead of the stores in source order: the compiler cannot tell the rows apart (one extern
  // array), so an interleaved load / store loop would pay one shared-memory latency per entry.
  if (warp == Config::kScanWarp) {
    constexpr int32_t kGroup = 8;
    const int32_t per = ((num_experts + device::kWarpThreads - 1) / device::kWarpThreads) | 1;
    const int32_t lo = std::min(lane * per, num_experts), hi = std::min(lo + per, num_experts);
    const int32_t round = p.block_size - 1;
    int32_t local = 0;
    for (int32_t i = lo; i < hi; i += kGroup) {
#pragma unroll
      for (int32_t k = 0; k < kGroup; ++k) {
        if (i + k < hi) local += (totals[i + k] + round) & ~round;
      }
    }
    int32_t inclusive = local;
#pragma unroll
    for (int32_t offset = 1; offset < device::kWarpThreads; offset <<= 1) {
      const int32_t v = __shfl_up_sync(kFullMask, inclusive, offset);
      if (lane >= offset) inclusive += v;
    }
    int32_t run = inclusive - local;
    for (int32_t i = lo; i < hi; i += kGroup) {
      int32_t padded[kGroup];
#pragma unroll
      for (int32_t k = 0; k < kGroup; ++k) padded[k] = i + k < hi ? (totals[i + k] + round) & ~round : 0;
#pragma unroll
      for (int32_t k = 0; k < kGroup; ++k) {
        if (i + k < hi) starts[i + k] = run;
        run += padded[k];
      }
    }
    if (lane == device::kWarpThreads - 1) starts[num_experts] = inclusive;  // the padded total
  } else {
    for (int32_t e = tid; e < num_experts; e += Config::kThreads - device::kWarpThreads) {
      int32_t count[Config::kWarps];
#pragma unroll
      for (int32_t w = 0; w < Config::kWarps; ++w) count[w] = w < p.sort_warps ? rank[w * num_experts + e] : 0;
      int32_t run = 0;
#pragma unroll
      for (int32_t w = 0; w < Config::kWarps; ++w) {
        if (w < p.sort_warps) rank[w * num_experts + e] = run;
        run += count[w];
      }
    }
  }
  __syncthreads();
  const int32_t total = starts[num_experts];

  // 3. Scatter (as the one-CTA kernel), by the CTA warp % num_ctas.
  if (scatters) {
    const uint32_t lower_lanes = (1u << lane) - 1u;
    const bool one_tile = warp_end - warp_begin <= kTile;  // registers still hold it
    for (int32_t tile = warp_begin; tile < warp_end; tile += kTile) {
      if (!one_tile) load_tile(p, tile, warp_end, lane, expert);
#pragma unroll
      for (int32_t u = 0; u < kItems; ++u) {
        if (tile + u * device::kWarpThreads >= warp_end) break;  // warp-uniform: no lane is left in a sync
        const int32_t e = expert[u];
        const uint32_t peers = ballot_peers(e, num_experts, p.peer_bits);
        const int32_t leader = __ffs(peers) - 1;
        int32_t base = 0;
        if (lane == leader && e >= 0) {
          base = starts[e] + my_rank[e];
          my_rank[e] += __popc(peers);
        }
        base = __shfl_sync(kFullMask, base, leader);
        const int32_t slot = base + __popc(peers & lower_lanes);
        if (e >= 0 && slot < p.sorted_len) p.sorted_token_ids[slot] = tile + u * device::kWarpThreads + lane;
        __syncwarp();  // this step's rank update is seen by the next step's leader
      }
    }
  }

  // 3'. Per expert, a warp of the grid: the expert of its blocks, the free slots of its last block.
  const int32_t block_shift = __ffs(p.block_size) - 1;
  const int32_t grid_warps = q.num_ctas * Config::kWarps;
  for (int32_t e = cta * Config::kWarps + warp; e < num_experts; e += grid_warps) {
    const int32_t begin = starts[e], end = starts[e + 1];
    const int64_t block_end = std::min<int64_t>(end >> block_shift, p.expert_ids_len);
    for (int32_t b = (begin >> block_shift) + lane; b < block_end; b += device::kWarpThreads) p.expert_ids[b] = e;
    if (p.pad_sorted_token_ids) {
      for (int32_t s = begin + totals[e] + lane; s < end; s += device::kWarpThreads) p.sorted_token_ids[s] = p.numel;
    }
  }
  // 3''. The tail up to the worst case (the rest was stored in step 0), cumsum_buffer, the total.
  if (p.pad_sorted_token_ids) grid_fill(p.sorted_token_ids, total, q.max_padded, p.numel, gtid, gthreads);
  for (int64_t e = gtid; e <= num_experts; e += gthreads) p.cumsum_buffer[e] = starts[e];
  if (gtid == 0) *p.num_tokens_post_pad = total;
}

/// moe_align_block_size with the "small" variant: the same contract and outputs (one launch of
/// num_ctas CTAs with PDL). num_experts > MoeAlignSmallConfig::kMaxExperts runs the one-CTA kernel.
template <typename T>
void moe_align_block_size_small(
    tvm::ffi::TensorView topk_ids,
    int64_t num_experts,
    int64_t block_size,
    tvm::ffi::TensorView sorted_token_ids,
    tvm::ffi::TensorView expert_ids,
    tvm::ffi::TensorView num_tokens_post_pad,
    tvm::ffi::TensorView cumsum_buffer,
    bool pad_sorted_token_ids) {
  using namespace host;
  using Small = MoeAlignSmallConfig;
  const auto loc = std::source_location::current();
  if (num_experts > Small::kMaxExperts) {
    return moe_align_block_size<T>(
        topk_ids,
        num_experts,
        block_size,
        sorted_token_ids,
        expert_ids,
        num_tokens_post_pad,
        cumsum_buffer,
        pad_sorted_token_ids);
  }
  // Validate, unwrap
  MoeAlignParams<T> params;
  DLDevice device;
  if (!unwrap_moe_align<T>(
          topk_ids,
          num_experts,
          block_size,
          sorted_token_ids,
          expert_ids,
          num_tokens_post_pad,
          cumsum_buffer,
          pad_sorted_token_ids,
          params,
          device)) {
    return;
  }

  // Configure: sorting warps of >= kMinIdsPerWarp ids; a CTA per ~kSlotsPerCta padded slots
  const int64_t n = params.numel;
  const int64_t wanted = std::clamp<int64_t>(div_ceil(n, Small::kMinIdsPerWarp), 1, Small::kWarps);
  const int64_t ids_per_warp = div_ceil(div_ceil(n, wanted), int64_t{device::kWarpThreads}) * device::kWarpThreads;
  const int64_t sort_warps = div_ceil(n, ids_per_warp);  // every sorting warp has ids
  params.sort_warps = static_cast<int32_t>(sort_warps);
  params.ids_per_warp = static_cast<int32_t>(ids_per_warp);
  int64_t num_ctas = 1;  // without padding: ~numel stores, one CTA's worth
  if (params.pad_sorted_token_ids) {
    num_ctas = std::clamp<int64_t>(div_ceil(params.sorted_len, Small::kSlotsPerCta), 1, Small::kMaxCtas);
  }
  const MoeAlignSmallParams<T> q{
      .base = params,
      .max_padded = static_cast<int32_t>(n + std::min(n, num_experts) * (block_size - 1)),
      .num_ctas = static_cast<int32_t>(num_ctas),
  };
  const int64_t smem_bytes = ((sort_warps + 2) * num_experts + 1) * int64_t{sizeof(int32_t)};
  const int64_t smem_limit =
      detail::cached_device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(device.device_id, loc);
  RuntimeCheck(smem_bytes <= smem_limit, "moe_align small: ", smem_bytes, " bytes of shared memory > ", smem_limit);

  // Launch
  const auto kernel = moe_align_small_kernel<T>;
  if (smem_bytes > MoeAlignConfig::kDefaultSmemBytes) allow_dynamic_smem(kernel, smem_bytes, device.device_id, loc);
  LaunchKernel(static_cast<uint32_t>(num_ctas), Small::kThreads, device, static_cast<std::size_t>(smem_bytes))
      .enable_pdl(true)(kernel, q);
}

}  // namespace
