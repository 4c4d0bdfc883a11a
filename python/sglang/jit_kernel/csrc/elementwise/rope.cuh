// Rotary position embedding (RoPE) of q and k in place, optionally storing the rotated k and an
// untouched v into paged KV caches in the same launch. The engine of apply_rope_inplace,
// apply_rope_inplace_with_kvcache and rotary_embedding (each op's module instantiates only its own
// launcher); fused_qknorm_rope.cuh reuses its rotation math. The KV store writes through a policy
// (the kernels' Kv parameter): RopeKvCopy, bit copies into caches of T, or rope_fp8_kvcache.cuh's
// RopeKvFp8, quantized into fp8 e4m3 caches.
//
//   c = cache[pos, i], s = cache[pos, R/2 + i]            (i < R/2, R = rope_dim)
//   NeoX  (is_neox):  (x[i], x[i + R/2])  <- (x*c - y*s, x*s + y*c)
//   GPT-J (!is_neox): (x[2i], x[2i + 1])  <- (x*c - y*s, x*s + y*c)
//
// fp32 arithmetic, one rounding to T; elements [R, head_dim) of each head are untouched. The cache
// is fp32 for the sglang-style ops and T for vLLM's rotary_embedding (CacheT).
//
// Layout of the work. A head's R rotated elements are C = R / (2 * kVecN) "pair chunks": chunk c is
// two vectors of kVecN elements holding kVecN complete pairs (NeoX: x[cV .. cV+V) and
// x[R/2 + cV ..); GPT-J: x[2cV .. 2cV+2V)), rotated with cos/sin entries cV .. cV+V of the row.
// The block is (lanes, heads, tokens): threadIdx.x walks the chunks of a head, threadIdx.y the heads
// of q then k (one grid for both, each with its own token and head strides), threadIdx.z the tokens
// of the CTA. A thread loads its cos/sin vectors once per (token, chunk) and reuses them for every
// head it rotates (the rows are tiny next to q and k: R * 4 bytes per token against
// (Hq + Hk) * head_dim * sizeof(T) * 2). A thread loads two heads' vectors before it stores any
// (RopeConfig::kHeadsPerThread: twice the bytes in flight per thread of one head). Offsets are
// 64-bit. Vectors are 16 bytes when every pointer, stride and R/2 allow it, narrower otherwise
// (down to one element), so no access is ever misaligned.
//
// Kernels, as rope_dispatch picks them (R/2 <= kMaxLanes 16-byte vectors is "early fits"):
//   rotation only, 16-byte vectors: rope_early_kernel (addresses before the PDL wait, the position
//     load first after it) below RopeConfig::kEarlyMaxBytes of rotated bytes where it fits; else
//     rope_kernel, L2-hinted from kL2HintMinBytes.
//   KV store, 16-byte vectors: rope_early_kernel<kKvStore> (rows of threads of their own copy v)
//     below kL2HintMinBytes; from there rope_kernel in the split mode (kKvSplit, the same v rows),
//     L2-hinted; rope_kernel with no v rows (kKvMode 0, L2-hinted from kL2HintMinBytes) when no row
//     of lanes fits next to the rotating ones in kMaxThreads (a row fits only next to at most 256
//     lanes a head, where the early kernel fits).
//   narrower vectors: rope_kernel without the hint (with the KV store: v prefetched by the rotating
//     threads, kKvPrefetch).
//
// A position outside [0, max_position) reads nothing from the cache: its token's heads are rotated
// by cos = 1, sin = 0 in fp32 (and stored so, with the KV cache): finite values keep their value (x * 1
// - y * 0 may turn -0.0 into +0.0), and the partner of an inf or NaN becomes NaN. An out_loc outside
// [0, cache_size) skips that token's cache writes. Bytes moved: 2 * N * (Hq + Hk) * R * sizeof(T)
// (read + write of the rotated elements) + N * R * sizeof(CacheT) + N * sizeof(position), and with
// the KV store + N * Hk * (2 * D - R) * sizeof(T) (the rest of k and all of v read) + 2 * N * Hk * D
// * sizeof(cache element) (both caches written) + N * sizeof(out_loc) (rope.py's formula).
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, SymbolicSize, SymbolicDevice, kAnySize, data_ptr, verify_no_partial_overlap
#include <sgl_kernel/utils.h>  // For RuntimeCheck, div_ceil

#include <sgl_kernel/runtime.cuh>  // For runtime::get_cc_major
#include <sgl_kernel/type.cuh>     // For packed_t, cast, fp16x2_t
#include <sgl_kernel/utils.cuh>    // For LaunchKernel, SGL_DEVICE, pdl_wait_primary, pdl_launch_dependents
#include <sgl_kernel/vec.cuh>      // For AlignedVector, L2Policy, l2_evict_last_policy, l2_evict_normal_policy

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <dlpack/dlpack.h>
#include <initializer_list>
#include <tvm/ffi/container/tensor.h>
#include <type_traits>
#include <utility>

namespace {

/// Launch facts of the RoPE kernels.
struct RopeConfig {
  static constexpr uint32_t kMaxThreads = 512;  // threads per CTA, upper bound (__launch_bounds__)
  // CTAs of kMaxThreads per SM the registers of rope_kernel must allow: 2 caps them at 64. At 4 (32
  // registers, full occupancy) ptxas spills 300-400 bytes per thread in the 16-byte builds.
  static constexpr uint32_t kMinBlocks = 2;
  static constexpr int64_t kTargetThreads = 256;       // tokens are packed into a CTA up to this many threads
  static constexpr int64_t kMaxLanes = 512;            // lanes per head (chunks beyond: lanes loop)
  static constexpr int kHeadsPerThread = 2;            // heads a thread loads before it stores (when there are 2+)
  static constexpr int64_t kL2HintMinBytes = 1 << 20;  // in-place launches at least this large use the L2 hint
  // Rotation only: below this many rotated bytes rope_early_kernel (no L2 hint), above it the
  // L2-hinted rope_kernel (the L2-resident sizes against the DRAM-bound ones; 32 MiB stays well
  // inside the 50 MB L2 of an H100 / H200; docs/perf_notes.md, RoPE).
  static constexpr int64_t kEarlyMaxBytes = int64_t{32} << 20;
  // v vectors per thread loaded before the rotation (KV store at narrow vectors; rope_early_kernel's
  // v rows)
  static constexpr int kKvPrefetch = 2;
  static constexpr int kKvSplit = -1;  // rope_kernel's kKvMode: v copied by rows of threads of their own
};
/// One tensor of heads (q or k): element (t, h, e) at data + t * token_stride + h * head_stride + e.
struct RopeHeads {
  void* data;            // [num_tokens, num_heads, head_dim], last dim contiguous
  int64_t token_stride;  // elements
  int64_t head_stride;   // elements
  int64_t num_heads;
};

/// Kernel arguments of rope_kernel and rope_early_kernel.
struct RopeParams {
  RopeHeads q;                // [num_tokens, num_q_heads, head_dim]
  RopeHeads k;                // [num_tokens, num_kv_heads, head_dim]
  const void* cos_sin_cache;  // [max_position, cache_stride] of CacheT: cos in [0, half), sin in [half, 2 * half)
  int64_t cache_stride;       // elements of CacheT between rows
  int64_t max_position;
  const void* positions;  // [num_tokens], int32 or int64
  bool positions_int64;
  int64_t num_tokens;
  int64_t half;  // R / 2
  int64_t head_dim;
  // KV store (k_cache == nullptr: none)
  const void* v;  // [num_tokens, num_kv_heads, head_dim]
  int64_t v_token_stride;
  int64_t v_head_stride;
  void* k_cache;  // [cache_size, num_kv_heads * head_dim], row stride k_cache_stride
  void* v_cache;  // [cache_size, num_kv_heads * head_dim], row stride v_cache_stride
  int64_t k_cache_stride;
  int64_t v_cache_stride;
  const void* out_loc;  // [num_tokens], int32 or int64
  bool out_loc_int64;
  int64_t cache_size;
  int64_t v_rows;  // the last v_rows rows of blockDim.y copy v (rope_early_kernel<kKvStore>, and
                   // kKvMode kKvSplit); 0 otherwise
  // KV store into caches of another dtype (a quantizing Kv policy): per-tensor scales
  const float* k_scale;  // [1] on the device, or nullptr: k_inv_scale is used
  const float* v_scale;  // [1] on the device, or nullptr: v_inv_scale is used
  float k_inv_scale;
  float v_inv_scale;
};

/// Global vector accesses of q/k with or without the L2 hint (loads evict_last, stores
/// evict_normal: the in-place pattern of the norm kernels, docs/perf_notes.md, norm_rows.cuh's
/// RowAccess; it lets the L2 write the dirty lines back first at large sizes).
template <bool kL2Hint>
struct RopeAccess {
  device::L2Policy load_policy;
  device::L2Policy store_policy;

  SGL_DEVICE static RopeAccess make() {
    if constexpr (kL2Hint) {
      return {device::l2_evict_last_policy(), device::l2_evict_normal_policy()};
    } else {
      return {};
    }
  }
  template <typename V>
  SGL_DEVICE void load(V& v, const void* ptr) const {
    if constexpr (kL2Hint) {
      v.load(ptr, 0, load_policy);
    } else {
      v.load(ptr);
    }
  }
  template <typename V>
  SGL_DEVICE void store(const V& v, void* ptr) const {
    if constexpr (kL2Hint) {
      v.store(ptr, 0, store_policy);
    } else {
      v.store(ptr);
    }
  }
};

/// One vector of a KV-cache store at `ptr`: the L2-policy form of AlignedVector::store (evict_normal,
/// the priority of a plain store), which is always one vector st.global. The plain form may be split
/// into four 4-byte stores for these cache writes (a value also stored in place, or copied straight
/// from a load), four times the store instructions.
template <typename V>
SGL_DEVICE void rope_cache_store(const V& v, void* ptr) {
  v.store(ptr, 0, device::l2_evict_normal_policy());
}

/// The KV store's element policy (the kernels' Kv parameter): caches of T, written as bit copies.
/// A policy names the cache element (elem_t), makes its per-thread state after the PDL wait
/// (make: what it reads may be the previous kernel's output) and stores a vector of T, rotated k
/// or v (is_k), at an element of the cache. rope_fp8_kvcache.cuh's RopeKvFp8 quantizes instead.
template <typename T>
struct RopeKvCopy {
  using elem_t = T;
  SGL_DEVICE static RopeKvCopy make(const RopeParams&) { return {}; }
  template <std::size_t N>
  SGL_DEVICE void store(const device::AlignedVector<T, N>& x, elem_t* dst, bool /*is_k*/) const {
    rope_cache_store(x, dst);
  }
};

/// Reads index `i` of an int32 or int64 index tensor as int64.
SGL_DEVICE int64_t load_index(const void* ptr, bool is_int64, int64_t i) {
  return is_int64 ? static_cast<const int64_t*>(ptr)[i] : static_cast<int64_t>(static_cast<const int32_t*>(ptr)[i]);
}

/// Element offsets (within a head) of the two vectors of pair chunk `chunk`.
/// NeoX: [cV, cV + V) and [half + cV, ...); GPT-J: [2cV, 2cV + V) and [2cV + V, 2cV + 2V).
template <int kVecN, bool kNeox>
SGL_DEVICE void chunk_offsets(int64_t chunk, int64_t half, int64_t& first, int64_t& second) {
  if constexpr (kNeox) {
    first = chunk * kVecN;
    second = half + chunk * kVecN;
  } else {
    first = chunk * (2 * kVecN);
    second = first + kVecN;
  }
}

/// The N elements of v in fp32, two at a time: bf16 -> fp32 is a bit placement (one shift or mask
/// per element), fp16 one paired conversion per two elements.
template <typename T, int N>
SGL_DEVICE void rope_to_floats(const device::AlignedVector<T, N>& v, float (&out)[N]) {
  if constexpr ((std::is_same_v<T, bf16_t> || std::is_same_v<T, fp16_t>) && N >= 2) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      uint32_t bits;
      memcpy(&bits, &v[2 * i], sizeof(bits));
      if constexpr (std::is_same_v<T, bf16_t>) {
        out[2 * i] = __uint_as_float(bits << 16);
        out[2 * i + 1] = __uint_as_float(bits & 0xffff0000u);
      } else {
        fp16x2_t pair;
        memcpy(&pair, &bits, sizeof(pair));
        const float2 f = __half22float2(pair);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = static_cast<float>(v[i]);
  }
}

/// v = in rounded to T (round to nearest even), two elements per conversion for fp16 / bf16.
template <typename T, int N>
SGL_DEVICE void rope_from_floats(const float (&in)[N], device::AlignedVector<T, N>& v) {
  if constexpr ((std::is_same_v<T, bf16_t> || std::is_same_v<T, fp16_t>) && N >= 2) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const packed_t<T> pair = device::cast<packed_t<T>>(make_float2(in[2 * i], in[2 * i + 1]));
      memcpy(&v[2 * i], &pair, sizeof(pair));
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = static_cast<T>(in[i]);
  }
}

/// Rotates the kVecN pairs of z = [za, zb] (fp32) by (c[j], s[j]) and rounds the results once into
/// (a, b). Pair j is (za[j], zb[j]) for NeoX, (z[2j], z[2j + 1]) for GPT-J. Each result is one
/// product and one fused multiply-add in a fixed order, x' = fma(x, c, -(y * s)) and y' = fma(y, c,
/// x * s): left to contraction, the compiler picks either product for the FMA, pair by pair and
/// kernel by kernel, and the kernels that rotate (every rope op, the fp8-cache one included) would
/// differ in the last bit of fp32 results.
template <typename T, int kVecN, bool kNeox>
SGL_DEVICE void rotate_pairs_fp32(
    const float (&za)[kVecN],
    const float (&zb)[kVecN],
    const float (&c)[kVecN],
    const float (&s)[kVecN],
    device::AlignedVector<T, kVecN>& a,
    device::AlignedVector<T, kVecN>& b) {
  float z[2 * kVecN];
#pragma unroll
  for (int j = 0; j < kVecN; ++j) {
    z[j] = za[j];
    z[kVecN + j] = zb[j];
  }
  float r[2 * kVecN];
#pragma unroll
  for (int j = 0; j < kVecN; ++j) {
    const int ix = kNeox ? j : 2 * j;
    const int iy = kNeox ? kVecN + j : 2 * j + 1;
    const float x = z[ix], y = z[iy];
    r[ix] = fmaf(x, c[j], -(y * s[j]));
    r[iy] = fmaf(y, c[j], x * s[j]);
  }
  float ra[kVecN], rb[kVecN];
#pragma unroll
  for (int j = 0; j < kVecN; ++j) {
    ra[j] = r[j];
    rb[j] = r[kVecN + j];
  }
  rope_from_floats<T, kVecN>(ra, a);
  rope_from_floats<T, kVecN>(rb, b);
}

/// Rotates the kVecN pairs held in (a, b) in place (see rotate_pairs_fp32).
template <typename T, int kVecN, bool kNeox>
SGL_DEVICE void rotate_pairs(
    device::AlignedVector<T, kVecN>& a,
    device::AlignedVector<T, kVecN>& b,
    const float (&c)[kVecN],
    const float (&s)[kVecN]) {
  float za[kVecN], zb[kVecN];
  rope_to_floats<T, kVecN>(a, za);
  rope_to_floats<T, kVecN>(b, zb);
  rotate_pairs_fp32<T, kVecN, kNeox>(za, zb, c, s, a, b);
}

/// cos/sin entries [chunk * kVecN, + kVecN) of the cache row of `pos`, as fp32; (1, 0) when pos is
/// outside [0, max_position) (nothing is read then).
template <typename CacheT, int kVecN>
SGL_DEVICE void load_cos_sin(const RopeParams& p, int64_t pos, int64_t chunk, float (&c)[kVecN], float (&s)[kVecN]) {
  if (pos >= 0 && pos < p.max_position) {
    const CacheT* row = static_cast<const CacheT*>(p.cos_sin_cache) + pos * p.cache_stride + chunk * kVecN;
    device::AlignedVector<CacheT, kVecN> cv, sv;
    cv.load(row);
    sv.load(row + p.half);
#pragma unroll
    for (int j = 0; j < kVecN; ++j) {
      c[j] = static_cast<float>(cv[j]);
      s[j] = static_cast<float>(sv[j]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kVecN; ++j) {
      c[j] = 1.0f;
      s[j] = 0.0f;
    }
  }
}

/// Address of head `head` (q heads first, then k) of token `token`.
template <typename T>
SGL_DEVICE T* head_at(const RopeParams& p, int64_t token, int64_t head) {
  const bool is_q = head < p.q.num_heads;
  const RopeHeads& heads = is_q ? p.q : p.k;
  const int64_t h = is_q ? head : head - p.q.num_heads;
  return static_cast<T*>(heads.data) + token * heads.token_stride + h * heads.head_stride;
}

/// Stores elements [begin, head_dim) of a k head and [v_begin, head_dim) of a v head to their cache
/// rows, lanes striding over vectors (the KV store's part that needs no rotation).
template <typename T, int kVecN, typename Kv>
SGL_DEVICE void copy_kv_rest(
    const RopeParams& p,
    const Kv& kv,
    const T* k_head,
    int64_t token,
    int64_t kv_head,
    int64_t loc,
    int64_t begin,
    int64_t v_begin) {
  using vec_t = device::AlignedVector<T, kVecN>;
  using elem_t = typename Kv::elem_t;
  elem_t* kc = static_cast<elem_t*>(p.k_cache) + loc * p.k_cache_stride + kv_head * p.head_dim;
  elem_t* vc = static_cast<elem_t*>(p.v_cache) + loc * p.v_cache_stride + kv_head * p.head_dim;
  const T* v_head = static_cast<const T*>(p.v) + token * p.v_token_stride + kv_head * p.v_head_stride;
  const int64_t step = int64_t{blockDim.x} * kVecN;
  for (int64_t e = begin + int64_t{threadIdx.x} * kVecN; e < p.head_dim; e += step) {
    vec_t x;
    x.load(k_head + e);
    kv.store(x, kc + e, true);
  }
  for (int64_t e = v_begin + int64_t{threadIdx.x} * kVecN; e < p.head_dim; e += step) {
    vec_t x;
    x.load(v_head + e);
    kv.store(x, vc + e, false);
  }
}

/// KV store: the rotated vectors (a, b) of head `head` (q heads first, then k) at element offsets
/// (off_a, off_b) go to k_cache[loc] when it is a k head and loc >= 0.
template <typename T, int kVecN, typename Kv>
SGL_DEVICE void rope_store_k_cache(
    const RopeParams& p,
    const Kv& kv,
    int64_t head,
    int64_t loc,
    int64_t off_a,
    int64_t off_b,
    const device::AlignedVector<T, kVecN>& a,
    const device::AlignedVector<T, kVecN>& b) {
  if (loc < 0 || head < p.q.num_heads) return;
  using elem_t = typename Kv::elem_t;
  elem_t* kc = static_cast<elem_t*>(p.k_cache) + loc * p.k_cache_stride + (head - p.q.num_heads) * p.head_dim;
  kv.store(a, kc + off_a, true);
  kv.store(b, kc + off_b, true);
}

/// One CTA: tokens blockIdx.x * blockDim.z + threadIdx.z; thread (x, y) rotates chunks x, x +
/// blockDim.x, ... of heads y, y + blockDim.y, ... of q then k (and stores k/v with the KV cache).
/// Preconditions (the launcher's): every pointer, token/head stride and `half` a multiple of kVecN
/// elements (of head_dim too with the KV store); the cache pointer, stride and half a multiple of
/// kVecN elements of CacheT.
/// kKvMode (KV store only): v vectors per thread prefetched before the rotation (kKvPrefetch, the
/// default; 0: none), or RopeConfig::kKvSplit: the last p.v_rows rows of blockDim.y only copy v
/// (kv heads y - rot_rows, stepping v_rows), the others rotate and store k.
/// Kv: the KV store's element policy (RopeKvCopy: caches of T).
template <
    typename T,
    typename CacheT,
    int kVecN,
    bool kNeox,
    bool kL2Hint,
    bool kKvStore,
    int kKvMode = RopeConfig::kKvPrefetch,
    typename Kv = RopeKvCopy<T>>
__global__ void __launch_bounds__(RopeConfig::kMaxThreads, RopeConfig::kMinBlocks) rope_kernel(const RopeParams p) {
  using vec_t = device::AlignedVector<T, kVecN>;
  using elem_t = typename Kv::elem_t;
  const int64_t token = int64_t{blockIdx.x} * blockDim.z + threadIdx.z;
  const int64_t num_heads = p.q.num_heads + p.k.num_heads;
  const int64_t num_chunks = p.half / kVecN;
  const bool kv_store = kKvStore && p.k_cache != nullptr;
  const RopeAccess<kL2Hint> access = RopeAccess<kL2Hint>::make();
  constexpr bool kSplit = kKvStore && kKvMode == RopeConfig::kKvSplit;
  // rows of blockDim.y that rotate (all of them but in the split mode)
  const uint32_t rot_rows = kSplit ? blockDim.y - static_cast<uint32_t>(p.v_rows) : blockDim.y;

  // Everything below may read what the previous kernel in the stream writes (PDL).
  device::pdl_wait_primary();
  device::pdl_launch_dependents();
  if (token >= p.num_tokens) return;
  const Kv kv = Kv::make(p);

  if constexpr (kSplit) {
    if (threadIdx.y >= rot_rows) {
      // v rows: the token's loc and v vectors loaded together (two vectors per pass), then stored.
      const int64_t loc = load_index(p.out_loc, p.out_loc_int64, token);
      const int64_t vstep = int64_t{blockDim.x} * kVecN;
      for (int64_t kv_head = threadIdx.y - rot_rows; kv_head < p.k.num_heads; kv_head += p.v_rows) {
        const T* v_head = static_cast<const T*>(p.v) + token * p.v_token_stride + kv_head * p.v_head_stride;
        elem_t* vc = static_cast<elem_t*>(p.v_cache) + loc * p.v_cache_stride + kv_head * p.head_dim;
        for (int64_t e = int64_t{threadIdx.x} * kVecN; e < p.head_dim; e += 2 * vstep) {
          const bool second = e + vstep < p.head_dim;
          vec_t x0, x1;
          x0.load(v_head + e);
          if (second) x1.load(v_head + e + vstep);
          if (loc < 0 || loc >= p.cache_size) return;
          kv.store(x0, vc + e, false);
          if (second) kv.store(x1, vc + e + vstep, false);
        }
      }
      return;
    }
  }

  // KV store: this thread's first kKvPrefetch vectors of v (kv head threadIdx.y), loaded before
  // the rotation so that their latency overlaps it (stored at the end, once loc is known; at one
  // token a v copy after the rotation would add a second memory latency in series).
  using vec_t_kv = device::AlignedVector<T, kVecN>;
  constexpr int kKvPrefetch = kKvStore ? (kKvMode > 0 ? kKvMode : 0) : 1;
  vec_t_kv v_pre[kKvPrefetch > 0 ? kKvPrefetch : 1];
  const int64_t kv_step = int64_t{blockDim.x} * kVecN;
  const T* v_head = nullptr;
  if constexpr (kKvStore && kKvPrefetch > 0) {
    if (kv_store && threadIdx.y < p.k.num_heads) {
      v_head = static_cast<const T*>(p.v) + token * p.v_token_stride + int64_t{threadIdx.y} * p.v_head_stride;
#pragma unroll
      for (int i = 0; i < kKvPrefetch; ++i) {
        const int64_t e = int64_t{threadIdx.x} * kVecN + i * kv_step;
        if (e < p.head_dim) v_pre[i].load(v_head + e);
      }
    }
  }

  int64_t loc = -1;  // cache row of this token (-1: no store)
  bool first_load = true;
  int64_t pos = 0;
  constexpr int kHeads = RopeConfig::kHeadsPerThread;
  const int64_t step = rot_rows;
  for (int64_t chunk = threadIdx.x; chunk < num_chunks; chunk += blockDim.x) {
    int64_t off_a, off_b;
    chunk_offsets<kVecN, kNeox>(chunk, p.half, off_a, off_b);
    // A thread rotates kHeads heads (first, first + step, ...) per iteration, all loaded before any
    // is stored: the bytes in flight per thread at large sizes.
    int64_t first = threadIdx.y;
    if (first >= num_heads) break;
    vec_t a[kHeads], b[kHeads];
    T* ptr[kHeads];
    const auto load_heads = [&]() {
#pragma unroll
      for (int i = 0; i < kHeads; ++i) {
        const int64_t head = first + i * step;
        if (head < num_heads) {
          ptr[i] = head_at<T>(p, token, head);
          access.load(a[i], ptr[i] + off_a);
          access.load(b[i], ptr[i] + off_b);
        }
      }
    };
    load_heads();  // before the position: overlaps the position -> cache row chain
    // With the KV store the position is loaded again for each chunk (lanes loop past kMaxLanes
    // chunks only), not held across the loop: the registers of the store's policy.
    if (first_load || kKvStore) pos = load_index(p.positions, p.positions_int64, token);
    if (first_load) {
      if (kv_store) {
        loc = load_index(p.out_loc, p.out_loc_int64, token);
        if (loc < 0 || loc >= p.cache_size) loc = -1;
      }
      first_load = false;
    }
    float c[kVecN], s[kVecN];
    load_cos_sin<CacheT, kVecN>(p, pos, chunk, c, s);
    while (true) {
#pragma unroll
      for (int i = 0; i < kHeads; ++i) {
        const int64_t head = first + i * step;
        if (head >= num_heads) continue;
        rotate_pairs<T, kVecN, kNeox>(a[i], b[i], c, s);
        access.store(a[i], ptr[i] + off_a);
        access.store(b[i], ptr[i] + off_b);
        rope_store_k_cache<T, kVecN>(p, kv, head, loc, off_a, off_b, a[i], b[i]);
      }
      first += kHeads * step;
      if (first >= num_heads) break;
      load_heads();
    }
  }

  // KV store: the unrotated rest of each k head and all of v (no rotation, bit for bit). A token
  // whose lanes all skipped the loop above (no heads, or no chunks) still needs its loc.
  if (kv_store) {
    if (first_load) {
      loc = load_index(p.out_loc, p.out_loc_int64, token);
      if (loc < 0 || loc >= p.cache_size) loc = -1;
    }
    if (loc < 0) return;
    if constexpr (kKvStore && kKvPrefetch > 0) {
      if (v_head != nullptr) {
        elem_t* vc = static_cast<elem_t*>(p.v_cache) + loc * p.v_cache_stride + int64_t{threadIdx.y} * p.head_dim;
#pragma unroll
        for (int i = 0; i < kKvPrefetch; ++i) {
          const int64_t e = int64_t{threadIdx.x} * kVecN + i * kv_step;
          if (e < p.head_dim) kv.store(v_pre[i], vc + e, false);
        }
      }
    }
    for (int64_t kv_head = threadIdx.y; kv_head < p.k.num_heads; kv_head += rot_rows) {
      const T* k_head = static_cast<const T*>(p.k.data) + token * p.k.token_stride + kv_head * p.k.head_stride;
      // the first head's first kKvPrefetch v vectors went above; the split mode's v rows copy v
      const int64_t v_begin = kSplit ? p.head_dim : kv_head == threadIdx.y ? kKvPrefetch * kv_step : 0;
      copy_kv_rest<T, kVecN>(p, kv, k_head, token, kv_head, loc, 2 * p.half, v_begin);
    }
  }
}

/// out_loc[token] when it is inside [0, cache_size), else -1 (the token stores nothing).
SGL_DEVICE int64_t rope_valid_loc(const RopeParams& p, int64_t token) {
  const int64_t loc = load_index(p.out_loc, p.out_loc_int64, token);
  return loc >= 0 && loc < p.cache_size ? loc : -1;
}

/// rope_early_kernel's v rows (kKvStore): row `row` of the p.v_rows copies kv heads row, row +
/// v_rows, ...: all of v and the unrotated rest [2 * half, head_dim) of k to the caches at loc,
/// lanes striding over 16-byte vectors. The loc load and a head's first RopeConfig::kKvPrefetch v
/// vectors per lane are issued together after the PDL wait, so the copy costs one memory latency
/// (stored through the Kv policy).
template <typename T, int kVecN, typename Kv>
SGL_DEVICE void rope_early_copy_v(const RopeParams& p, int64_t token, int64_t row) {
  using vec_t = device::AlignedVector<T, kVecN>;
  using elem_t = typename Kv::elem_t;
  constexpr int kPre = RopeConfig::kKvPrefetch;
  const int64_t vstep = int64_t{blockDim.x} * kVecN;
  const int64_t e0 = int64_t{threadIdx.x} * kVecN;
  device::pdl_wait_primary();
  device::pdl_launch_dependents();
  if (token >= p.num_tokens || row >= p.k.num_heads) return;
  const int64_t loc = rope_valid_loc(p, token);
  const Kv kv = Kv::make(p);
  // No unrolling: a trip count would be a 64-bit division before the first load.
  const bool has_rest = 2 * p.half < p.head_dim || kPre * vstep < p.head_dim;
#pragma unroll 1
  for (int64_t kv_head = row; kv_head < p.k.num_heads; kv_head += p.v_rows) {
    const T* v_head = static_cast<const T*>(p.v) + token * p.v_token_stride + kv_head * p.v_head_stride;
    vec_t x[kPre];
#pragma unroll
    for (int i = 0; i < kPre; ++i) {
      if (e0 + i * vstep < p.head_dim) x[i].load(v_head + e0 + i * vstep);
    }
    if (loc < 0) return;
    elem_t* vc = static_cast<elem_t*>(p.v_cache) + loc * p.v_cache_stride + kv_head * p.head_dim;
#pragma unroll
    for (int i = 0; i < kPre; ++i) {
      if (e0 + i * vstep < p.head_dim) kv.store(x[i], vc + e0 + i * vstep, false);
    }
    if (!has_rest) continue;  // R = head_dim and the prefetch held all of v: nothing left
    const T* k_head = static_cast<const T*>(p.k.data) + token * p.k.token_stride + kv_head * p.k.head_stride;
    copy_kv_rest<T, kVecN>(p, kv, k_head, token, kv_head, loc, 2 * p.half, kPre * vstep);
  }
}

/// rope_kernel's math and layout with every address of the first pass (64-bit head pointers, the
/// position pointer, the cache chunk base) formed before the PDL wait, the position load issued
/// first after it, then the q/k loads; the cos/sin load follows as soon as the position arrives (one
/// 64-bit multiply-add). RopeConfig::kHeadsPerThread heads per thread in the first pass.
/// Preconditions (the launcher's): rope_kernel's at the 16-byte vector, and num_chunks <= blockDim.x
/// (one chunk per lane: threadIdx.x < num_chunks rotates chunk threadIdx.x).
/// A small-size kernel: registers are not capped for occupancy (min blocks 1: 128 registers).
/// kKvStore: the KV store in the same launch. The last p.v_rows rows of blockDim.y copy v (and the
/// unrotated rest [R, head_dim) of k) with rope_early_copy_v; the other rows rotate as above and
/// also store each rotated k vector to k_cache[loc], loc being loaded right after the position (both
/// index loads are in flight together, before the data loads). Kv: as rope_kernel's.
template <typename T, typename CacheT, int kVecN, bool kNeox, bool kKvStore, typename Kv = RopeKvCopy<T>>
__global__ void __launch_bounds__(RopeConfig::kMaxThreads, 1) rope_early_kernel(const RopeParams p) {
  constexpr int kHeads = RopeConfig::kHeadsPerThread;
  using vec_t = device::AlignedVector<T, kVecN>;
  using cvec_t = device::AlignedVector<CacheT, kVecN>;
  const int64_t token = int64_t{blockIdx.x} * blockDim.z + threadIdx.z;
  const int64_t num_heads = p.q.num_heads + p.k.num_heads;
  const int64_t chunk = threadIdx.x;
  const uint32_t rot_rows = kKvStore ? blockDim.y - static_cast<uint32_t>(p.v_rows) : blockDim.y;
  if constexpr (kKvStore) {
    if (threadIdx.y >= rot_rows) return rope_early_copy_v<T, kVecN, Kv>(p, token, threadIdx.y - rot_rows);
  }
  const int64_t step = rot_rows;
  const bool active = token < p.num_tokens && chunk < p.half / kVecN && int64_t{threadIdx.y} < num_heads;
  int64_t off_a, off_b;
  chunk_offsets<kVecN, kNeox>(chunk, p.half, off_a, off_b);
  T* pa[kHeads];
  T* pb[kHeads];
  bool has[kHeads];
#pragma unroll
  for (int i = 0; i < kHeads; ++i) {
    const int64_t head = threadIdx.y + i * step;
    has[i] = active && head < num_heads;
    T* base = has[i] ? head_at<T>(p, token, head) : static_cast<T*>(p.q.data);
    pa[i] = base + off_a;
    pb[i] = base + off_b;
  }
  const CacheT* cache_chunk = static_cast<const CacheT*>(p.cos_sin_cache) + chunk * kVecN;
  const void* pos_ptr = p.positions_int64
                            ? static_cast<const void*>(static_cast<const int64_t*>(p.positions) + (active ? token : 0))
                            : static_cast<const void*>(static_cast<const int32_t*>(p.positions) + (active ? token : 0));

  device::pdl_wait_primary();
  device::pdl_launch_dependents();
  if (!active) return;

  const int64_t pos = p.positions_int64 ? *static_cast<const int64_t*>(pos_ptr)
                                        : static_cast<int64_t>(*static_cast<const int32_t*>(pos_ptr));
  // KV store: this token's cache row (-1: none), loaded beside the position
  const int64_t loc = kKvStore ? rope_valid_loc(p, token) : -1;
  const Kv kv = Kv::make(p);
  vec_t a[kHeads], b[kHeads];
#pragma unroll
  for (int i = 0; i < kHeads; ++i) {
    if (has[i]) {
      a[i].load(pa[i]);
      b[i].load(pb[i]);
    }
  }
  float c[kVecN], s[kVecN];
  if (pos >= 0 && pos < p.max_position) {
    const CacheT* row = cache_chunk + pos * p.cache_stride;
    cvec_t cv, sv;
    cv.load(row);
    sv.load(row + p.half);
#pragma unroll
    for (int j = 0; j < kVecN; ++j) {
      c[j] = static_cast<float>(cv[j]);
      s[j] = static_cast<float>(sv[j]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kVecN; ++j) {
      c[j] = 1.0f;
      s[j] = 0.0f;
    }
  }
#pragma unroll
  for (int i = 0; i < kHeads; ++i) {
    if (!has[i]) continue;
    rotate_pairs<T, kVecN, kNeox>(a[i], b[i], c, s);
    a[i].store(pa[i]);
    b[i].store(pb[i]);
    if constexpr (kKvStore) rope_store_k_cache<T, kVecN>(p, kv, threadIdx.y + i * step, loc, off_a, off_b, a[i], b[i]);
  }
  // the heads beyond the first pass (more than kHeads * rotating rows): one at a time (not
  // unrolled: an unrolled loop's trip count would put a division ahead of the first pass's loads)
#pragma unroll 1
  for (int64_t head = threadIdx.y + kHeads * step; head < num_heads; head += step) {
    T* ptr = head_at<T>(p, token, head);
    vec_t x, y;
    x.load(ptr + off_a);
    y.load(ptr + off_b);
    rotate_pairs<T, kVecN, kNeox>(x, y, c, s);
    x.store(ptr + off_a);
    y.store(ptr + off_b);
    if constexpr (kKvStore) rope_store_k_cache<T, kVecN>(p, kv, head, loc, off_a, off_b, x, y);
  }
}

// ---------------------------------------------------------------------------------------------
// Host side
// ---------------------------------------------------------------------------------------------

/// Widest vector (elements of T, a power of two, at most 16 bytes) such that every value in
/// `byte_values` (addresses, byte strides, byte lengths) is a multiple of its size.
template <typename T>
int64_t rope_vector_elements(std::initializer_list<uint64_t> byte_values) {
  uint64_t bits = 0;
  for (const uint64_t v : byte_values) bits |= v;
  int64_t bytes = 16;
  while (bytes > static_cast<int64_t>(sizeof(T)) && bits % static_cast<uint64_t>(bytes) != 0) bytes /= 2;
  return bytes / static_cast<int64_t>(sizeof(T));
}

inline uint64_t rope_address(const void* ptr) { return reinterpret_cast<uint64_t>(ptr); }

/// enable_pdl: 1 on, 0 off, negative "auto" = on for compute capability >= 9.
inline bool rope_resolve_pdl(int64_t enable_pdl, const DLDevice& device) {
  if (enable_pdl >= 0) return enable_pdl != 0;
  return host::runtime::get_cc_major(device.device_id) >= 9;
}

/// Block (lanes, heads, tokens) of a launch with `num_chunks` chunks per head.
/// Lanes: every chunk of a head (up to kMaxLanes); heads: kHeadsPerThread per thread when there are
/// that many, more passes when the CTA would exceed kMaxThreads; tokens: packed until kTargetThreads.
inline dim3 rope_block(int64_t num_chunks, int64_t num_heads, int64_t num_tokens) {
  const int64_t lanes = std::clamp<int64_t>(num_chunks, 1, RopeConfig::kMaxLanes);
  const int64_t heads_total = std::max<int64_t>(num_heads, 1);
  const int64_t max_heads = std::max<int64_t>(1, RopeConfig::kMaxThreads / lanes);
  const int64_t passes = std::max<int64_t>(
      host::div_ceil(heads_total, max_heads), std::min<int64_t>(heads_total, RopeConfig::kHeadsPerThread));
  const int64_t heads = host::div_ceil(heads_total, passes);
  const int64_t per_token = lanes * heads;
  // blockDim.z is at most 64 (a CUDA limit)
  const int64_t tokens =
      std::clamp<int64_t>(RopeConfig::kTargetThreads / per_token, 1, std::clamp<int64_t>(num_tokens, 1, 64));
  return dim3(static_cast<uint32_t>(lanes), static_cast<uint32_t>(heads), static_cast<uint32_t>(tokens));
}

/// Launches `kernel` with CTAs of `block` (block.z tokens each) over every token.
template <typename Kernel>
void rope_launch(Kernel kernel, const RopeParams& p, dim3 block, DLDevice device, bool pdl) {
  const int64_t grid = host::div_ceil(p.num_tokens, int64_t{block.z});
  host::RuntimeCheck(grid < (int64_t{1} << 31), "rope: num_tokens too large for one launch, got ", p.num_tokens);
  host::LaunchKernel(static_cast<uint32_t>(grid), block, device).enable_pdl(pdl)(kernel, p);
}

/// rope_kernel at a vector narrower than 16 bytes: the widest of at most kVecN elements that vec_n
/// allows, no L2 hint (with the KV store: v prefetched by the rotating threads).
template <typename T, typename CacheT, int kVecN, bool kNeox, bool kKvStore, typename Kv = RopeKvCopy<T>>
void launch_rope_narrow(const RopeParams& p, int64_t vec_n, DLDevice device, bool pdl) {
  if constexpr (kVecN > 1) {
    if (vec_n < kVecN) return launch_rope_narrow<T, CacheT, kVecN / 2, kNeox, kKvStore, Kv>(p, vec_n, device, pdl);
  }
  const dim3 block = rope_block(p.half / kVecN, p.q.num_heads + p.k.num_heads, p.num_tokens);
  rope_launch(
      rope_kernel<T, CacheT, kVecN, kNeox, false, kKvStore, RopeConfig::kKvPrefetch, Kv>, p, block, device, pdl);
}

/// Rotation only: rope_early_kernel below kEarlyMaxBytes of rotated bytes where it fits, else
/// rope_kernel (L2-hinted when `l2_hint`); narrower vectors when vec_n is below 16 bytes.
template <typename T, typename CacheT, bool kNeox>
void launch_rope(const RopeParams& p, int64_t vec_n, bool l2_hint, int64_t rotated_bytes, DLDevice device, bool pdl) {
  constexpr int kVecN = static_cast<int>(16 / sizeof(T));
  if (vec_n < kVecN) return launch_rope_narrow<T, CacheT, kVecN / 2, kNeox, false>(p, vec_n, device, pdl);
  const int64_t num_chunks = p.half / kVecN;
  const dim3 block = rope_block(num_chunks, p.q.num_heads + p.k.num_heads, p.num_tokens);
  if (num_chunks <= RopeConfig::kMaxLanes && rotated_bytes < RopeConfig::kEarlyMaxBytes) {
    return rope_launch(rope_early_kernel<T, CacheT, kVecN, kNeox, false>, p, block, device, pdl);
  }
  if (l2_hint) return rope_launch(rope_kernel<T, CacheT, kVecN, kNeox, true, false>, p, block, device, pdl);
  rope_launch(rope_kernel<T, CacheT, kVecN, kNeox, false, false>, p, block, device, pdl);
}

/// With the KV store (fp32 cos/sin cache; Kv the cache element policy): rows of lanes of their own
/// copy v, one per kv head, as many as fit kMaxThreads next to the rotating rows; rope_early_kernel
/// below the L2-hint size, rope_kernel's split mode (L2-hinted) above it; rope_kernel without v rows
/// (L2-hinted when `l2_hint`) when none fit; narrower vectors when vec_n is below 16 bytes.
template <typename T, bool kNeox, typename Kv>
void launch_rope_kv(RopeParams p, int64_t vec_n, bool l2_hint, DLDevice device, bool pdl) {
  constexpr int kVecN = static_cast<int>(16 / sizeof(T));
  if (vec_n < kVecN) return launch_rope_narrow<T, fp32_t, kVecN / 2, kNeox, true, Kv>(p, vec_n, device, pdl);
  const int64_t num_chunks = p.half / kVecN;
  const dim3 rot = rope_block(num_chunks, p.q.num_heads + p.k.num_heads, p.num_tokens);
  const int64_t room = static_cast<int64_t>(RopeConfig::kMaxThreads) / rot.x - rot.y;
  p.v_rows = std::min<int64_t>(p.k.num_heads, room);
  const int64_t per_token = int64_t{rot.x} * (rot.y + p.v_rows);
  const int64_t tokens =
      std::clamp<int64_t>(RopeConfig::kTargetThreads / per_token, 1, std::clamp<int64_t>(p.num_tokens, 1, 64));
  const dim3 block(rot.x, static_cast<uint32_t>(rot.y + p.v_rows), static_cast<uint32_t>(tokens));
  // A row of v lanes fits only next to at most kMaxThreads / 2 lanes a head, within the early
  // kernel's limit (kMaxLanes): with v rows, the early kernel below the L2-hint size, the split
  // mode (L2-hinted) above it.
  if (p.v_rows > 0 && !l2_hint) {
    return rope_launch(rope_early_kernel<T, fp32_t, kVecN, kNeox, true, Kv>, p, block, device, pdl);
  }
  constexpr int kSplit = RopeConfig::kKvSplit;
  if (p.v_rows > 0) {
    return rope_launch(rope_kernel<T, fp32_t, kVecN, kNeox, true, true, kSplit, Kv>, p, block, device, pdl);
  }
  if (l2_hint) return rope_launch(rope_kernel<T, fp32_t, kVecN, kNeox, true, true, 0, Kv>, p, block, device, pdl);
  rope_launch(rope_kernel<T, fp32_t, kVecN, kNeox, false, true, 0, Kv>, p, block, device, pdl);
}

/// Validates q, k, cos_sin_cache and positions and fills the rotation part of `p` (p.half = R / 2).
template <typename T, typename CacheT>
void rope_bind(
    const char* op,
    tvm::ffi::TensorView q,
    tvm::ffi::TensorView k,
    tvm::ffi::TensorView cos_sin_cache,
    tvm::ffi::TensorView positions,
    int64_t rope_dim,
    RopeParams& p,
    DLDevice& device) {
  using namespace host;

  SymbolicSize num_tokens{"num_tokens"};
  SymbolicSize num_q_heads{"num_q_heads"};
  SymbolicSize num_kv_heads{"num_kv_heads"};
  SymbolicSize head_dim{"head_dim"};
  SymbolicSize max_position{"max_position"};
  SymbolicSize cache_width{"cache_width"};
  SymbolicDevice device_;
  device_.set_options<kDLCUDA>();
  TensorMatcher({num_tokens, num_q_heads, head_dim})  //
      .with_strides({kAnySize, kAnySize, kAnySize})
      .with_dtype<T>()
      .with_device<kDLCUDA>(device_)
      .verify(q, "q");
  TensorMatcher({num_tokens, num_kv_heads, head_dim})  //
      .with_strides({kAnySize, kAnySize, kAnySize})
      .with_dtype<T>()
      .with_device<kDLCUDA>(device_)
      .verify(k, "k");
  TensorMatcher({max_position, cache_width})  //
      .with_strides({kAnySize, 1})
      .with_dtype<CacheT>()
      .with_device<kDLCUDA>(device_)
      .verify(cos_sin_cache, "cos_sin_cache");
  TensorMatcher({num_tokens})  //
      .with_dtype<int32_t, int64_t>()
      .with_device<kDLCUDA>(device_)
      .verify(positions, "positions");
  RuntimeCheck(
      q.size(2) <= 1 || q.stride(2) == 1, op, ": q must be contiguous in its last dimension, got stride ", q.stride(2));
  RuntimeCheck(
      k.size(2) <= 1 || k.stride(2) == 1, op, ": k must be contiguous in its last dimension, got stride ", k.stride(2));
  verify_no_self_overlap(q, "q");
  verify_no_self_overlap(k, "k");
  verify_no_partial_overlap(k, "k", q, "q", /*allow_same=*/false);
  verify_no_partial_overlap(q, "q", cos_sin_cache, "cos_sin_cache", /*allow_same=*/false);
  verify_no_partial_overlap(k, "k", cos_sin_cache, "cos_sin_cache", /*allow_same=*/false);
  verify_no_partial_overlap(q, "q", positions, "positions", /*allow_same=*/false);
  verify_no_partial_overlap(k, "k", positions, "positions", /*allow_same=*/false);

  const int64_t d = head_dim.unwrap();
  const int64_t width = cache_width.unwrap();
  const int64_t r = rope_dim == 0 ? width : rope_dim;
  RuntimeCheck(r > 0 && r % 2 == 0, op, ": rope_dim must be even and > 0, got ", r);
  RuntimeCheck(r <= d, op, ": rope_dim must be <= head_dim (", d, "), got ", r);
  RuntimeCheck(r <= width, op, ": rope_dim must be <= cos_sin_cache.size(1) (", width, "), got ", r);

  device = device_.unwrap();
  p.q = RopeHeads{data_ptr(q), q.stride(0), q.stride(1), num_q_heads.unwrap()};
  p.k = RopeHeads{data_ptr(k), k.stride(0), k.stride(1), num_kv_heads.unwrap()};
  p.cos_sin_cache = data_ptr<const void>(cos_sin_cache);
  p.cache_stride = cos_sin_cache.stride(0);
  p.max_position = max_position.unwrap();
  p.positions = data_ptr<const void>(positions);
  p.positions_int64 = positions.dtype().bits == 64;
  p.num_tokens = num_tokens.unwrap();
  p.half = r / 2;
  p.head_dim = d;
  p.k_cache = nullptr;
  p.v_cache = nullptr;
  p.v = nullptr;
  p.out_loc = nullptr;
}

/// The widest vector the bound tensors allow (see rope_kernel's preconditions; the KV caches
/// aligned to vec_n elements of Kv::elem_t), the L2-hint size rule, and the launch.
template <typename T, typename CacheT, bool kKvStore, typename Kv = RopeKvCopy<T>>
void rope_dispatch(const RopeParams& p, bool is_neox, DLDevice device, int64_t enable_pdl) {
  static_assert(!kKvStore || std::is_same_v<CacheT, fp32_t>, "the KV store takes an fp32 cache");
  if (p.num_tokens == 0 || p.q.num_heads + p.k.num_heads == 0) return;
  const uint64_t s = sizeof(T);
  uint64_t strides = 0;
  if (p.num_tokens > 1) strides |= static_cast<uint64_t>(p.q.token_stride | p.k.token_stride);
  if (p.q.num_heads > 1) strides |= static_cast<uint64_t>(p.q.head_stride);
  if (p.k.num_heads > 1) strides |= static_cast<uint64_t>(p.k.head_stride);
  uint64_t v_bits = 0, kv_cache_bits = 0;
  const uint64_t es = sizeof(typename Kv::elem_t);
  if constexpr (kKvStore) {  // v is read even where nothing is stored (no slots): always aligned
    v_bits = rope_address(p.v) | static_cast<uint64_t>(p.v_token_stride | p.v_head_stride | p.head_dim) * s;
    kv_cache_bits = rope_address(p.k_cache) | rope_address(p.v_cache) |
                    static_cast<uint64_t>(p.k_cache_stride | p.v_cache_stride | p.head_dim) * es;
  }
  int64_t vec_n = rope_vector_elements<T>(
      {rope_address(p.q.data), rope_address(p.k.data), strides * s, static_cast<uint64_t>(p.half) * s, v_bits});
  while (vec_n > 1 && kv_cache_bits % (static_cast<uint64_t>(vec_n) * es) != 0) vec_n /= 2;
  const uint64_t cs = sizeof(CacheT);
  const uint64_t cache_bits = rope_address(p.cos_sin_cache) |
                              static_cast<uint64_t>(p.max_position > 1 ? p.cache_stride : 0) * cs |
                              static_cast<uint64_t>(p.half) * cs;
  while (vec_n > 1 && cache_bits % (static_cast<uint64_t>(vec_n) * cs) != 0) vec_n /= 2;

  const int64_t rotated_bytes = p.num_tokens * (p.q.num_heads + p.k.num_heads) * 2 * p.half * static_cast<int64_t>(s);
  const bool l2_hint = rotated_bytes >= RopeConfig::kL2HintMinBytes;
  const bool pdl = rope_resolve_pdl(enable_pdl, device);
  if constexpr (kKvStore) {
    if (is_neox) {
      launch_rope_kv<T, true, Kv>(p, vec_n, l2_hint, device, pdl);
    } else {
      launch_rope_kv<T, false, Kv>(p, vec_n, l2_hint, device, pdl);
    }
  } else if (is_neox) {
    launch_rope<T, CacheT, true>(p, vec_n, l2_hint, rotated_bytes, device, pdl);
  } else {
    launch_rope<T, CacheT, false>(p, vec_n, l2_hint, rotated_bytes, device, pdl);
  }
}

/// RoPE of q and k in place with an fp32 cos/sin cache.
/// q: [num_tokens, num_q_heads, head_dim], k: [num_tokens, num_kv_heads, head_dim], T on one CUDA
/// device, last dim contiguous, token and head strides free and independent (heads must not
/// overlap; q and k disjoint, e.g. views of a fused qkv buffer); cos_sin_cache: [max_position,
/// width] fp32, rows contiguous; positions: [num_tokens] int32/int64. rope_dim: 0 (= width) or an
/// even R <= min(head_dim, width). enable_pdl: 1 / 0 / -1 (auto). T = fp16_t | bf16_t | fp32_t.
/// Throws PanicError (Python RuntimeError) naming the tensor before any launch.
template <typename T>
void apply_rope_inplace(
    tvm::ffi::TensorView q,
    tvm::ffi::TensorView k,
    tvm::ffi::TensorView cos_sin_cache,
    tvm::ffi::TensorView positions,
    bool is_neox,
    int64_t rope_dim,
    int64_t enable_pdl) {
  RopeParams p{};
  DLDevice device{};
  rope_bind<T, fp32_t>("apply_rope_inplace", q, k, cos_sin_cache, positions, rope_dim, p, device);
  rope_dispatch<T, fp32_t, false>(p, is_neox, device, enable_pdl);
}

/// vLLM's rotary_embedding on [num_tokens, num_heads, head_size] views: the cos/sin cache in T.
/// k may have 0 heads (no key). Same rules as apply_rope_inplace otherwise.
template <typename T>
void rotary_embedding(
    tvm::ffi::TensorView q,
    tvm::ffi::TensorView k,
    tvm::ffi::TensorView cos_sin_cache,
    tvm::ffi::TensorView positions,
    bool is_neox,
    int64_t enable_pdl) {
  RopeParams p{};
  DLDevice device{};
  rope_bind<T, T>("rotary_embedding", q, k, cos_sin_cache, positions, 0, p, device);
  rope_dispatch<T, T, false>(p, is_neox, device, enable_pdl);
}

/// Validates the tensors of apply_rope_inplace_with_kvcache (rope_bind's, v, the caches of KvT and
/// out_loc, and that the caches share no memory with anything else) and fills `p` but for the
/// dispatch. KvT: T (bit copies) or fp8_e4m3_t (rope_fp8_kvcache.cuh's quantizing store).
template <typename T, typename KvT>
void rope_bind_kv(
    const char* op,
    tvm::ffi::TensorView q,
    tvm::ffi::TensorView k,
    tvm::ffi::TensorView v,
    tvm::ffi::TensorView k_cache,
    tvm::ffi::TensorView v_cache,
    tvm::ffi::TensorView cos_sin_cache,
    tvm::ffi::TensorView positions,
    tvm::ffi::TensorView out_loc,
    int64_t rope_dim,
    RopeParams& p,
    DLDevice& device) {
  using namespace host;
  rope_bind<T, fp32_t>(op, q, k, cos_sin_cache, positions, rope_dim, p, device);

  SymbolicSize num_tokens{"num_tokens"};
  SymbolicSize num_kv_heads{"num_kv_heads"};
  SymbolicSize head_dim{"head_dim"};
  SymbolicSize cache_size{"cache_size"};
  SymbolicSize row{"num_kv_heads * head_dim"};
  num_tokens.set_value(p.num_tokens);
  num_kv_heads.set_value(p.k.num_heads);
  head_dim.set_value(p.head_dim);
  row.set_value(p.k.num_heads * p.head_dim);
  SymbolicDevice device_;
  device_.set_options<kDLCUDA>();
  device_.set_value(device);
  TensorMatcher({num_tokens, num_kv_heads, head_dim})  //
      .with_strides({kAnySize, kAnySize, kAnySize})
      .with_dtype<T>()
      .with_device<kDLCUDA>(device_)
      .verify(v, "v");
  TensorMatcher({cache_size, row})  //
      .with_strides({kAnySize, 1})
      .with_dtype<KvT>()
      .with_device<kDLCUDA>(device_)
      .verify(k_cache, "k_cache")
      .verify(v_cache, "v_cache");
  TensorMatcher({num_tokens})  //
      .with_dtype<int32_t, int64_t>()
      .with_device<kDLCUDA>(device_)
      .verify(out_loc, "out_loc");
  RuntimeCheck(
      v.size(2) <= 1 || v.stride(2) == 1, op, ": v must be contiguous in its last dimension, got stride ", v.stride(2));
  // The caches are written while q, k, v, the cos/sin cache and the indices are read.
  const std::pair<const tvm::ffi::TensorView*, const char*> read[] = {
      {&q, "q"},
      {&k, "k"},
      {&v, "v"},
      {&cos_sin_cache, "cos_sin_cache"},
      {&positions, "positions"},
      {&out_loc, "out_loc"}};
  for (const auto& [view, name] : read) {
    verify_no_partial_overlap(k_cache, "k_cache", *view, name, /*allow_same=*/false);
    verify_no_partial_overlap(v_cache, "v_cache", *view, name, /*allow_same=*/false);
  }
  verify_no_partial_overlap(k_cache, "k_cache", v_cache, "v_cache", /*allow_same=*/false);
  verify_no_self_overlap(k_cache, "k_cache");  // slot rows of their own
  verify_no_self_overlap(v_cache, "v_cache");
  verify_no_partial_overlap(v, "v", q, "q", /*allow_same=*/false);
  verify_no_partial_overlap(v, "v", k, "k", /*allow_same=*/false);

  p.v = data_ptr<const void>(v);
  p.v_token_stride = v.stride(0);
  p.v_head_stride = v.stride(1);
  p.k_cache = data_ptr(k_cache);
  p.v_cache = data_ptr(v_cache);
  p.k_cache_stride = k_cache.stride(0);
  p.v_cache_stride = v_cache.stride(0);
  p.out_loc = data_ptr<const void>(out_loc);
  p.out_loc_int64 = out_loc.dtype().bits == 64;
  p.cache_size = cache_size.unwrap();
}

/// apply_rope_inplace, then k (rotated) -> k_cache[out_loc[t]] and v -> v_cache[out_loc[t]], bit for bit.
/// v: [num_tokens, num_kv_heads, head_dim] (own strides, last dim contiguous); k_cache, v_cache:
/// [cache_size, num_kv_heads * head_dim] of T, row stride free, rows contiguous, disjoint from
/// every other tensor; out_loc: [num_tokens] int32/int64 (entries outside [0, cache_size) skip
/// that token's store). With nothing to store (no slots or no kv heads) it is apply_rope_inplace's
/// launch (this module compiles those kernels too).
template <typename T>
void apply_rope_inplace_with_kvcache(
    tvm::ffi::TensorView q,
    tvm::ffi::TensorView k,
    tvm::ffi::TensorView v,
    tvm::ffi::TensorView k_cache,
    tvm::ffi::TensorView v_cache,
    tvm::ffi::TensorView cos_sin_cache,
    tvm::ffi::TensorView positions,
    tvm::ffi::TensorView out_loc,
    bool is_neox,
    int64_t rope_dim,
    int64_t enable_pdl) {
  constexpr const char* kOp = "apply_rope_inplace_with_kvcache";
  RopeParams p{};
  DLDevice device{};
  rope_bind_kv<T, T>(kOp, q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc, rope_dim, p, device);
  if (p.cache_size == 0 || p.k.num_heads == 0) {
    p.k_cache = nullptr;  // nothing can be stored: a plain rotation
    rope_dispatch<T, fp32_t, false>(p, is_neox, device, enable_pdl);
    return;
  }
  rope_dispatch<T, fp32_t, true>(p, is_neox, device, enable_pdl);
}

}  // namespace
