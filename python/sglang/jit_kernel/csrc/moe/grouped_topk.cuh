// grouped_topk: DeepSeek-V3 routing. Per token row, s = sigmoid(x) + bias; the experts split into
// num_expert_group groups of num_experts / num_expert_group; a group scores the sum of its two
// largest s; the topk_group best groups are kept (ties to the lower group) and the topk largest s
// among their experts chosen (ties to the lower expert). Weights: the un-biased sigmoids, divided
// by (their sum + 1e-20) with renormalize, times scaling_factor. Engine: topk_rows.cuh.
#pragma once

#include <sgl_kernel/utils.h>  // For RuntimeCheck

#include <tvm/ffi/container/tensor.h>

#include "topk_rows.cuh"  // For TopkRowsParams, unwrap_topk_rows, launch_topk_rows

namespace {

/// topk_values [num_tokens, topk] fp32 and topk_indices [num_tokens, topk] int32 from scores
/// [num_tokens, num_experts] of T (fp16_t | bf16_t | fp32_t) and bias fp32 [num_experts] (or [0]).
/// num_expert_group in [1, 32] dividing num_experts; topk_group in [1, num_expert_group];
/// topk <= topk_group * num_experts / num_expert_group. Layouts and errors: unwrap_topk_rows.
/// kEngines: the engine and run length this module builds (RoutingEngines). Returns true once
/// launched (or for empty inputs); false, launching nothing, for shapes a kV2 module does not take.
template <typename T, moe_routing::RoutingEngines kEngines>
bool grouped_topk(
    tvm::ffi::TensorView topk_values,
    tvm::ffi::TensorView topk_indices,
    tvm::ffi::TensorView scores,
    tvm::ffi::TensorView bias,
    int64_t num_expert_group,
    int64_t topk_group,
    bool renormalize,
    double scaling_factor) {
  using namespace host;
  using namespace moe_routing;
  // Validate, unwrap
  DLDevice device;
  TopkRowsParams params = unwrap_topk_rows<T>(topk_values, topk_indices, scores, bias, device);
  RuntimeCheck(
      num_expert_group >= 1 && num_expert_group <= 32 && params.num_experts % num_expert_group == 0,
      "grouped_topk: num_expert_group must be in [1, 32] and divide num_experts = ",
      params.num_experts,
      ", got ",
      num_expert_group);
  RuntimeCheck(
      topk_group >= 1 && topk_group <= num_expert_group,
      "grouped_topk: topk_group must be in [1, num_expert_group], got ",
      topk_group);
  const int64_t group_size = params.num_experts / num_expert_group;
  RuntimeCheck(
      params.topk <= topk_group * group_size,
      "grouped_topk: topk must be <= topk_group * group_size = ",
      topk_group * group_size,
      ", got ",
      params.topk);
  if (params.num_tokens == 0) return true;
  // Configure
  params.scoring = kSigmoid;
  params.num_groups = static_cast<int32_t>(num_expert_group);
  params.group_size = static_cast<int32_t>(group_size);
  params.topk_group = static_cast<int32_t>(topk_group);
  params.renormalize = renormalize;
  params.renorm_eps = 1e-20f;
  params.scale = static_cast<float>(scaling_factor);
  // Launch
  return launch_topk_rows<T, RoutingOp::kGrouped, kEngines>(params, device);
}

}  // namespace
