"""topk_softmax: fp64 reference (ties to the lower index), the issue's expert/top-k/token grid,
softcap, bias, renormalize, ties, NaN, strided and poisoned outputs, empty, determinism, graphs,
compile, second GPU, errors."""

import pytest
import torch
from moe_reference import (
    assert_batch_invariant,
    assert_routing_matches,
    edge_rows,
    grid_logits,
    softmax_reference,
)

from sglang.jit_kernel.moe_topk_softmax import topk_softmax
from sglang.jit_kernel.testing import FLOAT_DTYPES, poisoned, requires_cuda, requires_two_gpus
from sglang.jit_kernel.utils import get_ci_test_range
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=60, suite="stage-b-kernel-unit-1-gpu-large")
register_cuda_ci(est_time=300, suite="nightly-kernel-1-gpu", nightly=True)

EXPERTS = get_ci_test_range(
    full_range=[8, 60, 64, 128, 160, 256, 257, 384, 512, 1024, 1500],
    ci_range=[8, 60, 256, 257, 1024, 1500],
)
TOPKS = get_ci_test_range(full_range=[1, 2, 6, 8], ci_range=[1, 8])
TOKENS = get_ci_test_range(full_range=[1, 7, 129, 8192], ci_range=[1, 129])


def run(gating, k, renormalize=False, softcap=0.0, bias=None):
    t = gating.shape[0]
    weights = poisoned((t, k), torch.float32)
    ids = poisoned((t, k), torch.int32)
    topk_softmax(weights, ids, gating, renormalize=renormalize, moe_softcapping=softcap, correction_bias=bias)
    return weights, ids


def check(gating, k, renormalize=False, softcap=0.0, bias=None):
    weights, ids = run(gating, k, renormalize, softcap, bias)
    keys, weights_all, ref_ids = softmax_reference(gating, k, renormalize, softcap, bias)
    assert_routing_matches(weights, ids, keys, weights_all, ref_ids, renormalize, eps=0.0)
    return weights, ids


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("num_experts", EXPERTS)
@pytest.mark.parametrize("topk", TOPKS)
@pytest.mark.parametrize("num_tokens", TOKENS)
def test_topk_softmax_grid(dtype, num_experts, topk, num_tokens):
    gating = grid_logits(num_tokens, num_experts, dtype, seed=num_experts * 31 + topk)
    check(gating, min(topk, num_experts))


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("num_experts", get_ci_test_range(full_range=[64, 256, 384, 2048], ci_range=[256, 2048]))
@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("softcap", get_ci_test_range(full_range=[0.0, 30.0, 2.5], ci_range=[0.0, 2.5]))
@pytest.mark.parametrize("with_bias", [False, True])
def test_topk_softmax_options(dtype, num_experts, renormalize, softcap, with_bias):
    gating = grid_logits(257, num_experts, dtype, seed=num_experts)
    bias = (torch.randint(-32, 32, (num_experts,), device="cuda").float() / 32) if with_bias else None
    check(gating, 8, renormalize, softcap, bias)


@requires_cuda
def test_topk_softmax_random_logits_near_ties_only():
    """randn logits (no grid): any row differing from fp64 must be a near tie."""
    gating = torch.randn(8192, 256, device="cuda")
    check(gating, 8, renormalize=True)


@requires_cuda
@pytest.mark.parametrize("num_experts,topk", [(160, 33), (160, 64), (64, 64), (257, 257), (2048, 40)])
def test_topk_softmax_large_topk(num_experts, topk):
    """topk beyond one warp (written in passes) and topk == num_experts."""
    gating = grid_logits(129, num_experts, torch.float32, seed=topk)
    for renormalize in (False, True):
        check(gating, topk, renormalize)


@requires_cuda
@pytest.mark.parametrize("num_experts", [8, 128, 257, 1500])
def test_topk_softmax_ties_go_to_the_lower_index(num_experts):
    gating = torch.zeros(3, num_experts, device="cuda")
    gating[1, num_experts // 2 :] = 1.0  # the upper half ties at the top
    gating[2, ::3] = 2.0  # every third expert ties at the top
    weights, ids = check(gating, 4)
    assert ids[0].tolist() == [0, 1, 2, 3]
    assert ids[1].tolist() == [num_experts // 2 + i for i in range(4)]
    thirds = list(range(0, num_experts, 3))  # the tied top, then the zeros from the lowest index
    assert ids[2].tolist() == (thirds + [e for e in range(num_experts) if e % 3 != 0])[:4]
    assert torch.equal(weights[0], torch.full((4,), 1.0 / num_experts, device="cuda"))


@requires_cuda
def test_topk_softmax_nan_logits_are_read_as_minus_inf():
    gating = torch.randn(3, 64, device="cuda")
    gating[0, 5] = float("nan")
    gating[1, :] = float("nan")  # all -inf: NaN probabilities, experts 0..k-1
    gating[2, :62] = float("nan")  # only 62, 63 finite
    weights, ids = run(gating, 4)
    keys, weights_all, ref_ids = softmax_reference(gating, 4)
    assert torch.equal(ids.long().cpu(), ref_ids.cpu())
    assert 5 not in ids[0].tolist()
    assert ids[1].tolist() == [0, 1, 2, 3] and torch.isnan(weights[1]).all()
    assert ids[2, :2].sort().values.tolist() == [62, 63] and ids[2, 2:].tolist() == [0, 1]
    assert torch.equal(weights[2, 2:], torch.zeros(2, device="cuda"))


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_topk_softmax_strided_views_and_poison(dtype):
    """gating a column slice of a wider buffer; outputs row-strided views inside poisoned buffers."""
    t, e, k = 129, 256, 8
    wide = grid_logits(t, e + 40, dtype)
    gating = wide[:, 24 : 24 + e]
    weights_buffer = poisoned((t, k + 5), torch.float32)
    ids_buffer = poisoned((t, k + 7), torch.int32)
    weights, ids = weights_buffer[:, 2 : 2 + k], ids_buffer[:, 3 : 3 + k]
    topk_softmax(weights, ids, gating, renormalize=True)
    keys, weights_all, ref_ids = softmax_reference(gating, k)
    assert_routing_matches(weights, ids, keys, weights_all, ref_ids, True, eps=0.0)
    assert torch.isnan(weights_buffer[:, :2]).all() and torch.isnan(weights_buffer[:, 2 + k :]).all()
    sentinel = poisoned((1,), torch.int32)[0]
    assert (ids_buffer[:, :3] == sentinel).all() and (ids_buffer[:, 3 + k :] == sentinel).all()


@requires_cuda
def test_topk_softmax_top_1_outputs_with_a_free_unit_stride():
    """topk = 1 outputs as [num_tokens, 1] views of a [1, num_tokens] row (last stride num_tokens,
    which addresses nothing): taken on every call, with the reference's choice."""
    t, e = 33, 64
    gating = grid_logits(t, e, torch.float32)
    keys, weights_all, ref_ids = softmax_reference(gating, 1)
    for _ in range(2):
        weights = poisoned((1, t), torch.float32).t()
        ids = poisoned((1, t), torch.int32).t()
        topk_softmax(weights, ids, gating)
        assert_routing_matches(weights, ids, keys, weights_all, ref_ids, False, eps=0.0)


@requires_cuda
def test_topk_softmax_empty():
    gating = torch.empty(0, 256, device="cuda")
    weights = torch.empty(0, 8, device="cuda")
    ids = torch.empty(0, 8, dtype=torch.int32, device="cuda")
    assert topk_softmax(weights, ids, gating) is None


@requires_cuda
def test_topk_softmax_deterministic():
    gating = torch.randn(8192, 256, dtype=torch.bfloat16, device="cuda")
    first = run(gating, 8, renormalize=True)
    for _ in range(3):
        again = run(gating, 8, renormalize=True)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


@requires_cuda
def test_topk_softmax_cuda_graph():
    gating = grid_logits(64, 128, torch.float32)
    weights = poisoned((64, 8), torch.float32)
    ids = poisoned((64, 8), torch.int32)
    topk_softmax(weights, ids, gating)  # load outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        topk_softmax(weights, ids, gating, renormalize=True)
    gating.copy_(grid_logits(64, 128, torch.float32, seed=7))
    weights.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    keys, weights_all, ref_ids = softmax_reference(gating, 8)
    assert_routing_matches(weights, ids, keys, weights_all, ref_ids, True, eps=0.0)


@requires_cuda
def test_topk_softmax_torch_compile_fullgraph():
    torch._dynamo.reset()

    def f(logits):
        weights = torch.empty(logits.shape[0], 8, dtype=torch.float32, device=logits.device)
        ids = torch.empty(logits.shape[0], 8, dtype=torch.int32, device=logits.device)
        topk_softmax(weights, ids, logits * 2, renormalize=True, moe_softcapping=30.0)
        return weights * 1, ids

    gating = grid_logits(33, 256, torch.bfloat16)
    weights, ids = torch.compile(f, fullgraph=True)(gating)
    keys, weights_all, ref_ids = softmax_reference(gating * 2, 8, softcap=30.0)
    assert_routing_matches(weights, ids, keys, weights_all, ref_ids, True, eps=0.0)


@requires_two_gpus
def test_topk_softmax_on_second_gpu():
    torch.cuda.set_device(0)
    gating = grid_logits(65, 256, torch.float32).to("cuda:1")
    weights = torch.empty(65, 8, device="cuda:1")
    ids = torch.empty(65, 8, dtype=torch.int32, device="cuda:1")
    topk_softmax(weights, ids, gating)
    keys, weights_all, ref_ids = softmax_reference(gating, 8)
    assert_routing_matches(weights, ids, keys, weights_all, ref_ids, False, eps=0.0)


# ---- errors (raised before any launch) ----
def test_topk_softmax_cpu_input():
    with pytest.raises(RuntimeError, match=r"^topk_softmax: gating_output device: expected a CUDA device, got cpu$"):
        topk_softmax(torch.empty(2, 8), torch.empty(2, 2, dtype=torch.int32), torch.randn(2, 8))


def test_topk_softmax_not_a_tensor():
    with pytest.raises(TypeError, match=r"^topk_softmax: gating_output type: expected a torch.Tensor, got list$"):
        topk_softmax(torch.empty(2, 8), torch.empty(2, 2, dtype=torch.int32), [[1.0]])


@requires_cuda
def test_topk_softmax_bad_arguments():
    g = torch.randn(4, 16, device="cuda")
    w = torch.empty(4, 2, device="cuda")
    i = torch.empty(4, 2, dtype=torch.int32, device="cuda")
    cases = [
        (
            (torch.empty(4, 17, device="cuda"), torch.empty(4, 17, dtype=torch.int32, device="cuda"), g),
            {},
            RuntimeError,
            r"topk_weights shape: expected \[num_tokens=4, topk in \[1, num_experts=16\]\], got \(4, 17\)",
        ),
        (
            (w, torch.empty(4, 2, dtype=torch.int64, device="cuda"), g),
            {},
            RuntimeError,
            r"topk_ids dtype: expected int32, got int64",
        ),
        ((w.half(), i, g), {}, RuntimeError, r"topk_weights dtype: expected float32, got float16"),
        ((w, i, g.double()), {}, RuntimeError, r"gating_output dtype: expected one of float16, bfloat16, float32"),
        ((w, i, g[:3]), {}, RuntimeError, r"topk_weights shape: expected \[num_tokens=3, topk\], got \(4, 2\)"),
        ((w, i[:, :1], g), {}, RuntimeError, r"topk_ids shape: expected \[num_tokens=4, topk=2\], got \(4, 1\)"),
        ((w, i, g.t().contiguous().t()), {}, RuntimeError, r"gating_output last-dim stride: expected 1"),
        ((w, i, g[:, 0]), {}, RuntimeError, r"gating_output shape: expected \[num_tokens, num_experts\], got \(4,\)"),
        (
            (w, i, g),
            {"correction_bias": torch.zeros(15, device="cuda")},
            RuntimeError,
            r"correction_bias shape: expected \[num_experts=16\], got \(15,\)",
        ),
        (
            (w, i, g),
            {"correction_bias": torch.zeros(16)},
            RuntimeError,
            r"correction_bias device: expected a CUDA device, got cpu",
        ),
        ((w, i, g), {"moe_softcapping": -1.0}, ValueError, r"moe_softcapping value: expected >= 0.0, got -1.0"),
        ((w, i, g), {"moe_softcapping": float("nan")}, ValueError, r"moe_softcapping value"),
        # inf (or past float32) would give every weight inf * tanh(0) = NaN
        ((w, i, g), {"moe_softcapping": float("inf")}, ValueError, r"moe_softcapping value: expected a finite number"),
        ((w, i, g), {"moe_softcapping": 1e39}, ValueError, r"moe_softcapping value: expected a magnitude"),
        ((w, i, g), {"renormalize": 1}, TypeError, r"renormalize type: expected a bool, got int"),
        ((g[:, :2], i, g), {}, RuntimeError, r"(topk_weights dtype|topk_weights overlaps)"),
    ]
    for args, kwargs, error, message in cases:
        before = [t.clone() for t in args]
        with pytest.raises(error, match=r"^topk_softmax: " + message):
            topk_softmax(*args, **kwargs)
        assert all(torch.equal(a, b) or a.isnan().any() for a, b in zip(args, before))


@requires_cuda
def test_topk_softmax_overlapping_outputs_rejected():
    g = torch.randn(4, 16, device="cuda")
    buffer = torch.empty(4, 4, dtype=torch.float32, device="cuda")
    with pytest.raises(RuntimeError, match=r"^topk_softmax: topk_weights overlaps topk_ids: expected disjoint memory"):
        topk_softmax(buffer[:, :2], buffer[:, 1:3].view(torch.int32), g)


@requires_cuda
def test_topk_softmax_ffi_rejects_mismatch_from_cpp():
    """The C++ checks are the second line: calling the module directly with bad tensors raises
    RuntimeError naming the tensor, never a CUDA fault."""
    from sglang.jit_kernel._moe import no_bias, routing_engine
    from sglang.jit_kernel.moe_topk_softmax import _jit_topk_softmax_module

    module = _jit_topk_softmax_module(torch.float32, routing_engine(16, 2, 1))  # the module of 16 experts
    g = torch.randn(4, 16, device="cuda")
    w = torch.empty(4, 17, device="cuda")
    i = torch.empty(4, 17, dtype=torch.int32, device="cuda")
    with pytest.raises(RuntimeError, match="topk"):
        module.topk_softmax(w, i, g, no_bias(g.device), False, 0.0)
    with pytest.raises(RuntimeError, match="correction_bias"):
        module.topk_softmax(w[:, :2], i[:, :2], g, torch.zeros(3, device="cuda"), False, 0.0)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("num_experts", [128, 256])
@pytest.mark.parametrize("topk", [4, 8])
@pytest.mark.parametrize("options", [(False, 0.0, False), (True, 2.5, True)])
def test_topk_softmax_batch_invariant(dtype, num_experts, topk, options):
    """A row gets the same bits alone and in a batch of 4096 (the sorted kernels at top-8, the
    several-rows kernel for fp32 rows of 128 experts below top-8): grid logits (ties, also against
    the reference), edge rows (NaN, +-inf, all ties, -0, exp underflow) and randn filler rows."""
    renormalize, softcap, with_bias = options
    bias = (torch.randint(-32, 32, (num_experts,), device="cuda").float() / 32) if with_bias else None
    rows = torch.cat([grid_logits(64, num_experts, dtype, seed=num_experts), edge_rows(64, num_experts, dtype)])
    check(rows[:64], topk, renormalize, softcap, bias)  # the grid rows against the reference
    assert_batch_invariant(lambda g: run(g, topk, renormalize, softcap, bias), rows, 4096)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))
