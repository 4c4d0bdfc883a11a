// Gated activations: silu_and_mul, gelu_and_mul, gelu_tanh_and_mul.
//
//   H = input.shape[-1] / 2;  g = input[t, i], u = input[t, H + i]  (i < H)
//   out[t, i] = round(float(round(act(float(g)))) * float(u))
//
// The activation is computed in fp32 and rounded to T; that value is multiplied by u in fp32 and
// rounded again (torch's `act(x[..., :H]) * x[..., H:]` on T tensors). The fp32 arithmetic follows
// the formulas below operation by operation (each product and sum rounded, no FMA contraction:
// __fmul_rn / __fadd_rn), so the kernel and an fp32 torch reference written the same way differ
// only where the libm functions (expf, erff, tanhf) do:
//   silu       g / (1 + exp(-g))
//   gelu       (g * 0.5) * (1 + erf(g * 0.70710678))                        (exact, erf form)
//   gelu_tanh  (0.5 * g) * (1 + tanh(0.7978845608 * (g + 0.044715 * (g * g * g))))
//
// Work layout. A CTA is a 2-D block: threadIdx.x walks the vectors of a row (16 bytes when every
// pointer, row stride and H * sizeof(T) allow it, else 8 / 4 / 2 bytes down to one element, so no
// access is misaligned and no row needs a tail), threadIdx.y the rows. The grid is (column chunks
// of a row, row groups): one CTA per chunk, so a few long rows (decode: one token, 2 x 14336) still
// spread over tens of SMs instead of one CTA per row. Large launches give each thread two rows
// (half the row groups; both rows' loads issued before either is computed). gridDim.y is capped at
// 65535; CTAs then stride over row groups. Offsets are 64-bit throughout (any element count).
//
// Expert filter (MoE): with expert_ids, row t is computed only if expert_ids[t / expert_step] !=
// -1; a filtered row reads its id and nothing else, and its out row is not written.
//
// With PDL the kernel waits for the previous kernel before its first global access (the expert id
// or the rows) and releases the next kernel right after that wait: the next kernel's launch then
// overlaps this one, which only matters at decode sizes.
//
// Bytes moved: 3 * num_tokens * H * sizeof(T) (read 2H, write H per row); a filtered row moves
// only its 4-byte id.
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, SymbolicSize, SymbolicDevice, kAnySize, data_ptr, verify_no_*
#include <sgl_kernel/utils.h>   // For RuntimeCheck, div_ceil

#include <sgl_kernel/runtime.cuh>  // For runtime::get_sm_count, get_cc_major
#include <sgl_kernel/type.cuh>     // For dtype_trait, packed_t
#include <sgl_kernel/utils.cuh>    // For LaunchKernel, SGL_DEVICE, fp16_t, bf16_t, fp32_t, pdl_wait_primary
#include <sgl_kernel/vec.cuh>      // For AlignedVector

#include <algorithm>
#include <bit>
#include <cstdint>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/optional.h>
#include <type_traits>

namespace {

/// Which activation a gated_act_and_mul_kernel instantiation applies to the gate half.
enum class GatedActivation { kSilu, kGelu, kGeluTanh };

/// Kernel arguments of gated_act_and_mul_kernel.
struct GatedActParams {
  const void* input;          // [num_tokens, 2 * hidden_size], rows input_stride elements apart
  void* out;                  // [num_tokens, hidden_size], rows out_stride elements apart
  const int32_t* expert_ids;  // [>= ceil(num_tokens / expert_step)], or nullptr: every row computed
  int64_t num_tokens;         // rows
  int64_t hidden_size;        // H: elements of out per row (the gate and up halves of input)
  int64_t vecs_per_row;       // hidden_size / kVecN
  int64_t input_stride;       // elements between input rows
  int64_t out_stride;         // elements between out rows
  int64_t expert_step;        // rows per expert id (>= 1)
};

/// Launch facts of gated_act_and_mul_kernel.
struct GatedActConfig {
  static constexpr uint32_t kMaxThreads = 512;      // __launch_bounds__; the benchmark override's limit
  static constexpr uint32_t kDefaultThreads = 256;  // CTA size for large launches
  static constexpr uint32_t kMinThreads = 64;       // smallest CTA the heuristic picks
  static constexpr int64_t kMinCtasPerSm = 2;       // decode rule: narrower vectors until the launch has
                                                    // this many kMinThreads CTAs per SM
  static constexpr int64_t kMaxGridY = 65535;       // CUDA's limit on gridDim.y
  static constexpr int64_t kThreadsPerSm = 2048;    // resident threads per SM (SM80 / SM90)
  static constexpr int64_t kPairRowsMinWaves = 4;   // two rows per thread from this many full waves
  static constexpr int64_t kMinDecodeVecBytes = 4;  // narrowest vector the decode rule picks
};

/// act(g) in fp32, each operation rounded as written (see the file comment).
template <GatedActivation kAct>
SGL_DEVICE float activate(float g) {
  if constexpr (kAct == GatedActivation::kSilu) {
    return __fdiv_rn(g, __fadd_rn(1.0f, expf(-g)));
  } else if constexpr (kAct == GatedActivation::kGelu) {
    constexpr float kSqrtHalf = 0.70710678118654752f;  // 1 / sqrt(2)
    return __fmul_rn(__fmul_rn(g, 0.5f), __fadd_rn(1.0f, erff(__fmul_rn(g, kSqrtHalf))));
  } else {
    constexpr float kBeta = 0.7978845608f;  // sqrt(2 / pi)
    constexpr float kKappa = 0.044715f;
    const float cube = __fmul_rn(__fmul_rn(g, g), g);
    const float inner = __fmul_rn(kBeta, __fadd_rn(g, __fmul_rn(kKappa, cube)));
    return __fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, tanhf(inner)));
  }
}

/// silu(g) = g / (1 + exp(-g)) by the instruction sequence __fdiv_rn runs on its fast path (an
/// approximate reciprocal, one Newton step, the quotient and one remainder correction: the correctly
/// rounded quotient), without its per-element range check and branch: those made every element one
/// dependent chain behind a convergence barrier (and a call that clobbered registers), so a
/// thread's elements could not overlap. in_range is cleared when g lies outside [-64, 2^100] or |g| < 2^-24 (zeros,
/// tiny values, NaN, infinities): there 1 + exp(-g) may exceed 2^93 or the remainder may leave the
/// normal range, and the caller recomputes with __fdiv_rn. Inside, the denominator is in [1, 2^93)
/// and the quotient in [2^-88, 2^100], where the sequence is exact as written (the division test
/// checks every 16-bit gate against __fdiv_rn).
SGL_DEVICE float silu_fast_division(float g, bool& in_range) {
  const float d = __fadd_rn(1.0f, expf(-g));
  in_range &= (g >= -64.0f) & (g <= 0x1p100f) & (fabsf(g) >= 0x1p-24f);
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  r = __fmaf_rn(r, __fmaf_rn(-d, r, 1.0f), r);
  const float q = __fmaf_rn(g, r, 0.0f);
  return __fmaf_rn(r, __fmaf_rn(-d, q, g), q);
}

/// act(g[i]) in fp32 for the N gates of one vector, each bit-identical to activate<kAct>(g[i]). silu
/// takes silu_fast_division for all N and redoes the vector through activate only when one gate is
/// out of its range (one branch per vector, rare on real activations).
template <GatedActivation kAct, std::size_t N>
SGL_DEVICE void activate_vector(const float (&g)[N], float (&act)[N]) {
  if constexpr (kAct == GatedActivation::kSilu) {
    bool in_range = true;
#pragma unroll
    for (std::size_t i = 0; i < N; ++i) act[i] = silu_fast_division(g[i], in_range);
    if (!in_range) {
#pragma unroll
      for (std::size_t i = 0; i < N; ++i) act[i] = activate<kAct>(g[i]);
    }
  } else {
#pragma unroll
    for (std::size_t i = 0; i < N; ++i) act[i] = activate<kAct>(g[i]);
  }
}

/// out[i] = round(float(round(act(float(gate[i])))) * float(up[i])) for the N elements of one vector.
/// 16-bit types convert pairs (one packed conversion instruction per two elements).
template <GatedActivation kAct, typename T, std::size_t N>
SGL_DEVICE device::AlignedVector<T, N> act_and_mul(
    const device::AlignedVector<T, N>& gate, const device::AlignedVector<T, N>& up) {
  device::AlignedVector<T, N> out;
  float g[N], act[N];
  if constexpr (std::is_same_v<T, fp32_t>) {
#pragma unroll
    for (std::size_t i = 0; i < N; ++i) g[i] = gate[i];
    activate_vector<kAct>(g, act);
#pragma unroll
    for (std::size_t i = 0; i < N; ++i) out[i] = __fmul_rn(act[i], up[i]);
  } else if constexpr (N == 1) {
    g[0] = dtype_trait<fp32_t>::from(gate[0]);
    activate_vector<kAct>(g, act);
    const T rounded = dtype_trait<T>::from(act[0]);
    out[0] = dtype_trait<T>::from(__fmul_rn(dtype_trait<fp32_t>::from(rounded), dtype_trait<fp32_t>::from(up[0])));
  } else {
    using P = packed_t<T>;  // two elements
#pragma unroll
    for (std::size_t i = 0; i < N; i += 2) {
      const fp32x2_t pair = dtype_trait<fp32x2_t>::from(P{gate[i], gate[i + 1]});
      g[i] = pair.x;
      g[i + 1] = pair.y;
    }
    activate_vector<kAct>(g, act);
#pragma unroll
    for (std::size_t i = 0; i < N; i += 2) {
      const fp32x2_t u = dtype_trait<fp32x2_t>::from(P{up[i], up[i + 1]});
      const fp32x2_t a = dtype_trait<fp32x2_t>::from(dtype_trait<P>::from(fp32x2_t{act[i], act[i + 1]}));
      const P result = dtype_trait<P>::from(fp32x2_t{__fmul_rn(a.x, u.x), __fmul_rn(a.y, u.y)});
      out[i] = result.x;
      out[i + 1] = result.y;
    }
  }
  return out;
}

/// Whether row of the launch is computed: inside num_tokens and kept by the expert filter.
SGL_DEVICE bool gated_act_row_kept(const GatedActParams& params, int64_t row) {
  if (row >= params.num_tokens) return false;
  if (params.expert_ids == nullptr) return true;
  const int64_t id_index = params.expert_step == 1 ? row : row / params.expert_step;
  return params.expert_ids[id_index] != -1;
}

/// One thread: vector threadIdx.x of column chunk blockIdx.x, for the row pairs (row, row + rows per
/// grid column), row = threadIdx.y + blockIdx.y * blockDim.y + k * 2 * rows per grid column. Both
/// rows' loads are issued before either row is computed (64 bytes in flight per thread at 16-byte
/// vectors); a launch whose grid covers every row in its first rows leaves the second row of each
/// pair past num_tokens (one row per thread). Threads past the row's last vector idle.
template <typename T, int kVecN, GatedActivation kAct>
__global__ void __launch_bounds__(GatedActConfig::kMaxThreads) gated_act_and_mul_kernel(const GatedActParams params) {
  using vec_t = device::AlignedVector<T, kVecN>;
  const int64_t vec = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;  // vector index inside a row
  const int64_t row_step = int64_t{gridDim.y} * blockDim.y;
  device::pdl_wait_primary();  // before the first global access: the rows and ids may be the previous kernel's
  device::pdl_launch_dependents();
  if (vec >= params.vecs_per_row) return;
  const auto* input = static_cast<const T*>(params.input);
  auto* out = static_cast<T*>(params.out);
  for (int64_t row = int64_t{blockIdx.y} * blockDim.y + threadIdx.y; row < params.num_tokens; row += 2 * row_step) {
    const int64_t next = row + row_step;
    const bool keep = gated_act_row_kept(params, row);
    const bool keep_next = gated_act_row_kept(params, next);
    vec_t gate, up, next_gate, next_up;
    if (keep) {
      gate.load(input + row * params.input_stride, vec);
      up.load(input + row * params.input_stride + params.hidden_size, vec);
    }
    if (keep_next) {
      next_gate.load(input + next * params.input_stride, vec);
      next_up.load(input + next * params.input_stride + params.hidden_size, vec);
    }
    if (keep) act_and_mul<kAct>(gate, up).store(out + row * params.out_stride, vec);
    if (keep_next) act_and_mul<kAct>(next_gate, next_up).store(out + next * params.out_stride, vec);
  }
}

/// Benchmark hook state (_set_launch_override): threads per CTA and the widest vector in bytes
/// forced on every launch; 0 leaves each to the heuristics.
struct GatedActOverride {
  int64_t threads = 0;
  int64_t vec_bytes = 0;
};
inline GatedActOverride& gated_act_override() {
  static GatedActOverride forced;
  return forced;
}

/// CTA shape and grid of one launch.
struct GatedActGeometry {
  dim3 block;
  dim3 grid;
};

/// threads threads per CTA, as few row lanes as the row needs (a power of two >= its vectors, at
/// most threads) times the rest in rows; rows_per_thread (1 or 2) rows of each thread in the grid's
/// first pass (the kernel's row pairs).
inline GatedActGeometry gated_act_geometry(
    int64_t num_tokens, int64_t vecs_per_row, uint32_t threads, int64_t rows_per_thread = 1) {
  const auto row_lanes =
      static_cast<uint32_t>(std::min<uint64_t>(threads, std::bit_ceil(static_cast<uint64_t>(vecs_per_row))));
  const uint32_t rows_per_cta = threads / row_lanes;
  const int64_t chunks = host::div_ceil(vecs_per_row, int64_t{row_lanes});
  const int64_t row_groups = host::div_ceil(num_tokens, int64_t{rows_per_cta} * rows_per_thread);
  return {
      dim3(row_lanes, rows_per_cta),
      dim3(static_cast<uint32_t>(chunks), static_cast<uint32_t>(std::min(row_groups, GatedActConfig::kMaxGridY)))};
}

template <typename T, int kVecN, GatedActivation kAct>
void launch_gated_act(GatedActParams params, DLDevice device, bool pdl) {
  using namespace host;
  using Config = GatedActConfig;
  params.vecs_per_row = params.hidden_size / kVecN;
  // gridDim.x holds a row's chunks: at most 2^31 - 1 (32-thread chunks: hidden_size < 2^36 elements).
  RuntimeCheck(
      div_ceil(params.vecs_per_row, int64_t{32}) < (int64_t{1} << 31),
      "input: hidden_size must be < 2^36 elements, got ",
      params.hidden_size);
  const int64_t num_sms = runtime::get_sm_count(device.device_id);
  uint32_t threads = static_cast<uint32_t>(gated_act_override().threads);
  if (threads == 0) {
    // The CTA size (kDefaultThreads down to kMinThreads) that puts the fewest threads on the busiest
    // SM, CTAs dealt out evenly: ceil(ctas / SMs) * threads; a smaller CTA must win by more than
    // 1/16. Decode sizes get small CTAs on many SMs ([1, 2 x 14336]: 64 threads), 64 rows 128
    // (7 CTAs per SM rather than 3 or 4 of 256), large launches 256.
    int64_t best_load = 0;
    for (uint32_t t = Config::kDefaultThreads; t >= Config::kMinThreads; t /= 2) {
      const GatedActGeometry g = gated_act_geometry(params.num_tokens, params.vecs_per_row, t);
      const int64_t load = div_ceil(int64_t{g.grid.x} * g.grid.y, num_sms) * t;
      if (threads == 0 || load * 16 < best_load * 15) {
        threads = t;
        best_load = load;
      }
    }
  }
  // Two rows per thread (half the row groups) once the one-row grid is kPairRowsMinWaves waves of
  // full SMs or more: each thread then has both rows' loads in flight before it computes, and half
  // as many CTAs start and drain. Smaller launches keep one row per thread: with a wave or two, the
  // finer grid balances the SMs better and the rows in flight are the same.
  const GatedActGeometry one_row = gated_act_geometry(params.num_tokens, params.vecs_per_row, threads);
  const int64_t full_wave = num_sms * (Config::kThreadsPerSm / threads);
  const bool pair_rows = int64_t{one_row.grid.x} * one_row.grid.y >= Config::kPairRowsMinWaves * full_wave;
  const GatedActGeometry geometry =
      pair_rows ? gated_act_geometry(params.num_tokens, params.vecs_per_row, threads, 2) : one_row;
  LaunchKernel(geometry.grid, geometry.block, device).enable_pdl(pdl)(gated_act_and_mul_kernel<T, kVecN, kAct>, params);
}

/// Widest vector (bytes, 16 at most, sizeof(T) at least) that divides every value (addresses, byte
/// strides, byte widths).
template <typename T>
int64_t gated_act_vector_bytes(std::initializer_list<uint64_t> values) {
  uint64_t any = 16;
  for (const uint64_t v : values) any |= v;
  const auto bytes = static_cast<int64_t>(any & (~any + 1));  // lowest set bit, at most 16
  return std::max<int64_t>(bytes, sizeof(T));
}

/// Last dim of a [rows, width] view contiguous (stride 1; any stride when width <= 1).
inline void check_gated_act_last_dim(const tvm::ffi::TensorView& view, const char* name) {
  host::RuntimeCheck(
      view.size(1) <= 1 || view.stride(1) == 1,
      name,
      ": last dim must be contiguous (stride 1), got stride ",
      view.stride(1));
}

/// out[t, i] = round(round(act(input[t, i])) * input[t, H + i]) for rows t kept by the expert filter.
///
/// out: [num_tokens, hidden_size], input: [num_tokens, 2 * hidden_size], T on one CUDA device, last
/// dims contiguous, row strides free (out rows must not overlap each other nor input);
/// expert_ids: optional int32 [>= ceil(num_tokens / expert_step)], contiguous, same device;
/// expert_step >= 1; enable_pdl 1 / 0 / -1 (auto: on for SM90+). Empty inputs return without a
/// launch. T = fp16_t | bf16_t | fp32_t. Throws PanicError (Python RuntimeError) naming the tensor.
template <typename T, GatedActivation kAct>
void gated_act_and_mul(
    tvm::ffi::TensorView out,
    tvm::ffi::TensorView input,
    tvm::ffi::Optional<tvm::ffi::TensorView> expert_ids,
    int64_t expert_step,
    int64_t enable_pdl) {
  using namespace host;

  // Validate
  SymbolicSize num_tokens{"num_tokens"};
  SymbolicSize input_width{"2 * hidden_size"};
  SymbolicSize hidden_size{"hidden_size"};
  SymbolicDevice device_;
  device_.set_options<kDLCUDA>();
  TensorMatcher({num_tokens, input_width})  //
      .with_strides({kAnySize, kAnySize})
      .with_dtype<T>()
      .with_device<kDLCUDA>(device_)
      .verify(input, "input");
  RuntimeCheck(
      input_width.unwrap() % 2 == 0, "input: last dim (2 * hidden_size) must be even, got ", input_width.unwrap());
  hidden_size.set_value(input_width.unwrap() / 2);
  TensorMatcher({num_tokens, hidden_size})  //
      .with_strides({kAnySize, kAnySize})
      .with_dtype<T>()
      .with_device<kDLCUDA>(device_)
      .verify(out, "out");
  check_gated_act_last_dim(input, "input");
  check_gated_act_last_dim(out, "out");
  verify_no_self_overlap(out, "out");
  verify_no_partial_overlap(out, "out", input, "input", /*allow_same=*/false);
  RuntimeCheck(expert_step >= 1, "expert_step must be >= 1, got ", expert_step);
  const int32_t* ids = nullptr;
  if (expert_ids.has_value()) {
    const tvm::ffi::TensorView ids_view = *expert_ids;
    SymbolicSize num_ids{"num_expert_ids"};
    TensorMatcher({num_ids})  //
        .with_dtype<int32_t>()
        .with_device<kDLCUDA>(device_)
        .verify(ids_view, "expert_ids");
    const int64_t needed = div_ceil(num_tokens.unwrap(), expert_step);
    RuntimeCheck(
        num_ids.unwrap() >= needed,
        "expert_ids: expected at least ceil(num_tokens / expert_step) = ",
        needed,
        " entries, got ",
        num_ids.unwrap());
    verify_no_partial_overlap(out, "out", ids_view, "expert_ids", /*allow_same=*/false);
    ids = data_ptr<const int32_t>(ids_view);
  }

  // Unwrap
  const GatedActParams params{
      .input = data_ptr<const void>(input),
      .out = data_ptr(out),
      .expert_ids = ids,
      .num_tokens = num_tokens.unwrap(),
      .hidden_size = hidden_size.unwrap(),
      .vecs_per_row = 0,  // set with the vector width
      .input_stride = input.stride(0),
      .out_stride = out.stride(0),
      .expert_step = expert_step,
  };
  const DLDevice device = device_.unwrap();
  if (params.num_tokens == 0 || params.hidden_size == 0) return;

  // Configure: the widest vector that every row start of input (both halves) and out allows
  const bool many_rows = params.num_tokens > 1;
  int64_t vec_bytes = gated_act_vector_bytes<T>({
      reinterpret_cast<uint64_t>(params.input),
      reinterpret_cast<uint64_t>(params.out),
      static_cast<uint64_t>(params.hidden_size) * sizeof(T),
      many_rows ? static_cast<uint64_t>(params.input_stride) * sizeof(T) : 0,
      many_rows ? static_cast<uint64_t>(params.out_stride) * sizeof(T) : 0,
  });
  // Decode sizes: narrower vectors (down to kMinDecodeVecBytes) while the whole launch would have
  // fewer threads than kMinCtasPerSm CTAs of kMinThreads on every SM. A thread's activations are one
  // dependent chain each (expf / erff / tanhf and a division), so fewer elements per thread on more
  // SMs finish sooner; large launches keep 16 bytes (fewest instructions per byte).
  const int64_t forced_bytes = gated_act_override().vec_bytes;
  if (forced_bytes > 0) {
    vec_bytes = std::min(vec_bytes, forced_bytes);
  } else {
    const int64_t wanted_threads =
        GatedActConfig::kMinCtasPerSm * GatedActConfig::kMinThreads * runtime::get_sm_count(device.device_id);
    const int64_t row_bytes = params.hidden_size * static_cast<int64_t>(sizeof(T));
    while (vec_bytes > std::max<int64_t>(GatedActConfig::kMinDecodeVecBytes, sizeof(T)) &&
           params.num_tokens * (row_bytes / vec_bytes) < wanted_threads) {
      vec_bytes /= 2;
    }
  }
  const bool pdl = enable_pdl >= 0 ? enable_pdl != 0 : runtime::get_cc_major(device.device_id) >= 9;

  // Launch
  constexpr int64_t kElemBytes = sizeof(T);
  switch (vec_bytes) {
    case 16:
      return launch_gated_act<T, std::max<int64_t>(16 / kElemBytes, 1), kAct>(params, device, pdl);
    case 8:
      return launch_gated_act<T, std::max<int64_t>(8 / kElemBytes, 1), kAct>(params, device, pdl);
    case 4:
      return launch_gated_act<T, std::max<int64_t>(4 / kElemBytes, 1), kAct>(params, device, pdl);
    default:
      return launch_gated_act<T, 1, kAct>(params, device, pdl);
  }
}

/// Benchmark hook (bench_activation.py --sweep): forces, on every later launch of this module, the
/// threads per CTA (a power of two in [32, 512]) and the widest vector in bytes (2, 4, 8 or 16; a
/// launch still narrows it to what its pointers allow); 0 leaves either to the heuristics.
inline void set_gated_act_launch_override(int64_t threads, int64_t vec_bytes) {
  host::RuntimeCheck(
      threads == 0 || (threads >= 32 && threads <= GatedActConfig::kMaxThreads &&
                       std::has_single_bit(static_cast<uint64_t>(threads))),
      "_set_launch_override: threads must be 0 or a power of two in [32, 512], got ",
      threads);
  host::RuntimeCheck(
      vec_bytes == 0 || vec_bytes == 2 || vec_bytes == 4 || vec_bytes == 8 || vec_bytes == 16,
      "_set_launch_override: vec_bytes must be 0, 2, 4, 8 or 16, got ",
      vec_bytes);
  gated_act_override() = GatedActOverride{threads, vec_bytes};
}

}  // namespace
