// The lookahead kernel (the default) against the register-winner kernel of topk_rows.cuh, bit for bit, on
// the host (warp_emulation.h; built and run by test_topk_rows_emulated.py, which writes
// topk_rows_kernels.inc: the kernels and launchers of topk_rows.cuh). Usage: lookahead_check ROWS.
// Prints one line per mismatching case and "N cases, M mismatches"; exits 1 on any mismatch.
#include <cstdio>
#include <random>
#include <string_view>
#include <type_traits>
#include <vector>

#include "warp_emulation.h"
// warp_emulation.h first: the kernels below compile against it.
#include "topk_rows_kernels.inc"

namespace {

using moe_routing::TopkRowsParams;

struct Routing {
  std::vector<float> weights;  // [num_tokens, weights_stride]
  std::vector<int32_t> ids;    // [num_tokens, ids_stride]
};

/// The launcher's output for `params` with SGLANG_MOE_TOPK_WINNERS = `winners` (nullptr: unset);
/// outputs poisoned with -7 (their padding columns included).
Routing route(TopkRowsParams params, const char* winners) {
  Routing out;
  out.weights.assign(params.num_tokens * params.weights_stride, -7.0f);
  out.ids.assign(params.num_tokens * params.ids_stride, -7);
  params.weights = out.weights.data();
  params.ids = out.ids.data();
  if (winners != nullptr) {
    setenv("SGLANG_MOE_TOPK_WINNERS", winners, 1);
  } else {
    unsetenv("SGLANG_MOE_TOPK_WINNERS");
  }
  moe_routing::launch_topk_rows<float>(params, DLDevice{kDLCUDA, 0});
  return out;
}

/// The same ids, NaN weights at the same places and the same bits elsewhere.
bool same_bits(const Routing& a, const Routing& b) {
  if (a.ids != b.ids) return false;
  for (size_t i = 0; i < a.weights.size(); ++i) {
    const bool nan_a = std::isnan(a.weights[i]), nan_b = std::isnan(b.weights[i]);
    if (nan_a != nan_b || (!nan_a && __float_as_uint(a.weights[i]) != __float_as_uint(b.weights[i]))) return false;
  }
  return true;
}

/// randn logits [num_tokens >= 9, num_experts] at row stride `stride` from element `offset` of the
/// returned buffer; rows 0..8 are edge rows: NaN logits, only NaN, +-inf, all ties, +0 / -0, a
/// spread whose exp(x - max) runs through the subnormals to 0, only -inf, ~1e4, quarter-grid ties.
std::vector<float> logits(int num_tokens, int num_experts, int stride, int offset, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  std::vector<float> buffer(offset + static_cast<size_t>(num_tokens) * stride + 16);
  for (float& v : buffer) v = normal(gen);
  const auto at = [&](int row, int e) -> float& { return buffer[offset + static_cast<size_t>(row) * stride + e]; };
  for (int e = 0; e < num_experts; ++e) {
    if (e % 3 == 0) at(0, e) = NAN;
    at(1, e) = NAN;
    at(3, e) = 0.5f;
    at(4, e) = e % 2 != 0 ? 0.0f : -0.0f;
    at(5, e) = -120.0f + 120.0f * static_cast<float>(e) / static_cast<float>(std::max(1, num_experts - 1));
    at(6, e) = -INFINITY;
    at(7, e) *= 1e4f;
    at(8, e) = std::round(at(8, e) * 4.0f) / 4.0f;
  }
  at(2, 1 % num_experts) = INFINITY;
  at(2, 5 % num_experts) = -INFINITY;
  return buffer;
}

std::vector<float> bias_of(int num_experts, int steps, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<float> bias(num_experts);
  for (float& v : bias) v = static_cast<float>(static_cast<int>(gen() % (2 * steps)) - steps) / steps;
  return bias;
}

}  // namespace

int main(int argc, char** argv) {
  const int num_tokens = argc > 1 ? std::max(9, std::atoi(argv[1])) : 16;
  int cases = 0, mismatches = 0;
  const auto check = [&](const TopkRowsParams& params, const char* what) {
    ++cases;
    if (same_bits(route(params, "regs"), route(params, nullptr))) return;
    ++mismatches;
    std::printf(
        "mismatch: %s experts %d topk %d scoring %d bias %d softcap %g renormalize %d groups %d keep %d\n",
        what,
        params.num_experts,
        params.topk,
        params.scoring,
        params.bias != nullptr,
        params.softcap,
        params.renormalize,
        params.num_groups,
        params.topk_group);
  };

  // Softmax and sigmoid, every option, aligned rows and misaligned strided ones (the scalar loads).
  for (int num_experts : {8, 60, 64, 128, 160, 256}) {
    const std::vector<float> bias = bias_of(num_experts, 32, num_experts);
    for (int strided = 0; strided < 2; ++strided) {
      const int stride = strided ? num_experts + 3 : num_experts, offset = strided;
      const std::vector<float> rows = logits(num_tokens, num_experts, stride, offset, 1234 + num_experts + strided);
      for (int topk : {1, 2, 4, 5, 8, 17, 32}) {
        if (topk > num_experts) continue;
        for (int scoring : {0, 1}) {
          for (int with_bias : {0, 1}) {
            for (float softcap : {0.0f, 2.5f}) {
              for (int renormalize : {0, 1}) {
                if (scoring == moe_routing::kSigmoid && softcap > 0.0f) continue;
                check(
                    TopkRowsParams{
                        .gating = rows.data() + offset,
                        .bias = with_bias ? bias.data() : nullptr,
                        .num_tokens = num_tokens,
                        .gating_stride = stride,
                        .weights_stride = topk + 1,
                        .ids_stride = topk + 2,
                        .num_experts = num_experts,
                        .topk = topk,
                        .num_groups = 1,
                        .group_size = num_experts,
                        .topk_group = 1,
                        .scoring = scoring,
                        .softcap = softcap,
                        .renorm_eps = scoring == moe_routing::kSigmoid ? 1e-20f : 0.0f,
                        .scale = 1.0f,
                        .renormalize = renormalize != 0,
                    },
                    "plain");
              }
            }
          }
        }
      }
    }
  }

  // Grouped (experts, groups, groups kept, topk): 1, 2, 4, 16 lanes per group; runs of 1, 2, 4, 8.
  const int shapes[][4] = {
      {256, 8, 4, 8}, {256, 16, 4, 8}, {64, 4, 2, 4}, {64, 2, 1, 8}, {8, 8, 8, 8}, {128, 32, 4, 8}, {160, 5, 2, 6}};
  for (const auto& shape : shapes) {
    const int num_experts = shape[0];
    const std::vector<float> bias = bias_of(num_experts, 8, 7 * num_experts);
    const std::vector<float> rows = logits(num_tokens, num_experts, num_experts, 0, 99 + num_experts);
    for (int with_bias : {0, 1}) {
      for (int renormalize : {0, 1}) {
        check(
            TopkRowsParams{
                .gating = rows.data(),
                .bias = with_bias ? bias.data() : nullptr,
                .num_tokens = num_tokens,
                .gating_stride = num_experts,
                .weights_stride = shape[3],
                .ids_stride = shape[3],
                .num_experts = num_experts,
                .topk = shape[3],
                .num_groups = shape[1],
                .group_size = num_experts / shape[1],
                .topk_group = shape[2],
                .scoring = moe_routing::kSigmoid,
                .renorm_eps = 1e-20f,
                .scale = 2.5f,
                .renormalize = renormalize != 0,
            },
            "grouped");
      }
    }
  }
  std::printf("%d cases, %d mismatches\n", cases, mismatches);
  return mismatches != 0 ? 1 : 0;
}
