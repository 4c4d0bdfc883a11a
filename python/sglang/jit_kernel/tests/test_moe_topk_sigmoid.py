"""topk_sigmoid: fp64 reference (choice on sigmoid + bias, un-biased weights, ties to the lower
index), the issue's grid, bias, renormalize (+1e-20), ties, NaN, strided outputs, empty,
determinism, graphs, compile, errors."""

import pytest
import torch
from moe_reference import (
    assert_batch_invariant,
    assert_routing_matches,
    edge_rows,
    grid_logits,
    sigmoid_reference,
)

from sglang.jit_kernel.moe_topk_sigmoid import topk_sigmoid
from sglang.jit_kernel.testing import FLOAT_DTYPES, poisoned, requires_cuda
from sglang.jit_kernel.utils import get_ci_test_range
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=45, suite="stage-b-kernel-unit-1-gpu-large")
register_cuda_ci(est_time=240, suite="nightly-kernel-1-gpu", nightly=True)

EXPERTS = get_ci_test_range(
    full_range=[8, 60, 64, 128, 160, 256, 257, 384, 512, 1024, 1500],
    ci_range=[8, 128, 257, 384, 1500],
)
TOPKS = get_ci_test_range(full_range=[1, 2, 6, 8], ci_range=[1, 8])
TOKENS = get_ci_test_range(full_range=[1, 7, 129, 8192], ci_range=[1, 129])
EPS = 1e-20


def run(gating, k, renormalize=False, bias=None):
    t = gating.shape[0]
    weights = poisoned((t, k), torch.float32)
    ids = poisoned((t, k), torch.int32)
    topk_sigmoid(weights, ids, gating, renormalize=renormalize, correction_bias=bias)
    return weights, ids


def check(gating, k, renormalize=False, bias=None):
    weights, ids = run(gating, k, renormalize, bias)
    keys, weights_all, ref_ids = sigmoid_reference(gating, k, renormalize, bias)
    assert_routing_matches(weights, ids, keys, weights_all, ref_ids, renormalize, eps=EPS)
    return weights, ids


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("num_experts", EXPERTS)
@pytest.mark.parametrize("topk", TOPKS)
@pytest.mark.parametrize("num_tokens", TOKENS)
def test_topk_sigmoid_grid(dtype, num_experts, topk, num_tokens):
    gating = grid_logits(num_tokens, num_experts, dtype, seed=num_experts * 17 + topk)
    check(gating, min(topk, num_experts))


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("num_experts", get_ci_test_range(full_range=[64, 256, 384, 2048], ci_range=[256, 2048]))
@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("bias_dtype", [None, torch.float32, torch.bfloat16])
def test_topk_sigmoid_bias_and_renormalize(dtype, num_experts, renormalize, bias_dtype):
    """The choice is on sigmoid + bias, the weights un-biased (a bias in another dtype is used as fp32)."""
    gating = grid_logits(257, num_experts, dtype, seed=num_experts)
    bias = None if bias_dtype is None else (torch.randn(num_experts, device="cuda") * 0.1).to(bias_dtype)
    check(gating, 8, renormalize, bias)


@requires_cuda
def test_topk_sigmoid_bias_changes_the_choice_not_the_weight():
    gating = torch.zeros(1, 16, device="cuda")
    gating[0, 3] = 4.0
    bias = torch.zeros(16, device="cuda")
    bias[9] = 2.0
    weights, ids = run(gating, 2, bias=bias)
    assert ids[0].tolist() == [9, 3]
    torch.testing.assert_close(weights[0].cpu(), torch.tensor([0.5, 1 / (1 + torch.exp(torch.tensor(-4.0)).item())]))


@requires_cuda
@pytest.mark.parametrize("num_experts,topk", [(160, 33), (64, 64), (2048, 40)])
def test_topk_sigmoid_large_topk(num_experts, topk):
    gating = grid_logits(129, num_experts, torch.float32, seed=topk)
    for renormalize in (False, True):
        check(gating, topk, renormalize)


@requires_cuda
def test_topk_sigmoid_ties_and_nan():
    gating = torch.zeros(3, 40, device="cuda")
    gating[1, 20:] = 1.0
    gating[2, :] = float("nan")  # read as -inf: every p is 0, experts 0..k-1, weights 0
    weights, ids = check(gating, 3, renormalize=True)
    assert ids[0].tolist() == [0, 1, 2] and ids[1].tolist() == [20, 21, 22] and ids[2].tolist() == [0, 1, 2]
    assert torch.equal(weights[2], torch.zeros(3, device="cuda"))
    torch.testing.assert_close(weights[0], torch.full((3,), 1 / 3, device="cuda"))


@requires_cuda
def test_topk_sigmoid_strided_and_empty():
    wide = grid_logits(129, 300, torch.bfloat16)
    gating = wide[:, 7:263]
    weights_buffer = poisoned((129, 12), torch.float32)
    ids_buffer = poisoned((129, 12), torch.int32)
    weights, ids = weights_buffer[:, 1:9], ids_buffer[:, 4:12]
    topk_sigmoid(weights, ids, gating, renormalize=True)
    keys, weights_all, ref_ids = sigmoid_reference(gating, 8)
    assert_routing_matches(weights, ids, keys, weights_all, ref_ids, True, eps=EPS)
    assert torch.isnan(weights_buffer[:, 0]).all() and torch.isnan(weights_buffer[:, 9:]).all()
    assert (ids_buffer[:, :4] == poisoned((1,), torch.int32)[0]).all()
    topk_sigmoid(
        torch.empty(0, 8, device="cuda"),
        torch.empty(0, 8, dtype=torch.int32, device="cuda"),
        torch.empty(0, 256, device="cuda"),
    )


@requires_cuda
def test_topk_sigmoid_deterministic_graph_and_compile():
    gating = torch.randn(4096, 256, device="cuda")
    bias = torch.randn(256, device="cuda") * 0.05
    first = run(gating, 8, True, bias)
    again = run(gating, 8, True, bias)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])

    weights = poisoned((4096, 8), torch.float32)
    ids = poisoned((4096, 8), torch.int32)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        topk_sigmoid(weights, ids, gating, renormalize=True, correction_bias=bias)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(weights, first[0]) and torch.equal(ids, first[1])

    torch._dynamo.reset()

    def f(x, b):
        w = torch.empty(x.shape[0], 8, device=x.device)
        i = torch.empty(x.shape[0], 8, dtype=torch.int32, device=x.device)
        topk_sigmoid(w, i, x, renormalize=True, correction_bias=b)
        return w, i

    w, i = torch.compile(f, fullgraph=True)(gating, bias)
    assert torch.equal(w, first[0]) and torch.equal(i, first[1])


# ---- errors (raised before any launch) ----
def test_topk_sigmoid_cpu_input():
    with pytest.raises(RuntimeError, match=r"^topk_sigmoid: gating_output device: expected a CUDA device, got cpu$"):
        topk_sigmoid(torch.empty(2, 2), torch.empty(2, 2, dtype=torch.int32), torch.randn(2, 8))


@requires_cuda
def test_topk_sigmoid_bad_arguments():
    g = torch.randn(4, 16, device="cuda")
    w = torch.empty(4, 2, device="cuda")
    i = torch.empty(4, 2, dtype=torch.int32, device="cuda")
    with pytest.raises(
        RuntimeError, match=r"^topk_sigmoid: correction_bias shape: expected \[num_experts=16\], got \(32,\)$"
    ):
        topk_sigmoid(w, i, g, correction_bias=torch.zeros(32, device="cuda"))
    with pytest.raises(
        RuntimeError,
        match=r"^topk_sigmoid: topk_weights shape: expected \[num_tokens=4, topk in \[1, num_experts=16\]\]",
    ):
        topk_sigmoid(torch.empty(4, 17, device="cuda"), torch.empty(4, 17, dtype=torch.int32, device="cuda"), g)
    with pytest.raises(RuntimeError, match=r"^topk_sigmoid: topk_ids dtype: expected int32, got float32$"):
        topk_sigmoid(w, w.clone(), g)
    with pytest.raises(TypeError, match=r"^topk_sigmoid: renormalize type: expected a bool, got NoneType$"):
        topk_sigmoid(w, i, g, renormalize=None)
    with pytest.raises(
        RuntimeError,
        match=r"^topk_sigmoid: correction_bias dtype: expected one of float16, bfloat16, float32, got int64$",
    ):
        topk_sigmoid(w, i, g, correction_bias=torch.zeros(16, dtype=torch.int64, device="cuda"))


@requires_cuda
def test_sigmoid_run_bits_exhaustive():
    """topk_rows.cuh's branch-free sigmoid (sigmoid_run, the lookahead kernels' scores) against the
    division form, bit for bit, for every float logit (NaN read as -inf), and its reciprocal against
    1.0f / d for every float d in [1, 2^125]: 2^32 + ~1.05e9 values on the device."""
    from pathlib import Path

    from sglang.jit_kernel.utils import load_jit

    source = Path(__file__).resolve().parent / "topk_rows_device" / "sigmoid_check.cuh"
    module = load_jit("topk_rows_sigmoid_check", cuda_files=[str(source)], cuda_wrappers=[("check", "sigmoid_check")])
    counts = torch.zeros(2, dtype=torch.int64, device="cuda")
    module.check(counts)
    reciprocal_mismatches, sigmoid_mismatches = counts.tolist()
    assert (reciprocal_mismatches, sigmoid_mismatches) == (0, 0)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("num_experts", [128, 256])
@pytest.mark.parametrize("topk", [4, 8])
@pytest.mark.parametrize("options", [(False, False), (True, True)])
def test_topk_sigmoid_batch_invariant(dtype, num_experts, topk, options):
    """A row gets the same bits alone and in a batch of 4096 (the sorted kernels at top-8, the
    several-rows kernel for fp32 rows of 128 experts below top-8), on grid and edge rows."""
    renormalize, with_bias = options
    bias = (torch.randint(-32, 32, (num_experts,), device="cuda").float() / 32) if with_bias else None
    rows = torch.cat([grid_logits(64, num_experts, dtype, seed=num_experts), edge_rows(64, num_experts, dtype)])
    check(rows[:64], topk, renormalize, bias)  # the grid rows against the reference
    assert_batch_invariant(lambda g: run(g, topk, renormalize, bias), rows, 4096)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))
