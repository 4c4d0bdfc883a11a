"""moe_sum_reduce: fp64 reference (within the fp32-summation bound) and the documented fp32 order
bit for bit, k in {1, 2, 8, 9}, awkward hidden sizes, strided and unaligned views, poisoned outputs,
empty, determinism, graphs, compile, errors."""

import pytest
import torch

from sglang.jit_kernel.moe_sum_reduce import moe_sum_reduce
from sglang.jit_kernel.testing import FLOAT_DTYPES, TOLERANCE, poisoned, requires_cuda
from sglang.jit_kernel.utils import get_ci_test_range
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=30, suite="stage-b-kernel-unit-1-gpu-large")
register_cuda_ci(est_time=90, suite="nightly-kernel-1-gpu", nightly=True)

TOKENS = get_ci_test_range(full_range=[1, 7, 129, 4097], ci_range=[1, 129])
HIDDEN = get_ci_test_range(full_range=[1, 7, 8, 129, 2048, 4096, 7168], ci_range=[7, 4096])


def assert_matches_reference(out: torch.Tensor, x: torch.Tensor, factor: float) -> None:
    """out against the fp64 reference within the output dtype's tolerance plus the error bound of the
    kernel's fp32 sum, k * 2^-24 * |factor| * sum_k |x| (under cancellation that exceeds an fp32 ulp
    of the result: 8 randn terms summing to ~0.03 are off by ~1e-6), and bit-equal to the documented
    computation: the fp32 sum in order k = 0, 1, ..., times fp32(factor), rounded once."""
    f = float(torch.tensor(factor, dtype=torch.float32))
    expected = x.double().sum(dim=1) * f
    rtol, atol = TOLERANCE[out.dtype]
    bound = rtol * expected.abs() + atol + x.shape[1] * 2.0**-24 * abs(f) * x.double().abs().sum(dim=1)
    excess = (out.double() - expected).abs() - bound
    assert not bool(torch.isnan(out).any()) and bool((excess <= 0).all()), (
        f"{int((excess > 0).sum())} elements beyond the fp32-summation bound, worst by {float(excess.max()):.3g}"
    )
    documented = torch.zeros(x.shape[0], x.shape[2], dtype=torch.float32, device=x.device)
    for k in range(x.shape[1]):
        documented = documented + x[:, k].float()
    assert torch.equal(out, (documented * torch.tensor(f, dtype=torch.float32, device=x.device)).to(out.dtype))


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("topk", [1, 2, 8, 9])
@pytest.mark.parametrize("hidden_size", HIDDEN)
def test_moe_sum_reduce_values(dtype, num_tokens, topk, hidden_size):
    x = torch.randn(num_tokens, topk, hidden_size, dtype=dtype, device="cuda")
    out = poisoned((num_tokens, hidden_size), dtype)
    moe_sum_reduce(x, out, 2.5)
    assert_matches_reference(out, x, 2.5)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("offset", [0, 1, 3])
def test_moe_sum_reduce_strided_and_unaligned(dtype, offset):
    """input a slice of a wider [T, k + 2, H + 5] buffer, output a row-strided view at an element offset."""
    t, k, h = 65, 8, 1024
    wide = torch.randn(t, k + 2, h + 5, dtype=dtype, device="cuda")
    x = wide[:, 1 : 1 + k, offset : offset + h]
    buffer = poisoned((t, h + 16), dtype)
    out = buffer[:, offset : offset + h]
    moe_sum_reduce(x, out, 1.0)
    assert_matches_reference(out, x, 1.0)
    assert torch.isnan(buffer[:, :offset]).all() and torch.isnan(buffer[:, offset + h :]).all()


@requires_cuda
def test_moe_sum_reduce_hidden_size_1_with_free_unit_strides():
    """hidden_size 1: the size-1 dims' strides address nothing, torch leaves them free (here 5 and
    7); both calls run (checked path first, then the loaded module's) with the reference's bits."""
    t, k = 33, 4
    x = torch.randn(t, k, 1, device="cuda").as_strided((t, k, 1), (k, 1, 5))
    for _ in range(2):
        out = poisoned((t, 1), torch.float32).as_strided((t, 1), (1, 7))
        moe_sum_reduce(x, out, 1.5)
        assert_matches_reference(out, x, 1.5)


@requires_cuda
def test_moe_sum_reduce_empty_and_zero_topk():
    moe_sum_reduce(torch.empty(0, 8, 64, device="cuda"), torch.empty(0, 64, device="cuda"))
    out = poisoned((3, 64), torch.float32)
    moe_sum_reduce(torch.empty(3, 0, 64, device="cuda"), out)
    assert torch.equal(out, torch.zeros(3, 64, device="cuda"))


@requires_cuda
def test_moe_sum_reduce_deterministic_graph_compile():
    x = torch.randn(512, 8, 4096, dtype=torch.bfloat16, device="cuda")
    first = torch.empty(512, 4096, dtype=torch.bfloat16, device="cuda")
    moe_sum_reduce(x, first, 0.5)
    out = poisoned((512, 4096), torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        moe_sum_reduce(x, out, 0.5)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, first)

    torch._dynamo.reset()

    def f(y):
        o = torch.empty(y.shape[0], y.shape[2], dtype=y.dtype, device=y.device)
        moe_sum_reduce(y, o, 0.5)
        return o

    assert torch.equal(torch.compile(f, fullgraph=True)(x), first)


# ---- errors (raised before any launch) ----
def test_moe_sum_reduce_cpu_input():
    with pytest.raises(RuntimeError, match=r"^moe_sum_reduce: input device: expected a CUDA device, got cpu$"):
        moe_sum_reduce(torch.randn(2, 2, 8), torch.empty(2, 8))


@requires_cuda
def test_moe_sum_reduce_bad_arguments():
    x = torch.randn(4, 2, 64, device="cuda")
    o = torch.empty(4, 64, device="cuda")
    with pytest.raises(
        RuntimeError, match=r"^moe_sum_reduce: output shape: expected \[num_tokens=4, hidden_size=64\], got \(4, 63\)$"
    ):
        moe_sum_reduce(x, torch.empty(4, 63, device="cuda"))
    with pytest.raises(
        RuntimeError, match=r"^moe_sum_reduce: output dtype: expected float32 \(the dtype of input\), got bfloat16$"
    ):
        moe_sum_reduce(x, o.bfloat16())
    with pytest.raises(
        RuntimeError, match=r"^moe_sum_reduce: input shape: expected \[num_tokens, topk, hidden_size\], got \(4, 64\)$"
    ):
        moe_sum_reduce(o, o.clone())
    with pytest.raises(
        ValueError, match=r"^moe_sum_reduce: routed_scaling_factor value: expected a finite number, got nan$"
    ):
        moe_sum_reduce(x, o, float("nan"))
    with pytest.raises(
        ValueError,
        match=r"^moe_sum_reduce: routed_scaling_factor value: expected a magnitude of at most 3.4028235e\+38",
    ):
        moe_sum_reduce(x, o, -1e39)  # finite as a double, inf as the kernel's float32
    with pytest.raises(TypeError, match=r"^moe_sum_reduce: routed_scaling_factor type: expected a real number"):
        moe_sum_reduce(x, o, "2")
    with pytest.raises(RuntimeError, match=r"^moe_sum_reduce: output overlaps input: expected disjoint memory"):
        moe_sum_reduce(x, x[:, 0])
    with pytest.raises(RuntimeError, match=r"^moe_sum_reduce: output last-dim stride: expected 1"):
        moe_sum_reduce(x, torch.empty(64, 4, device="cuda").t())


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))
