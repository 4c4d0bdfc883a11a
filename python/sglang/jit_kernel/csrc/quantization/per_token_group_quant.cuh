// per_token_group_quant with fuse_silu_and_mul: a gated activation and the per-token-group 8-bit
// quantization of its result in one pass (the activation output never goes to memory).
//
//   H = input.shape[-1] / 2;  g = input[.., i], u = input[.., H + i]  (i < H)
//   legacy:  h[i] = round_T(float(round_T(act(g))) * u)     (silu_and_mul's value, activation.cuh)
//   dense:   h[i] = round_T(act(g) * u)                     (act in fp32, one rounding to T)
//   then per group of group_size consecutive h (quantize_8bit.cuh, fp32, IEEE):
//   s = clamp(max(max|h|, eps) / q_type_max, FLT_MIN, FLT_MAX)   (ue8m0: 2^ceil(log2 s))
//   q = round(clamp(h * (1 / s), q_min, q_max))
//
// round_T rounds to the input type T (nearest even); fp32 inputs have no rounding, so legacy and
// dense coincide there. Both modes take act from activation.cuh's device functions:
//   - legacy computes exactly what silu_and_mul / gelu_and_mul / gelu_tanh_and_mul write, so the
//     result is bit-identical to that op followed by per_token_group_quant_8bit. Those ops take the
//     branch-free activations (activate_silu_branch_free, activate_logistic) on 16-bit 16-byte
//     vectors and the formulas (activate_vector) otherwise, by a rule of size and alignment
//     (gated_act_launch_vector_bytes): the launcher evaluates that rule for the unfused call (its
//     intermediate a fresh contiguous [num_rows, H] tensor) and picks the same math
//     (ActQuantMath::kLegacyBranchFree or kLegacy), whatever vectors this kernel itself uses.
//   - dense always takes the formulas (activate_vector: fp32 operations as written, libm's expf /
//     erff / tanhf), so an fp32 torch reference written the same way gives the same bits.
// The quantization is per_token_group_quant_8bit's arithmetic with the bounds of the output type
// (fp8: +-448, which the satfinite conversion implies, so no clamp instruction; int8: -128 / 127).
//
// Layout: input [num_experts, rows_per_expert, 2 * H] (a 2-D input is one expert), output_q
// [num_experts, rows_per_expert, H], output_s [num_experts, rows_per_expert, num_groups] (or
// ceil(num_groups / 4) int32 words of exponent bytes with ue8m0), all strides free but the
// contiguous last dims of input and output_q. With masked_m (int32 [num_experts]) only rows
// t < masked_m[e] (clamped to [0, rows_per_expert]) of expert e are read or written.
//
// Work layout: a warp takes a tile of 32 * lane_items chunks (kVecN elements of h, read as kVecN
// gate and kVecN up elements) of one row, lane_items 1 or 2 (at most kItems); step c of lane l is
// chunk c * 32 + l of the tile, so each step loads 512 contiguous bytes of gate and of up per warp.
// A group (group_size / kVecN chunks, at most kTileChunks) is lanes_per_group consecutive lanes of
// one step, or both steps of every lane (lane_items 2); its maximum is a butterfly over those lanes.
// Lanes l and l ^ 1 share one group in each step (a group is at least two chunks), so each finds the
// scale of one step (l % 2) and takes the other step's inverse scale from its neighbour.
// The launcher takes one step per lane when a group fits in one step and the one-step tiles number
// at most kOneStepWarpsPerSm per SM (decode and small batches: twice the warps, each with half the serial
// work), two otherwise. The grid is (tiles of a row / warps per CTA, row blocks, experts):
// gridDim.y covers launch_rows rows per expert (expected_m when given, so a masked launch sized for
// the expected count starts no CTA for rows it never computes; CTAs loop over the rest), gridDim.z
// the experts (looped past 65535). Offsets are 64-bit across rows and experts, 32-bit within a row.
// PDL: the kernel waits for the previous kernel before its first global access.
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, SymbolicSize, SymbolicDevice, kAnySize, data_ptr, verify_no_*
#include <sgl_kernel/utils.h>   // For RuntimeCheck, div_ceil

#include <sgl_kernel/runtime.cuh>  // For runtime::get_sm_count
#include <sgl_kernel/utils.cuh>    // For LaunchKernel, SGL_DEVICE, kWarpThreads, fp8_e4m3_t, pdl_wait_primary

#include <algorithm>
#include <bit>
#include <cstdint>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/optional.h>
#include <type_traits>

#include "../elementwise/activation.cuh"  // For GatedActivation, act_and_mul, activate_vector, gated_act_launch_vector_bytes
#include "per_token_group_quant_8bit.cuh"  // For GroupQuantParams, tile_grid, check_group_quant_sizes
#include "quantize_8bit.cuh"  // For quant::Chunk, block_scale, quantize_values, values_absmax, store_row_group_scale

namespace {

/// How h is computed from the gate and up values (see the file comment).
enum class ActQuantMath {
  kLegacyBranchFree,  // round(round(act) * u), act by the branch-free approximations (16-bit T only)
  kLegacy,            // round(round(act) * u), act by the formulas
  kDense,             // round(act * u), act by the formulas
};

/// Kernel arguments of act_and_mul_group_quant_kernel. `quant` holds one expert's view: input,
/// output_q, output_s and their row strides, the group facts, eps and the bounds; num_tokens is
/// rows_per_expert. Strides in elements of their own tensor.
struct ActQuantParams {
  GroupQuantParams quant;
  const int32_t* masked_m;      // [num_experts] valid rows per expert, or nullptr: every row
  int64_t num_experts;          // E
  int64_t hidden_size;          // H: elements of h per row; the up half starts H after the gate
  int64_t input_expert_stride;  // elements of T between experts
  int64_t q_expert_stride;      // elements of TOut
  int64_t s_expert_stride;      // elements of output_s (fp32, or int32 words with ue8m0)
  int32_t lane_items;           // steps of a lane's tile, 1 or 2 (the launcher's rule, file comment)
};

/// Launch facts.
struct ActQuantConfig {
  static constexpr int kItems = 2;                            // steps (chunks of gate and of up) per lane, at most
  static constexpr int64_t kOneStepWarpsPerSm = 32;           // one step per lane up to this many tiles per SM
  static constexpr int64_t kTileChunks = 32 * kItems;         // group_size <= kTileChunks * kVecN
  static constexpr uint32_t kMaxThreads = 256;                // tile_grid's largest CTA
  static constexpr int64_t kMaxGridZ = 65535;                 // CUDA's limit on gridDim.z
  static constexpr int64_t kMaxRowChunks = int64_t{1} << 30;  // 32-bit chunk offsets within a row
};

/// h for the kVecN elements of one chunk, in fp32 (values of T), by kMath.
template <GatedActivation kAct, ActQuantMath kMath, typename T, int kN, bool kAligned>
SGL_DEVICE void act_and_mul_values(
    const device::quant::Chunk<T, kN, kAligned>& gate,
    const device::quant::Chunk<T, kN, kAligned>& up,
    float (&h)[kN]) {
  using device::quant::Chunk;
  if constexpr (kMath == ActQuantMath::kDense && !std::is_same_v<T, fp32_t>) {
    float g[kN], act[kN], u[kN];
    device::quant::chunk_to_float(gate, g);
    device::quant::chunk_to_float(up, u);
    activate_vector<kAct>(g, act);
#pragma unroll
    for (int i = 0; i < kN; ++i) h[i] = dtype_trait<fp32_t>::from(dtype_trait<T>::from(__fmul_rn(act[i], u[i])));
  } else {
    // act_and_mul's own code: the same instructions as the unfused op for this math.
    constexpr bool kBranchFree = kMath == ActQuantMath::kLegacyBranchFree;
    static_assert(!kBranchFree || kN * sizeof(T) == 16, "the branch-free activations take 16-byte vectors");
    const Chunk<T, kN, true> out{act_and_mul<kAct, T, kN, kBranchFree>(gate.vec, up.vec)};
    device::quant::chunk_to_float(out, h);
  }
}

/// One warp: tile (blockIdx.x * warps + warp) of rows blockIdx.y * blockDim.y + threadIdx.y + k *
/// gridDim.y * blockDim.y of experts blockIdx.z + j * gridDim.z (see the file comment).
template <typename T, typename TOut, GatedActivation kAct, ActQuantMath kMath, bool kAligned>
__global__ void __launch_bounds__(ActQuantConfig::kMaxThreads) act_and_mul_group_quant_kernel(const ActQuantParams p) {
  using namespace device::quant;
  constexpr int kVecN = 16 / sizeof(T);
  constexpr int kItems = ActQuantConfig::kItems;
  constexpr bool kClamp = std::is_same_v<TOut, int8_t>;  // fp8: the satfinite conversion is the clamp
  using chunk_t = Chunk<T, kVecN, kAligned>;

  const GroupQuantParams& q = p.quant;
  const int32_t lane = threadIdx.x % device::kWarpThreads;
  const int32_t tile = blockIdx.x * (blockDim.x / device::kWarpThreads) + threadIdx.x / device::kWarpThreads;
  if (tile >= static_cast<int32_t>(q.tiles_per_row)) return;  // whole warps: no shuffle partner lost
  const int32_t tile_chunks = p.lane_items * device::kWarpThreads;
  // Chunks of this tile are below tile_end (the row's end, or the tile's for one step per lane).
  const int32_t tile_end = min(static_cast<int32_t>(q.row_chunks), (tile + 1) * tile_chunks);
  const int32_t first = tile * tile_chunks + lane;
  const int32_t group_chunks = 1 << q.log2_group_chunks;
  const int32_t lanes_per_group = min(group_chunks, device::kWarpThreads);
  const float type_max = kTypeMax<TOut>;
  const int64_t row_step = int64_t{gridDim.y} * blockDim.y;
  device::pdl_wait_primary();  // the input (and masked_m) may be the previous kernel's output
  device::pdl_launch_dependents();

  for (int64_t e = blockIdx.z; e < p.num_experts; e += gridDim.z) {
    int64_t rows = q.num_tokens;
    if (p.masked_m != nullptr) rows = min(max(int64_t{p.masked_m[e]}, int64_t{0}), rows);
    for (int64_t row = int64_t{blockIdx.y} * blockDim.y + threadIdx.y; row < rows; row += row_step) {
      const T* gate_row = static_cast<const T*>(q.input) + e * p.input_expert_stride + row * q.input_row_stride;
      const T* up_row = gate_row + p.hidden_size;
      TOut* dst = static_cast<TOut*>(q.output_q) + e * p.q_expert_stride + row * q.q_row_stride;
      chunk_t gate[kItems], up[kItems];
#pragma unroll
      for (int c = 0; c < kItems; ++c) {
        const int32_t index = first + c * device::kWarpThreads;
        if (index < tile_end) {
          gate[c].load(gate_row, index);
          up[c].load(up_row, index);
        }
      }
      float h[kItems][kVecN], amax[kItems];
#pragma unroll
      for (int c = 0; c < kItems; ++c) {
        amax[c] = 0.0f;
        if (first + c * device::kWarpThreads < tile_end) {
          act_and_mul_values<kAct, kMath>(gate[c], up[c], h[c]);
          amax[c] = values_absmax(h[c], 0.0f);
        }
      }
      // A group of 2 * 32 chunks is both steps of every lane.
      if (group_chunks > device::kWarpThreads) amax[0] = amax[1] = fmaxf(amax[0], amax[1]);
#pragma unroll
      for (int mask = device::kWarpThreads / 2; mask > 0; mask /= 2) {
        if (mask < lanes_per_group) {  // uniform: the same group size for every lane
#pragma unroll
          for (int c = 0; c < kItems; ++c) amax[c] = fmaxf(amax[c], __shfl_xor_sync(0xffffffffu, amax[c], mask));
        }
      }
      // Every lane of a group (at least two lanes: group_size >= 16) holds the maxima of its kItems
      // steps: lane l finds the scale of step own = l % kItems only and takes the other steps'
      // inverse scales from its kItems-aligned neighbours (one division chain per lane; with one
      // step per lane the odd lanes' step-1 scale is computed and unused). Lane base + c stores step
      // c's scale when the chunk of step c at lane base is below tile_end and starts a group.
      static_assert(kItems == 2, "the shared scale below pairs lanes l and l ^ 1");
      const int own = lane & 1;
      const float scale = block_scale(own ? amax[1] : amax[0], q.eps, type_max, q.scale_ue8m0);
      const float inv = __fdiv_rn(1.0f, scale);
      float inv_scale[kItems];
#pragma unroll
      for (int c = 0; c < kItems; ++c) inv_scale[c] = __shfl_sync(0xffffffffu, inv, (lane & ~1) | c);
      const int32_t own_index = first - own + own * device::kWarpThreads;  // step own's chunk at lane base
      if (own_index < tile_end && (own_index & (group_chunks - 1)) == 0) {
        void* const row_scales = static_cast<char*>(q.output_s) + (e * p.s_expert_stride + row * q.s_row_stride) * 4;
        store_row_group_scale(
            row_scales, own_index >> q.log2_group_chunks, scale, q.s_group_stride, q.num_groups, q.scale_ue8m0);
      }
#pragma unroll
      for (int c = 0; c < kItems; ++c) {
        const int32_t index = first + c * device::kWarpThreads;
        if (index < tile_end)
          quantize_values<TOut, kClamp, kVecN, kAligned>(h[c], inv_scale[c], q.q_min, q.q_max).store(dst, index);
      }
    }
  }
}

/// The kernel of one math and alignment over the grid of the file comment: tiles of one or two steps
/// per lane (lane_items), in CTAs of tile_grid (all of a row's tiles when there are at most 8, else 4
/// warps of a row; or several short rows), except launches of at most one tile per SM: one warp per
/// CTA then, so every tile gets its own SM ([1, 2 x 14336] bf16: 56 CTAs of one warp instead of
/// tile_grid's 14 CTAs of 4 warps).
template <typename T, typename TOut, GatedActivation kAct, ActQuantMath kMath>
void launch_act_and_mul_group_quant(const ActQuantParams& params, int64_t launch_rows, bool aligned, DLDevice device) {
  ActQuantParams p = params;
  GroupQuantParams sizing = p.quant;
  sizing.num_tokens = launch_rows;
  const int64_t experts = std::min(p.num_experts, ActQuantConfig::kMaxGridZ);
  const int64_t sms = host::runtime::get_sm_count(device.device_id);
  const int64_t one_step_tiles = host::div_ceil(p.quant.row_chunks, int64_t{device::kWarpThreads});
  const bool one_step = (int64_t{1} << p.quant.log2_group_chunks) <= device::kWarpThreads &&
                        one_step_tiles * launch_rows * experts <= ActQuantConfig::kOneStepWarpsPerSm * sms;
  p.lane_items = one_step ? 1 : ActQuantConfig::kItems;
  TileGrid g = tile_grid(sizing, int64_t{p.lane_items} * device::kWarpThreads);  // sets tiles_per_row
  p.quant.tiles_per_row = sizing.tiles_per_row;
  const int64_t tiles = sizing.tiles_per_row * launch_rows * experts;
  if (tiles <= sms) {
    g.block = dim3(device::kWarpThreads, 1);
    g.grid = dim3(static_cast<uint32_t>(sizing.tiles_per_row), static_cast<uint32_t>(launch_rows));
  }
  const dim3 grid(g.grid.x, g.grid.y, static_cast<uint32_t>(experts));
  const auto kernel = aligned ? act_and_mul_group_quant_kernel<T, TOut, kAct, kMath, true>
                              : act_and_mul_group_quant_kernel<T, TOut, kAct, kMath, false>;
  host::LaunchKernel(grid, g.block, device).enable_pdl(true)(kernel, p);
}

/// Quantizes h = act(gate) * up of input [num_experts, rows_per_expert, 2 * hidden_size] per group
/// of group_size values of a row: output_q [num_experts, rows_per_expert, hidden_size] of TOut
/// (fp8_e4m3_t | int8_t; bounds +-448 / -128..127), output_s fp32 [num_experts, rows_per_expert,
/// num_groups] or, with scale_ue8m0, int32 [.., ceil(num_groups / 4)] (exponent bytes, group g at byte
/// g % 4, the bytes past the last group 0).
///
/// T = fp16_t | bf16_t | fp32_t. Last dims of input and output_q contiguous, every other stride free;
/// output_s any strides that give each element its own address. masked_m: optional int32
/// [num_experts], contiguous: rows t >= masked_m[e] (clamped to [0, rows_per_expert]) of expert e are
/// neither read nor written. group_size: a power of two in [16, kTileChunks * 16 / sizeof(T)]
/// dividing hidden_size. dense: 0 legacy, 1 dense (see the file comment). launch_rows: rows per
/// expert the grid covers, in [1, rows_per_expert] (the others are looped over); 0 means
/// rows_per_expert. Every tensor on one CUDA device; outputs disjoint from each other and the inputs.
/// Empty inputs return without a launch. Throws PanicError (Python RuntimeError) naming the tensor.
template <typename T, typename TOut, GatedActivation kAct>
void per_token_group_quant(
    tvm::ffi::TensorView input,
    tvm::ffi::TensorView output_q,
    tvm::ffi::TensorView output_s,
    tvm::ffi::Optional<tvm::ffi::TensorView> masked_m,
    int64_t group_size,
    double eps,
    bool scale_ue8m0,
    bool dense,
    int64_t launch_rows) {
  using namespace host;
  static_assert(
      std::is_same_v<TOut, fp8_e4m3_t> || std::is_same_v<TOut, int8_t>,
      "per_token_group_quant: TOut must be fp8_e4m3_t or int8_t");
  constexpr bool kInt8 = std::is_same_v<TOut, int8_t>;
  constexpr int64_t kVecN = 16 / sizeof(T);
  constexpr int64_t kMaxGroupSize = ActQuantConfig::kTileChunks * kVecN;

  // Validate
  SymbolicSize num_experts{"num_experts"};
  SymbolicSize rows_per_expert{"rows_per_expert"};
  SymbolicSize input_width{"2 * hidden_size"};
  SymbolicSize hidden_size{"hidden_size"};
  SymbolicSize scale_cols{"scale_cols"};
  SymbolicDevice device_;
  device_.set_options<kDLCUDA>();
  TensorMatcher({num_experts, rows_per_expert, input_width})  //
      .with_strides({kAnySize, kAnySize, 1})
      .with_dtype<T>()
      .with_device<kDLCUDA>(device_)
      .verify(input, "input");
  RuntimeCheck(
      input_width.unwrap() % 2 == 0,
      "per_token_group_quant: input last dim (2 * hidden_size) must be even, got ",
      input_width.unwrap());
  hidden_size.set_value(input_width.unwrap() / 2);
  TensorMatcher({num_experts, rows_per_expert, hidden_size})  //
      .with_strides({kAnySize, kAnySize, 1})
      .with_dtype<TOut>()
      .with_device<kDLCUDA>(device_)
      .verify(output_q, "output_q");
  const int64_t num_groups = check_group_quant_sizes(
      "per_token_group_quant", group_size, kMaxGroupSize, kInt8, scale_ue8m0, hidden_size.unwrap());
  scale_cols.set_value(scale_ue8m0 ? div_ceil(num_groups, int64_t{4}) : num_groups);
  auto scale_matcher =
      TensorMatcher({num_experts, rows_per_expert, scale_cols}).with_strides({kAnySize, kAnySize, kAnySize});
  if (scale_ue8m0) {
    scale_matcher.with_dtype<int32_t>().with_device<kDLCUDA>(device_).verify(output_s, "output_s");
  } else {
    scale_matcher.with_dtype<float>().with_device<kDLCUDA>(device_).verify(output_s, "output_s");
  }
  verify_group_quant_outputs_disjoint(input, output_q, output_s);
  const int32_t* masked = nullptr;
  if (masked_m.has_value()) {
    const tvm::ffi::TensorView view = *masked_m;
    TensorMatcher({num_experts})  //
        .with_dtype<int32_t>()
        .with_device<kDLCUDA>(device_)
        .verify(view, "masked_m");
    verify_no_partial_overlap(output_q, "output_q", view, "masked_m", /*allow_same=*/false);
    verify_no_partial_overlap(output_s, "output_s", view, "masked_m", /*allow_same=*/false);
    masked = data_ptr<const int32_t>(view);
  }
  RuntimeCheck(
      launch_rows >= 0 && launch_rows <= rows_per_expert.unwrap(),
      "per_token_group_quant: launch_rows must be in [0, rows_per_expert = ",
      rows_per_expert.unwrap(),
      "], got ",
      launch_rows);
  RuntimeCheck(
      hidden_size.unwrap() / kVecN < ActQuantConfig::kMaxRowChunks,
      "per_token_group_quant: hidden_size must be < 2^30 chunks of 16 bytes, got ",
      hidden_size.unwrap());

  // Unwrap
  const int64_t row_chunks = hidden_size.unwrap() / kVecN;
  const ActQuantParams params{
      .quant =
          {
              .input = data_ptr<const void>(input),
              .output_q = data_ptr(output_q),
              .output_s = data_ptr(output_s),
              .num_tokens = rows_per_expert.unwrap(),
              .num_groups = num_groups,
              .row_chunks = row_chunks,
              .tiles_per_row = 0,  // set with the grid
              .input_row_stride = input.stride(1),
              .q_row_stride = output_q.stride(1),
              .s_row_stride = output_s.stride(1),
              .s_group_stride = output_s.stride(2),
              .log2_group_chunks = static_cast<int32_t>(std::countr_zero(static_cast<uint64_t>(group_size / kVecN))),
              .eps = static_cast<float>(eps),
              .q_min = kInt8 ? -128.0f : -device::quant::kTypeMax<fp8_e4m3_t>,
              .q_max = device::quant::kTypeMax<TOut>,
              .scale_ue8m0 = scale_ue8m0,
          },
      .masked_m = masked,
      .num_experts = num_experts.unwrap(),
      .hidden_size = hidden_size.unwrap(),
      .input_expert_stride = input.stride(0),
      .q_expert_stride = output_q.stride(0),
      .s_expert_stride = output_s.stride(0),
      .lane_items = ActQuantConfig::kItems,  // set with the grid
  };
  const DLDevice device = device_.unwrap();
  const int64_t num_rows = params.num_experts * params.quant.num_tokens;
  if (num_rows == 0 || num_groups == 0) return;

  // Configure: this kernel's accesses (16-byte chunks of input, kVecN-byte stores of output_q, when
  // every row and expert start allows them) ...
  const auto aligned_bytes = [](const void* ptr, std::initializer_list<int64_t> byte_strides, int64_t bytes) {
    bool ok = quant::is_aligned(ptr, bytes);
    for (const int64_t s : byte_strides) ok = ok && quant::is_aligned(s, bytes);
    return ok;
  };
  constexpr int64_t kElem = sizeof(T);
  const bool aligned =
      aligned_bytes(
          params.quant.input, {params.quant.input_row_stride * kElem, params.input_expert_stride * kElem}, 16) &&
      aligned_bytes(params.quant.output_q, {params.quant.q_row_stride, params.q_expert_stride}, kVecN);
  // ... and, legacy, the activation math of the unfused op: silu_and_mul on the rows as one
  // [num_rows, 2H] view (its row stride: input's when the expert dim folds into the rows, else the
  // contiguous copy its wrapper's reshape makes) writing a fresh contiguous [num_rows, H] tensor.
  // fp32 has one math: no rounding between act and the product, so legacy is dense.
  [[maybe_unused]] ActQuantMath math = dense ? ActQuantMath::kDense : ActQuantMath::kLegacy;
  if constexpr (!std::is_same_v<T, fp32_t>) {
    const int64_t per_expert = params.quant.num_tokens;
    const bool folds = params.num_experts == 1 || per_expert == 1 ||
                       params.input_expert_stride == per_expert * params.quant.input_row_stride;
    const int64_t view_stride =
        params.num_experts == 1 || per_expert > 1 ? params.quant.input_row_stride : params.input_expert_stride;
    const int64_t unfused_vec_bytes = dense ? 0
                                            : gated_act_launch_vector_bytes<T>(
                                                  folds ? params.quant.input : nullptr,  // nullptr: the copy, aligned
                                                  nullptr,
                                                  params.hidden_size,
                                                  folds ? view_stride : 2 * params.hidden_size,
                                                  params.hidden_size,
                                                  num_rows,
                                                  device.device_id);
    if (unfused_vec_bytes == 16) math = ActQuantMath::kLegacyBranchFree;
  }
  const int64_t rows = launch_rows > 0 ? launch_rows : params.quant.num_tokens;

  // Launch
  if constexpr (std::is_same_v<T, fp32_t>) {
    launch_act_and_mul_group_quant<T, TOut, kAct, ActQuantMath::kLegacy>(params, rows, aligned, device);
  } else if (math == ActQuantMath::kLegacyBranchFree) {
    launch_act_and_mul_group_quant<T, TOut, kAct, ActQuantMath::kLegacyBranchFree>(params, rows, aligned, device);
  } else if (math == ActQuantMath::kLegacy) {
    launch_act_and_mul_group_quant<T, TOut, kAct, ActQuantMath::kLegacy>(params, rows, aligned, device);
  } else {
    launch_act_and_mul_group_quant<T, TOut, kAct, ActQuantMath::kDense>(params, rows, aligned, device);
  }
}

}  // namespace
