// RMSNorm over the last dimension, row by row, out of place or in place:
//
//   out[r, :] = round(x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * (w + weight_offset))
//
// fp32 arithmetic, one rounding to the dtype; weight_offset = 1 gives Gemma's (1 + w) (gemma_rmsnorm).
// With cast_x_before_out_mul the normalised x is rounded to the dtype first and then multiplied by
// the weight, Hugging Face's order (rmsnorm_hf): out = round(float(round(x * rstd)) * w). Both are
// runtime parameters of the same kernels, so rmsnorm, gemma_rmsnorm and rmsnorm_hf share one build.
//
// The launcher below is the pattern every op here follows: validate the tensors with TensorMatcher
// (shapes, strides, dtype and device in one pass, errors naming the tensor), unwrap the symbolic
// sizes, fill the kernel's parameters, and launch. The kernel is norm_rows_kernel<T, kVecN,
// NormKind::kRMSNorm, ...> of norm_rows.cuh, which picks the vector width (16 bytes when the pointers
// and row strides allow it), the threads per row and vectors per thread for the row length, and
// launches through host::LaunchKernel with PDL. Bytes moved: 2 * num_tokens * hidden_size *
// sizeof(T) + hidden_size * sizeof(T).
#pragma once

#include <sgl_kernel/tensor.h>  // For TensorMatcher, SymbolicSize, SymbolicDevice, kAnySize, data_ptr
#include <sgl_kernel/utils.h>   // For RuntimeCheck

#include <cstdint>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include "norm_rows.cuh"  // For NormParams, NormRows, launch_norm_rows_any_width, widest_vector_bytes

namespace {

/// out = input * rsqrt(mean(input^2) + eps) * (weight + weight_offset), row by row.
/// input, out: [num_tokens, hidden_size] of T on one CUDA device, last dim contiguous, any row
/// strides (out may be input); weight: [hidden_size], contiguous. enable_pdl: 1 / 0 / -1 (auto).
/// T = fp16_t | bf16_t | fp32_t. Empty inputs return without a launch. Throws PanicError (Python
/// RuntimeError) naming the tensor on any mismatch.
/// kWidths: the vector widths this module builds (NormWidths). Returns true once launched (or for
/// empty inputs); false, launching nothing, for rows a kWide module does not take.
template <typename T, NormWidths kWidths>
bool rmsnorm(
    tvm::ffi::TensorView out,
    tvm::ffi::TensorView input,
    tvm::ffi::TensorView weight,
    double eps,
    double weight_offset,
    bool cast_x_before_out_mul,
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
      .verify(out, "out");
  check_last_dim_contiguous("rmsnorm", "input", input);
  check_last_dim_contiguous("rmsnorm", "out", out);
  TensorMatcher({hidden_size})  //
      .with_dtype<T>()
      .with_device<kDLCUDA>(device_)
      .verify(weight, "weight");
  verify_no_self_overlap(out, "out");
  verify_no_partial_overlap(out, "out", input, "input", /*allow_same=*/true);
  // Other rows still read the weight while out is written: they must not share memory.
  verify_no_partial_overlap(out, "out", weight, "weight", /*allow_same=*/false);

  // Unwrap
  const int64_t n = num_tokens.unwrap();
  const int64_t h = hidden_size.unwrap();
  const DLDevice device = device_.unwrap();
  check_norm_scalars("rmsnorm", h, eps);
  if (n == 0 || h == 0) return true;

  // Configure
  NormParams params{};
  params.rows[0] = NormRows{
      .input = data_ptr<const void>(input),
      .out = data_ptr(out),
      .residual = nullptr,
      .weight = data_ptr<const void>(weight),
      .num_rows = n,
      .num_groups = 0,  // set with the geometry
      .num_heads = 1,
      .hidden_size = h,
      .input_token_stride = input.stride(0),
      .input_head_stride = 0,
      .out_token_stride = out.stride(0),
      .out_head_stride = 0,
      .residual_token_stride = 0,
  };
  params.eps = static_cast<float>(eps);
  params.weight_offset = static_cast<float>(weight_offset);
  params.cast_x_before_out_mul = cast_x_before_out_mul;
  // Hugging Face's order in fp16 / bf16: the weight multiply as one packed multiply per pair (normalize).
  params.packed_weight_mul = cast_x_before_out_mul && weight_offset == 0.0 && sizeof(T) == 2;
  const uint64_t row_bytes = n > 1 ? static_cast<uint64_t>(input.stride(0) | out.stride(0)) * sizeof(T) : 0;
  const int64_t vec_bytes = widest_vector_bytes<T>(
      {address_of(params.rows[0].input),
       address_of(params.rows[0].out),
       address_of(params.rows[0].weight),
       row_bytes,
       static_cast<uint64_t>(h) * sizeof(T)});

  // Launch
  // In place: out is input (the overlap check above allows only the same view or none).
  const bool in_place = params.rows[0].out == params.rows[0].input;
  return launch_norm_rows_any_width<T, NormKind::kRMSNorm, kWidths>(
      params, vec_bytes, device, resolve_pdl(enable_pdl, device), in_place);
}

}  // namespace
