"""add_constant: exact int32 results, template knob, views, in place, graphs, compile, errors."""

import pytest
import torch

from sglang.jit_kernel.add_constant import add_constant
from sglang.jit_kernel.testing import assert_poison_intact, poisoned, requires_cuda
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=30, suite="stage-b-kernel-unit-1-gpu-large")


def reference(src: torch.Tensor, constant: int) -> torch.Tensor:
    """int64 sum wrapped to int32 (two's complement)."""
    wrapped = (src.long() + constant) & 0xFFFFFFFF
    return torch.where(wrapped >= 2**31, wrapped - 2**32, wrapped).to(torch.int32)


@requires_cuda
@pytest.mark.parametrize("constant", [0, 1, -7, 2**31 - 1])
@pytest.mark.parametrize("size", [1, 7, 129, 4097, 1 << 20])
def test_add_constant_exact(constant, size):
    src = torch.randint(-(2**31), 2**31 - 1, (size,), dtype=torch.int32, device="cuda")
    out = add_constant(src, constant)
    assert torch.equal(out, reference(src, constant))


@requires_cuda
def test_add_constant_views_and_in_place():
    buffer = poisoned((4096 + 10,), torch.int32)
    out = buffer[5 : 5 + 4096].view(64, 64)
    src = torch.randint(-1000, 1000, (64, 128), dtype=torch.int32, device="cuda")[:, ::2]
    assert add_constant(src, 3, out=out) is out
    assert torch.equal(out, src + 3)
    assert_poison_intact(buffer, 5, 4096)
    x = src.contiguous()
    expected = x + 5
    add_constant(x, 5, out=x)
    assert torch.equal(x, expected)


@requires_cuda
def test_add_constant_empty_graph_and_compile():
    empty = torch.empty(0, dtype=torch.int32, device="cuda")
    assert add_constant(empty, 1).numel() == 0
    src = torch.arange(1000, dtype=torch.int32, device="cuda")
    out = torch.empty_like(src)
    add_constant(src, 2, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        add_constant(src, 2, out=out)
    out.fill_(-1)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, src + 2)
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: add_constant(x * 2, 9) - 1, fullgraph=True)
    assert torch.equal(compiled(src), src * 2 + 8)


def test_add_constant_cpu_error():
    with pytest.raises(RuntimeError, match=r"^add_constant: src device: expected a CUDA device, got cpu$"):
        add_constant(torch.zeros(4, dtype=torch.int32), 1)


def test_add_constant_bad_constant():
    with pytest.raises(TypeError, match=r"^add_constant: constant type: expected an int, got float$"):
        add_constant(torch.zeros(4, dtype=torch.int32), 1.5)
    with pytest.raises(ValueError, match=r"^add_constant: constant value: expected >= -2147483648 and <= 2147483647, got 2147483648$"):
        add_constant(torch.zeros(4, dtype=torch.int32), 2**31)


@requires_cuda
def test_add_constant_bad_dtype_and_out():
    with pytest.raises(RuntimeError, match=r"^add_constant: src dtype: expected int32, got float32$"):
        add_constant(torch.zeros(4, device="cuda"), 1)
    src = torch.zeros(4, dtype=torch.int32, device="cuda")
    with pytest.raises(RuntimeError, match=r"^add_constant: out shape: expected \(4,\) \(the shape of src\), got \(5,\)$"):
        add_constant(src, 1, out=torch.zeros(5, dtype=torch.int32, device="cuda"))


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))
