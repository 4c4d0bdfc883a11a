// Fused residual add + RMSNorm, in place:
//
//   residual[r, :] <- round(input[r, :] + residual[r, :])                       (fp32 add, one rounding)
//   input[r, :]    <- round(s * rsqrt(mean(s^2) + eps) * (w + weight_offset)),  s = the ROUNDED sum
//
// The variance is computed from the rounded sum, i.e. from exactly the values stored in the
// residual stream, so the normalised output is consistent with what the next layer adds to.
// weight_offset = 1 gives Gemma's (1 + w) (gemma_fused_add_rmsnorm, a runtime parameter of the same
// kernels). The kernel is norm_rows_kernel<T, kVecN, NormKind::kFusedAddRMSNorm> (norm_rows.cuh):
// each thread reads its input and residual vectors once, stores the rounded sum to the residual
// before the reduction and keeps it in registers.
// Bytes moved: 4 * num_tokens * hidden_size * sizeof(T) + hidden_size * sizeof(T).
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, SymbolicSize, SymbolicDevice, kAnySize, data_ptr
#include <sgl_kernel/utils.h>   // For RuntimeCheck

#include <cstdint>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include "norm_rows.cuh"  // For NormParams, NormRows, launch_norm_rows_any_width, widest_vector_bytes

namespace {

/// In place: residual = round(input + residual); input = rmsnorm(residual) (see the file comment).
/// input, residual: [num_tokens, hidden_size] of T on one CUDA device, last dim contiguous, any row
/// strides, not overlapping each other; weight: [hidden_size], contiguous. enable_pdl: 1 / 0 / -1
/// (auto: on for SM90+). T = fp16_t | bf16_t | fp32_t. Empty inputs return without a launch.
/// Throws PanicError (Python RuntimeError) naming the tensor on any mismatch.
/// kWidths: the vector widths this module builds (NormWidths). Returns true once launched (or for
/// empty inputs); false, launching nothing, for rows a kWide module does not take.
template <typename T, NormWidths kWidths>
bool fused_add_rmsnorm(
    tvm::ffi::TensorView input,
    tvm::ffi::TensorView residual,
    tvm::ffi::TensorView weight,
    double eps,
    double weight_offset,
    int64_t enable_pdl) {
  using namespace host;

  // Validate
  SymbolicSize num_tokens{"num_tokens"};
  SymbolicSize hidden_size{"hidden_size"};
  SymbolicDevice device_;
  device_.set_options<kDLCUDA>();
  TensorMatcher({num_tokens, hidden_size})  //
      .with_strides({kAnySize, kAnySize})
      .with_dtype<T>()
      .with_device<kDLCUDA>(device_)
      .verify(input, "input")
      .verify(residual, "residual");
  check_last_dim_contiguous("fused_add_rmsnorm", "input", input);
  check_last_dim_contiguous("fused_add_rmsnorm", "residual", residual);
  TensorMatcher({hidden_size})  //
      .with_dtype<T>()
      .with_device<kDLCUDA>(device_)
      .verify(weight, "weight");
  verify_no_self_overlap(input, "input");
  verify_no_self_overlap(residual, "residual");
  verify_no_partial_overlap(residual, "residual", input, "input", /*allow_same=*/false);
  // Other rows still read the weight while input and residual are written: no shared memory.
  verify_no_partial_overlap(input, "input", weight, "weight", /*allow_same=*/false);
  verify_no_partial_overlap(residual, "residual", weight, "weight", /*allow_same=*/false);

  // Unwrap
  const int64_t n = num_tokens.unwrap();
  const int64_t h = hidden_size.unwrap();
  const DLDevice device = device_.unwrap();
  check_norm_scalars("fused_add_rmsnorm", h, eps);
  if (n == 0 || h == 0) return true;

  // Configure
  NormParams params{};
  params.rows[0] = NormRows{
      .input = data_ptr<const void>(input),
      .out = data_ptr(input),
      .residual = data_ptr(residual),
      .weight = data_ptr<const void>(weight),
      .num_rows = n,
      .num_groups = 0,  // set with the geometry
      .num_heads = 1,
      .hidden_size = h,
      .input_token_stride = input.stride(0),
      .input_head_stride = 0,
      .out_token_stride = input.stride(0),
      .out_head_stride = 0,
      .residual_token_stride = residual.stride(0),
  };
  params.eps = static_cast<float>(eps);
  params.weight_offset = static_cast<float>(weight_offset);
  const uint64_t row_bytes = n > 1 ? static_cast<uint64_t>(input.stride(0) | residual.stride(0)) * sizeof(T) : 0;
  const int64_t vec_bytes = widest_vector_bytes<T>(
      {address_of(params.rows[0].input),
       address_of(params.rows[0].residual),
       address_of(params.rows[0].weight),
       row_bytes,
       static_cast<uint64_t>(h) * sizeof(T)});

  // Launch
  return launch_norm_rows_any_width<T, NormKind::kFusedAddRMSNorm, kWidths>(
      params, vec_bytes, device, resolve_pdl(enable_pdl, device), /*in_place=*/true);
}

}  // namespace
