// RMSNorm over each whole row of q and of k (all heads of a token at once), in place, in one launch:
//
//   q[t, :] <- round(q[t, :] * rsqrt(mean(q[t, :]^2) + eps) * q_weight)     q: [num_tokens, hidden_q]
//   k[t, :] <- round(k[t, :] * rsqrt(mean(k[t, :]^2) + eps) * k_weight)     k: [num_tokens, hidden_k]
//
// fp32 arithmetic, one rounding. The kernels of fused_inplace_qknorm (norm_rows_kernel,
// NormKind::kQKNorm, the same builds), with one head per token; q and k may have different hidden
// sizes: each tensor has its own row length and threads per row, and they share the vectors per
// thread, chosen for the longer rows (set_row_geometry). The grid is fused_inplace_qknorm's: q's
// rows and k's rows in CTAs of their own, interleaved in launch order (cta_share), k's shorter
// rows several per CTA (bf16 4096 + 1024: 256 x 2 for q, 64 x 2 for k, four k rows per CTA).
// Bytes moved: 2 * num_tokens * (hidden_q + hidden_k) * sizeof(T) + (hidden_q + hidden_k) * sizeof(T).
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, SymbolicSize, SymbolicDevice, kAnySize

#include <algorithm>
#include <cstdint>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include "qknorm.cuh"  // For verify_qk_in_place, in_place_rows; norm_rows.cuh's launch_norm_rows_any_width

namespace {

/// In place: each row of q RMS-normalised over hidden_q with q_weight, each row of k over hidden_k
/// with k_weight. q: [num_tokens, hidden_q], k: [num_tokens, hidden_k], T on one CUDA device, last
/// dim contiguous, token strides free (views of one fused qkv buffer work), q and k disjoint;
/// q_weight: [hidden_q], k_weight: [hidden_k], contiguous, sharing no memory with q or k.
/// enable_pdl: 1 / 0 / -1 (auto: on for SM90+). T = fp16_t | bf16_t | fp32_t. Empty inputs return
/// without a launch. Throws PanicError (Python RuntimeError) naming the tensor.
/// kWidths: the vector widths this module builds (NormWidths). Returns true once launched (or for
/// empty inputs); false, launching nothing, for rows a kWide module does not take.
template <typename T, NormWidths kWidths>
bool fused_inplace_qknorm_across_heads(
    tvm::ffi::TensorView q,
    tvm::ffi::TensorView k,
    tvm::ffi::TensorView q_weight,
    tvm::ffi::TensorView k_weight,
    double eps,
    int64_t enable_pdl) {
  using namespace host;
  constexpr const char* kOp = "fused_inplace_qknorm_across_heads";

  // Validate
  SymbolicSize num_tokens{"num_tokens"};
  SymbolicSize hidden_q{"hidden_q"};
  SymbolicSize hidden_k{"hidden_k"};
  SymbolicDevice device_;
  device_.set_options<kDLCUDA>();
  TensorMatcher({num_tokens, hidden_q})  //
      .with_strides({kAnySize, kAnySize})
      .with_dtype<T>()
      .with_device<kDLCUDA>(device_)
      .verify(q, "q");
  TensorMatcher({num_tokens, hidden_k})  //
      .with_strides({kAnySize, kAnySize})
      .with_dtype<T>()
      .with_device<kDLCUDA>(device_)
      .verify(k, "k");
  TensorMatcher({hidden_q})  //
      .with_dtype<T>()
      .with_device<kDLCUDA>(device_)
      .verify(q_weight, "q_weight");
  TensorMatcher({hidden_k})  //
      .with_dtype<T>()
      .with_device<kDLCUDA>(device_)
      .verify(k_weight, "k_weight");
  check_last_dim_contiguous(kOp, "q", q);
  check_last_dim_contiguous(kOp, "k", k);
  verify_qk_in_place(q, k, q_weight, k_weight);

  // Unwrap
  const int64_t n = num_tokens.unwrap();
  const int64_t hq = hidden_q.unwrap();
  const int64_t hk = hidden_k.unwrap();
  const DLDevice device = device_.unwrap();
  check_norm_scalars(kOp, std::max(hq, hk), eps);
  if (n == 0 || hq + hk == 0) return true;

  // Configure: one head per token; a tensor with empty rows gets no rows (and no CTA).
  NormParams params{};
  params.rows[0] = in_place_rows(q, q_weight, hq > 0 ? n : 0, 1, hq, 0);
  params.rows[1] = in_place_rows(k, k_weight, hk > 0 ? n : 0, 1, hk, 0);
  params.eps = static_cast<float>(eps);
  params.weight_offset = 0.0f;
  // One vector width for both tensors: it divides both row lengths, strides and pointers.
  const uint64_t stride_bits = n > 1 ? static_cast<uint64_t>(q.stride(0) | k.stride(0)) : 0;
  const int64_t vec_bytes = widest_vector_bytes<T>(
      {address_of(params.rows[0].input),
       address_of(params.rows[1].input),
       address_of(params.rows[0].weight),
       address_of(params.rows[1].weight),
       stride_bits * sizeof(T),
       static_cast<uint64_t>(hq | hk) * sizeof(T)});

  // Launch
  return launch_norm_rows_any_width<T, NormKind::kQKNorm, kWidths>(
      params,
      vec_bytes,
      device,
      resolve_pdl(enable_pdl, device),
      /*in_place=*/true);
}

}  // namespace
