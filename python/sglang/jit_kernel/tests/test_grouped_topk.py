"""grouped_topk: fp64 reference of the grouped DeepSeek-V3 routing (group scores = top-2 sums, ties to
the lower group and expert), the DeepSeek-V3 / Kimi-like / small shapes, renormalize and scaling,
ties, NaN, empty, determinism, graphs, compile, errors."""

import pytest
import torch
from moe_reference import (
    assert_batch_invariant,
    assert_routing_matches,
    edge_rows,
    grid_logits,
    grouped_reference,
    resolve_grouped_ambiguity,
)

from sglang.jit_kernel.grouped_topk import grouped_topk
from sglang.jit_kernel.testing import FLOAT_DTYPES, requires_cuda
from sglang.jit_kernel.utils import get_ci_test_range
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=30, suite="stage-b-kernel-unit-1-gpu-large")
register_cuda_ci(est_time=120, suite="nightly-kernel-1-gpu", nightly=True)

# (num_experts, num_expert_group, topk_group, topk)
SHAPES = get_ci_test_range(
    full_range=[
        (256, 8, 4, 8),
        (384, 1, 1, 8),
        (160, 16, 2, 6),
        (64, 4, 2, 4),
        (257, 1, 1, 2),
        (96, 32, 3, 7),
        (2048, 16, 4, 8),
        (8, 8, 8, 8),
        (256, 8, 4, 40),
    ],
    ci_range=[(256, 8, 4, 8), (384, 1, 1, 8), (96, 32, 3, 7), (2048, 16, 4, 8), (256, 8, 4, 40)],
)
TOKENS = get_ci_test_range(full_range=[1, 7, 129, 8192], ci_range=[1, 129])
EPS = 1e-20


def check(scores, bias, groups, topk_group, topk, renormalize=True, factor=1.0):
    values, indices = grouped_topk(scores, bias, groups, topk_group, topk, renormalize, factor)
    assert values.shape == (scores.shape[0], topk) and values.dtype == torch.float32
    assert indices.shape == (scores.shape[0], topk) and indices.dtype == torch.int32
    keys, weights_all, ref_ids, ambiguous = grouped_reference(scores, bias, groups, topk_group, topk)
    # Rows whose kept groups are a near tie (frequent on the grid: top-2 sums such as s(a) + s(b) vs
    # 2 s((a + b) / 2) differ by ~4e-6) are checked against the kept-group set the kernel agrees with.
    keys, ref_ids = resolve_grouped_ambiguity(scores, bias, groups, topk_group, topk, indices, keys, ref_ids, ambiguous)
    assert_routing_matches(values, indices, keys, weights_all, ref_ids, renormalize, eps=EPS, scale=factor)
    return values, indices


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("with_bias", [False, True])
def test_grouped_topk_grid(dtype, shape, num_tokens, with_bias):
    num_experts, groups, topk_group, topk = shape
    scores = grid_logits(num_tokens, num_experts, dtype, seed=num_experts + topk)
    bias = torch.randint(-8, 8, (num_experts,), device="cuda").float() / 8 if with_bias else None
    check(scores, bias, groups, topk_group, topk)


@requires_cuda
@pytest.mark.parametrize("renormalize,factor", [(False, 1.0), (True, 2.5), (False, 2.5)])
def test_grouped_topk_deepseek_v3(renormalize, factor):
    """256 experts, 8 groups, topk_group 4, top 8, randn logits and an fp32 bias."""
    scores = torch.randn(4096, 256, device="cuda")
    bias = torch.randn(256, device="cuda") * 0.1
    values, indices = check(scores, bias, 8, 4, 8, renormalize, factor)
    groups_used = (indices.long() // 32).sort(dim=-1).values
    assert ((groups_used[:, 1:] != groups_used[:, :-1]).sum(dim=-1) <= 3).all(), "more than 4 groups used"


@requires_cuda
def test_grouped_topk_ties_go_to_the_lower_group_and_expert():
    scores = torch.zeros(2, 64, device="cuda")
    scores[1, 48:] = 1.0  # group 3 of 4 is best, then groups 0..2 tie
    values, indices = check(scores, None, 4, 2, 3)
    assert indices[0].tolist() == [0, 1, 2]
    assert indices[1].tolist() == [48, 49, 50]


@requires_cuda
def test_grouped_topk_nan_empty_deterministic_graph_compile():
    scores = torch.randn(4096, 256, dtype=torch.bfloat16, device="cuda")
    scores[3, :] = float("nan")
    bias = torch.randn(256, device="cuda") * 0.1
    first = grouped_topk(scores, bias, 8, 4, 8, True, 2.5)
    again = grouped_topk(scores, bias, 8, 4, 8, True, 2.5)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    check(scores, bias, 8, 4, 8, True, 2.5)

    empty = grouped_topk(torch.empty(0, 256, device="cuda"), None, 8, 4, 8, True)
    assert empty[0].shape == (0, 8) and empty[1].shape == (0, 8)

    grouped_topk(scores, bias, 8, 4, 8, True, 2.5)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = grouped_topk(scores, bias, 8, 4, 8, True, 2.5)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out[0], first[0]) and torch.equal(out[1], first[1])

    torch._dynamo.reset()
    compiled = torch.compile(lambda s, b: grouped_topk(s, b, 8, 4, 8, True, 2.5), fullgraph=True)
    out = compiled(scores, bias)
    assert torch.equal(out[0], first[0]) and torch.equal(out[1], first[1])


# ---- errors (raised before any launch) ----
def test_grouped_topk_cpu_input():
    with pytest.raises(RuntimeError, match=r"^grouped_topk: scores device: expected a CUDA device, got cpu$"):
        grouped_topk(torch.randn(2, 8), None, 2, 1, 2, True)


@requires_cuda
def test_grouped_topk_bad_arguments():
    s = torch.randn(4, 256, device="cuda")
    cases = [
        (
            (s, None, 7, 1, 8, True),
            ValueError,
            r"num_expert_group value: expected a divisor of num_experts = 256, got 7",
        ),
        ((s, None, 64, 1, 8, True), ValueError, r"num_expert_group value: expected >= 1 and <= 32, got 64"),
        ((s, None, 8, 9, 8, True), ValueError, r"topk_group value: expected >= 1 and <= 8, got 9"),
        (
            (s, None, 8, 1, 33, True),
            ValueError,
            r"topk value: expected <= topk_group \* group_size = 1 \* 32 = 32, got 33",
        ),
        ((s, None, 8, 4, 0, True), ValueError, r"topk value: expected >= 1, got 0"),
        ((s, None, 8.0, 4, 8, True), TypeError, r"num_expert_group type: expected an int, got float"),
        ((s, None, 8, 4, 8, 1), TypeError, r"renormalize type: expected a bool, got int"),
        (
            (s, None, 8, 4, 8, True, float("inf")),
            ValueError,
            r"scaling_factor value: expected a finite number, got inf",
        ),
        (
            (s, None, 8, 4, 8, True, 1e39),  # finite as a double, inf as the kernel's float32
            ValueError,
            r"scaling_factor value: expected a magnitude of at most 3.4028235e\+38 \(float32\), got 1e\+39",
        ),
        (
            (s, torch.zeros(255, device="cuda"), 8, 4, 8, True),
            RuntimeError,
            r"bias shape: expected \[num_experts=256\], got \(255,\)",
        ),
        (
            (s.double(), None, 8, 4, 8, True),
            RuntimeError,
            r"scores dtype: expected one of float16, bfloat16, float32, got float64",
        ),
        ((s[:, ::2], None, 8, 4, 8, True), RuntimeError, r"scores last-dim stride: expected 1"),
    ]
    for args, error, message in cases:
        with pytest.raises(error, match=r"^grouped_topk: " + message):
            grouped_topk(*args)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))


@requires_cuda
@pytest.mark.parametrize("groups,num_experts,topk,factor", [(1, 128, 4, 2.5), (1, 256, 8, 1.0), (8, 256, 8, 2.5)])
def test_grouped_topk_batch_invariant(groups, num_experts, topk, factor):
    """A row gets the same bits alone and in a batch of 4096 (one group routes as topk_sigmoid: the
    several-rows kernel at 128 experts, the sorted kernels at top-8 and scale 1), fp32 grid and edge rows."""
    bias = torch.randint(-8, 8, (num_experts,), device="cuda").float() / 8
    rows = torch.cat([grid_logits(64, num_experts, torch.float32, seed=3), edge_rows(64, num_experts, torch.float32)])
    keep = max(1, groups // 2)
    assert_batch_invariant(lambda g: grouped_topk(g, bias, groups, keep, topk, True, factor), rows, 4096)
