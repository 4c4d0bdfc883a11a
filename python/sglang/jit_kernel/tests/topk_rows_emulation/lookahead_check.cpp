// The generic lookahead kernel against the register-winner kernel of topk_rows.cuh, and the
// specialised lookahead kernels (the default; SGLANG_MOE_TOPK_SPECIALISED=0 the generic one) against
// the generic one, bit for bit, on
// the host (warp_emulation.h; built and run by test_topk_rows_emulated.py, which writes
// topk_rows_kernels.inc: the kernels and launchers of topk_rows.cuh). Usage: lookahead_check ROWS.
// Prints one line per mismatching case (or per case launched on the wrong kernel), then
// "specialised: S cases on N kernels, F fallbacks" and "N cases, M mismatches"; exits 1 on any
// mismatch.
#include <algorithm>
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
  const void* kernel;          // the kernel the launcher ran
};

/// Sets environment variable `name` to `value` (nullptr: unsets it).
void set_env(const char* name, const char* value) {
  if (value != nullptr) {
    setenv(name, value, 1);
  } else {
    unsetenv(name);
  }
}

/// The launcher's output for `params` with SGLANG_MOE_TOPK_WINNERS = `winners`,
/// SGLANG_MOE_TOPK_SPECIALISED = `specialised` and SGLANG_MOE_TOPK_SORTED = `sorted` (nullptr: unset);
/// outputs poisoned with -7 (their padding columns included).
Routing route(
    TopkRowsParams params, const char* winners, const char* specialised = nullptr, const char* sorted = nullptr) {
  Routing out;
  out.weights.assign(params.num_tokens * params.weights_stride, -7.0f);
  out.ids.assign(params.num_tokens * params.ids_stride, -7);
  params.weights = out.weights.data();
  params.ids = out.ids.data();
  set_env("SGLANG_MOE_TOPK_WINNERS", winners);
  set_env("SGLANG_MOE_TOPK_SPECIALISED", specialised);
  set_env("SGLANG_MOE_TOPK_SORTED", sorted);
  moe_routing::launch_topk_rows<float>(params, DLDevice{kDLCUDA, 0});
  out.kernel = warp_emulation::last_kernel;
  set_env("SGLANG_MOE_TOPK_SPECIALISED", nullptr);
  set_env("SGLANG_MOE_TOPK_SORTED", nullptr);
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
/// spread whose exp(x - max) runs through the subnormals to 0, only -inf, ~1e4, quarter-grid ties;
/// with 11 rows or more, rows 9 and 10 hold near ties (one ulp apart, so keys equal in their high
/// bits: the sorted kernels' fallback) among the first two and at the 9th and 10th largest logits;
/// with 12 or more, row 11 is 1.0 plus 0..2047 ulps (keys a few packed-key blocks apart: both sides
/// of the sorted kernels' check).
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
  if (num_tokens >= 11) {
    for (int e = 0; e < num_experts; ++e) at(10, e) = std::min(at(10, e), 2.0f);
    at(9, 3 % num_experts) = 6.0f;
    at(9, 7 % num_experts) = std::nextafter(6.0f, 7.0f);
    for (int i = 0; i < 8; ++i) at(10, (5 * i + 1) % num_experts) = 10.0f + static_cast<float>(i);
    at(10, 2 % num_experts) = 3.0f;
    at(10, 9 % num_experts) = std::nextafter(3.0f, 4.0f);
  }
  if (num_tokens >= 12) {
    for (int e = 0; e < num_experts; ++e) at(11, e) = __uint_as_float(0x3F800000u + gen() % 2048u);
  }
  return buffer;
}

/// Routing rows of `num_experts` logits: contiguous, or (strided) at row stride num_experts + 3 from
/// element 1 of the buffer (misaligned: the scalar loads).
struct Rows {
  int stride;
  int offset;
  std::vector<float> buffer;
  const float* first() const { return buffer.data() + offset; }
};

Rows rows_of(int num_tokens, int num_experts, bool strided, uint32_t seed) {
  const int stride = strided ? num_experts + 3 : num_experts, offset = strided ? 1 : 0;
  return Rows{stride, offset, logits(num_tokens, num_experts, stride, offset, seed)};
}

/// The fields every case sets alike: `rows`, `bias`, k, outputs padded by `pad` (weights) and 2 * `pad`
/// (ids) columns; ungrouped, softmax, no softcap, scale 1 until the case says otherwise.
TopkRowsParams row_params(const Rows& rows, const float* bias, int num_tokens, int num_experts, int topk, int pad) {
  TopkRowsParams params{};
  params.gating = rows.first();
  params.bias = bias;
  params.num_tokens = num_tokens;
  params.gating_stride = rows.stride;
  params.weights_stride = topk + pad;
  params.ids_stride = topk + 2 * pad;
  params.num_experts = num_experts;
  params.topk = topk;
  params.num_groups = 1;
  params.group_size = num_experts;
  params.topk_group = 1;
  params.scale = 1.0f;
  return params;
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
  set_env("SGLANG_MOE_TOPK_GROUPED_SPECIALISED", nullptr);  // the grouped specialised kernels: the default
  int cases = 0, mismatches = 0, special_cases = 0, fallbacks = 0, sorted_cases = 0;
  std::vector<const void*> special_kernels;  // the distinct specialised kernels run
  const auto report = [&](const TopkRowsParams& params, const char* what, const char* against) {
    ++mismatches;
    std::printf(
        "mismatch: %s (%s) experts %d topk %d scoring %d bias %d softcap %g renormalize %d groups %d keep %d "
        "scale %g stride %lld\n",
        what,
        against,
        params.num_experts,
        params.topk,
        params.scoring,
        params.bias != nullptr,
        params.softcap,
        params.renormalize,
        params.num_groups,
        params.topk_group,
        params.scale,
        static_cast<long long>(params.gating_stride));
  };
  // The generic lookahead kernel (SGLANG_MOE_TOPK_SPECIALISED=0) against the register winners; the
  // default (specialised where one fits) against the generic one, and on the right kernel: its own
  // where k == 8, no grouping and scale 1 (every row here has <= 256 experts), the generic one
  // elsewhere; only "0" exactly deselects it, and SGLANG_MOE_TOPK_WINNERS=regs wins over it.
  const auto check = [&](const TopkRowsParams& params, const char* what) {
    ++cases;
    const Routing base = route(params, nullptr, "0");
    const Routing regs = route(params, "regs");
    if (!same_bits(regs, base)) report(params, what, "lookahead vs regs");
    const Routing special = route(params, nullptr);
    if (!same_bits(special, base)) report(params, what, "specialised vs lookahead");
    // the ungrouped specialised kernels: top-8, scale 1; the grouped ones: DeepSeek-V3's shape, any scale
    const bool fits = params.num_groups == 1 ? params.topk == 8 && params.scale == 1.0f
                                             : params.num_experts == 256 && params.num_groups == 8 &&
                                                   params.topk_group == 4 && params.topk == 8;
    if (params.num_groups > 1) {  // SGLANG_MOE_TOPK_GROUPED_SPECIALISED=0 (exactly): the generic one
      set_env("SGLANG_MOE_TOPK_GROUPED_SPECIALISED", "0");
      if (route(params, nullptr).kernel != base.kernel) report(params, what, "grouped kernels with the switch at 0");
      set_env("SGLANG_MOE_TOPK_GROUPED_SPECIALISED", "00");  // only "0" deselects them
      if ((route(params, nullptr).kernel != base.kernel) != fits) report(params, what, "grouped switch at 00");
      set_env("SGLANG_MOE_TOPK_GROUPED_SPECIALISED", nullptr);
    }
    if ((special.kernel != base.kernel) != fits) report(params, what, "specialised kernel choice");
    // SGLANG_MOE_TOPK_SORTED=1 (exactly): the sorted specialised kernels where one fits and the row
    // is 4 or 8 experts a lane (128 or 256), the same bits; "0" (exactly) never; unset (and any
    // other value) the default: grouped calls sorted, ungrouped ones below kSortedMinTokens rows not.
    const Routing sorted = route(params, nullptr, nullptr, "1");
    const Routing unsorted = route(params, nullptr, nullptr, "0");
    if (!same_bits(sorted, base)) report(params, what, "sorted vs lookahead");
    if (!same_bits(unsorted, base)) report(params, what, "unsorted vs lookahead");
    const bool sorted_fits = fits && (params.num_experts == 128 || params.num_experts == 256);
    if ((sorted.kernel != unsorted.kernel) != sorted_fits) report(params, what, "sorted kernel choice");
    if (sorted_fits) {
      ++sorted_cases;
      const bool by_default = params.num_groups > 1 || params.num_tokens >= moe_routing::kSortedMinTokens;
      if (special.kernel != (by_default ? sorted.kernel : unsorted.kernel)) {
        report(params, what, "sorted default");
      }
      if (route(params, nullptr, nullptr, "1 ").kernel != special.kernel ||
          route(params, nullptr, nullptr, "00").kernel != special.kernel) {
        report(params, what, "sorted knob: only exactly 1 / 0 select");
      }
    }
    if (fits) {
      ++special_cases;
      if (std::find(special_kernels.begin(), special_kernels.end(), special.kernel) == special_kernels.end()) {
        special_kernels.push_back(special.kernel);
      }
      if (route(params, nullptr, "0 ").kernel != special.kernel ||
          route(params, nullptr, "1").kernel != special.kernel) {
        report(params, what, "specialised knob: only exactly 0 deselects it");
      }
      if (route(params, "regs").kernel != regs.kernel) report(params, what, "specialised with regs");
    } else {
      ++fallbacks;
    }
  };

  // Softmax and sigmoid, every option, aligned rows and misaligned strided ones (the scalar loads).
  for (int num_experts : {8, 60, 64, 128, 160, 256}) {
    const std::vector<float> bias = bias_of(num_experts, 32, num_experts);
    for (int strided = 0; strided < 2; ++strided) {
      const Rows rows = rows_of(num_tokens, num_experts, strided != 0, 1234 + num_experts + strided);
      for (int topk : {1, 2, 4, 5, 8, 17, 32}) {
        if (topk > num_experts) continue;
        for (int scoring : {0, 1}) {
          for (int with_bias : {0, 1}) {
            for (float softcap : {0.0f, 2.5f}) {
              for (int renormalize : {0, 1}) {
                if (scoring == moe_routing::kSigmoid && softcap > 0.0f) continue;
                TopkRowsParams params =
                    row_params(rows, with_bias ? bias.data() : nullptr, num_tokens, num_experts, topk, 1);
                params.scoring = scoring;
                params.softcap = softcap;
                params.renorm_eps = scoring == moe_routing::kSigmoid ? 1e-20f : 0.0f;
                params.scale = topk == 8 && strided && renormalize ? 2.5f : 1.0f;  // 2.5: not specialised
                params.renormalize = renormalize != 0;
                check(params, "plain");
              }
            }
          }
        }
      }
    }
  }

  // Grouped (experts, groups, groups kept, topk): 1, 2, 4, 16 lanes per group; runs of 1, 2, 4, 8.
  // DeepSeek-V3's shape (the first) takes the grouped specialised kernels: also strided, misaligned
  // rows (the scalar loads) and scale 1; the near shapes after it (k 7, 3 groups kept) do not.
  const int shapes[][4] = {
      {256, 8, 4, 8},
      {256, 8, 4, 7},
      {256, 8, 3, 8},
      {256, 16, 4, 8},
      {64, 4, 2, 4},
      {64, 2, 1, 8},
      {8, 8, 8, 8},
      {128, 32, 4, 8},
      {160, 5, 2, 6}};
  for (const auto& shape : shapes) {
    const int num_experts = shape[0];
    const bool deepseek = num_experts == 256 && shape[1] == 8 && shape[2] == 4 && shape[3] == 8;
    const std::vector<float> bias = bias_of(num_experts, 8, 7 * num_experts);
    for (int strided = 0; strided < (deepseek ? 2 : 1); ++strided) {
      const Rows rows = rows_of(num_tokens, num_experts, strided != 0, 99 + num_experts + strided);
      for (float scale : deepseek ? std::vector<float>{2.5f, 1.0f} : std::vector<float>{2.5f}) {
        for (int with_bias : {0, 1}) {
          for (int renormalize : {0, 1}) {
            TopkRowsParams params =
                row_params(rows, with_bias ? bias.data() : nullptr, num_tokens, num_experts, shape[3], strided);
            params.num_groups = shape[1];
            params.group_size = num_experts / shape[1];
            params.topk_group = shape[2];
            params.scoring = moe_routing::kSigmoid;
            params.renorm_eps = 1e-20f;
            params.scale = scale;
            params.renormalize = renormalize != 0;
            check(params, "grouped");
          }
        }
      }
    }
  }
  std::printf("specialised: %d cases on %zu kernels, %d fallbacks\n", special_cases, special_kernels.size(), fallbacks);
  std::printf("sorted: %d cases\n", sorted_cases);
  std::printf("%d cases, %d mismatches\n", cases, mismatches);
  return mismatches != 0 ? 1 : 0;
}
