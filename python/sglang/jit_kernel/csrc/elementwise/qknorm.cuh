// Per-head RMSNorm of q and k, in place, in one launch:
//
//   q[t, h, :] <- round(q[t, h, :] * rsqrt(mean(q[t, h, :]^2) + eps) * q_weight)
//   k[t, h, :] <- round(k[t, h, :] * rsqrt(mean(k[t, h, :]^2) + eps) * k_weight)
//
// q and k may be strided views of one fused qkv buffer (token and head strides free, last dim
// contiguous). The kernel is norm_rows_kernel's kQKNorm build (norm_rows.cuh): every
// (token, head) of q, then of k, is one row of head_dim elements (token = row / num_heads by a
// multiply and a shift). For head_dim 128 bf16 with 16-byte vectors, 8 lanes x 2 vectors hold a
// head, a warp normalises 4 heads with 3 shuffles, and CTAs of 256 threads take groups of 32
// heads; at one token 16 lanes x 1 vector, twice the CTAs.
//
// The grid. The kernel is written persistent: each CTA strides over the groups of its tensor, q's
// CTAs over q's groups and k's over k's (cta_share), so any grid of at least two CTAs (one for each
// tensor with rows) is correct. The launcher sizes it at one CTA per group rather than at the
// resident CTAs (SMs x runtime::get_blocks_per_sm), which measured faster at every size: a retiring
// CTA is replaced at once and the next group's loads overlap the previous one's stores. q and k get
// shares of the grid in proportion to their groups, interleaved in launch order when the grid has
// more CTAs than SMs, so that the CTAs resident at any time read q and k of the same tokens. Bytes
// moved: 2 * num_tokens * (num_q_heads + num_kv_heads) * head_dim * sizeof(T) + 2 * head_dim * sizeof(T).
#pragma once

// For TensorMatcher, SymbolicSize, SymbolicDevice, kAnySize, data_ptr, verify_no_self_overlap,
// verify_no_partial_overlap
#include <sgl_kernel/tensor.h>
#include <sgl_kernel/utils.h>  // For PanicError (what every check throws)

#include <cstdint>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

// The row engine: NormParams, NormRows, NormKind, NormWidths, check_last_dim_contiguous,
// check_norm_scalars, address_of, widest_vector_bytes, resolve_pdl, launch_norm_rows_any_width
#include "norm_rows.cuh"

namespace {

/// Aliasing checks of the in-place q / k launchers (this file and qknorm_across_heads.cuh): q and k
/// each free of self-overlap (no stride-0 dim, no heads closer than their length), disjoint from each
/// other (interleaved views of one buffer are fine), and sharing no memory with either weight, which
/// other rows still read while q and k are written. Throws PanicError naming the tensors.
inline void verify_qk_in_place(
    const tvm::ffi::TensorView& q,
    const tvm::ffi::TensorView& k,
    const tvm::ffi::TensorView& q_weight,
    const tvm::ffi::TensorView& k_weight) {
  host::verify_no_self_overlap(q, "q");
  host::verify_no_self_overlap(k, "k");
  host::verify_no_partial_overlap(k, "k", q, "q", /*allow_same=*/false);
  host::verify_no_partial_overlap(q, "q", q_weight, "q_weight", /*allow_same=*/false);
  host::verify_no_partial_overlap(q, "q", k_weight, "k_weight", /*allow_same=*/false);
  host::verify_no_partial_overlap(k, "k", q_weight, "q_weight", /*allow_same=*/false);
  host::verify_no_partial_overlap(k, "k", k_weight, "k_weight", /*allow_same=*/false);
}

/// The rows of an in-place tensor `t` ([num_tokens, num_heads, hidden_size], or [num_tokens,
/// hidden_size] with num_heads = 1 and head_stride = 0): num_rows rows (num_tokens * num_heads, or
/// 0), normalised with `weight` and written where they are read.
inline NormRows in_place_rows(
    const tvm::ffi::TensorView& t,
    const tvm::ffi::TensorView& weight,
    int64_t num_rows,
    int64_t num_heads,
    int64_t hidden_size,
    int64_t head_stride) {
  return NormRows{
      .input = host::data_ptr<const void>(t),
      .out = host::data_ptr(t),
      .residual = nullptr,
      .weight = host::data_ptr<const void>(weight),
      .num_rows = num_rows,
      .num_groups = 0,                             // set with the geometry
      .num_heads = num_heads > 0 ? num_heads : 1,  // never divided by when 0: no rows
      .hidden_size = hidden_size,
      .input_token_stride = t.stride(0),
      .input_head_stride = head_stride,
      .out_token_stride = t.stride(0),
      .out_head_stride = head_stride,
      .residual_token_stride = 0,
  };
}

/// In place: each head of q and of k RMS-normalised over head_dim with its weight.
/// q: [num_tokens, num_q_heads, head_dim], k: [num_tokens, num_kv_heads, head_dim], T on one CUDA
/// device, last dim contiguous, other strides free (heads must not overlap); q_weight, k_weight:
/// [head_dim], contiguous. enable_pdl: 1 / 0 / -1 (auto: on for SM90+). T = fp16_t | bf16_t | fp32_t.
/// Empty inputs return without a launch. Throws PanicError (Python RuntimeError) naming the tensor.
/// kWidths: the vector widths this module builds (NormWidths). Returns true once launched (or for
/// empty inputs); false, launching nothing, for rows a kWide module does not take.
template <typename T, NormWidths kWidths>
bool fused_inplace_qknorm(
    tvm::ffi::TensorView q,
    tvm::ffi::TensorView k,
    tvm::ffi::TensorView q_weight,
    tvm::ffi::TensorView k_weight,
    double eps,
    int64_t enable_pdl) {
  using namespace host;

  // Validate
  SymbolicSize num_tokens{"num_tokens"};
  SymbolicSize num_q_heads{"num_q_heads"};
  SymbolicSize num_kv_heads{"num_kv_heads"};
  SymbolicSize head_dim{"head_dim"};
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
  TensorMatcher({head_dim})  //
      .with_dtype<T>()
      .with_device<kDLCUDA>(device_)
      .verify(q_weight, "q_weight")
      .verify(k_weight, "k_weight");
  check_last_dim_contiguous("fused_inplace_qknorm", "q", q);
  check_last_dim_contiguous("fused_inplace_qknorm", "k", k);
  verify_qk_in_place(q, k, q_weight, k_weight);

  // Unwrap
  const int64_t n = num_tokens.unwrap();
  const int64_t hq = num_q_heads.unwrap();
  const int64_t hk = num_kv_heads.unwrap();
  const int64_t d = head_dim.unwrap();
  const DLDevice device = device_.unwrap();
  check_norm_scalars("fused_inplace_qknorm", d, eps);
  if (n == 0 || d == 0 || hq + hk == 0) return true;

  // Configure
  NormParams params{};
  params.rows[0] = in_place_rows(q, q_weight, n * hq, hq, d, q.stride(1));
  params.rows[1] = in_place_rows(k, k_weight, n * hk, hk, d, k.stride(1));
  params.eps = static_cast<float>(eps);
  params.weight_offset = 0.0f;
  // Strides matter only along dims longer than 1.
  uint64_t stride_bits = 0;
  if (n > 1) stride_bits |= static_cast<uint64_t>(q.stride(0) | k.stride(0));
  if (hq > 1) stride_bits |= static_cast<uint64_t>(q.stride(1));
  if (hk > 1) stride_bits |= static_cast<uint64_t>(k.stride(1));
  const int64_t vec_bytes = widest_vector_bytes<T>(
      {address_of(params.rows[0].input),
       address_of(params.rows[1].input),
       address_of(params.rows[0].weight),
       address_of(params.rows[1].weight),
       stride_bits * sizeof(T),
       static_cast<uint64_t>(d) * sizeof(T)});

  // Launch
  return launch_norm_rows_any_width<T, NormKind::kQKNorm, kWidths>(
      params,
      vec_bytes,
      device,
      resolve_pdl(enable_pdl, device),
      /*in_place=*/true);
}

}  // namespace
