// topk_softmax: per token row, p = softmax(softcap(x) + bias) in fp32 over the experts; the k
// largest p (ties to the lower expert) and their experts, optionally renormalised to sum 1.
// Engine and selection rules: topk_rows.cuh.
#pragma once

#include <tvm/ffi/container/tensor.h>

#include "topk_rows.cuh"  // For TopkRowsParams, unwrap_topk_rows, launch_topk_rows

namespace {

/// topk_weights [num_tokens, topk] fp32 and topk_ids [num_tokens, topk] int32 from gating_output
/// [num_tokens, num_experts] of T (fp16_t | bf16_t | fp32_t); correction_bias fp32 [num_experts]
/// or [0]; moe_softcapping > 0 applies cap * tanh(x / cap) first. Layouts and errors:
/// unwrap_topk_rows. Empty inputs return without a launch.
/// kEngines: the engine and run length this module builds (RoutingEngines). Returns true once
/// launched (or for empty inputs); false, launching nothing, for shapes a kV2 module does not take.
template <typename T, moe_routing::RoutingEngines kEngines>
bool topk_softmax(
    tvm::ffi::TensorView topk_weights,
    tvm::ffi::TensorView topk_ids,
    tvm::ffi::TensorView gating_output,
    tvm::ffi::TensorView correction_bias,
    bool renormalize,
    double moe_softcapping) {
  using namespace moe_routing;
  // Validate, unwrap
  DLDevice device;
  TopkRowsParams params = unwrap_topk_rows<T>(topk_weights, topk_ids, gating_output, correction_bias, device);
  if (params.num_tokens == 0) return true;
  // Configure
  params.scoring = kSoftmax;
  params.softcap = static_cast<float>(moe_softcapping);
  params.renormalize = renormalize;
  // Launch
  return launch_topk_rows<T, RoutingOp::kSoftmax, kEngines>(params, device);
}

}  // namespace
