"""clamp_position_cuda: exact against max(seq_lens - 1, 0) (extremes of the dtype included), awkward
sizes, strided and offset views, empty, a new tensor every call, graphs, compile, every error case."""

import pytest
import torch

from sglang.jit_kernel.clamp_position import clamp_position_cuda
from sglang.jit_kernel.testing import requires_cuda, requires_two_gpus
from sglang.jit_kernel.utils import get_ci_test_range
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=20, suite="stage-b-kernel-unit-1-gpu-large")

DTYPES = [torch.int32, torch.int64]
SIZES = get_ci_test_range(full_range=[1, 7, 129, 4097, 1_000_003], ci_range=[1, 7, 129, 4097])


def reference(seq_lens: torch.Tensor) -> torch.Tensor:
    """max(x - 1, 0) without wrap-around (x = the dtype's minimum gives 0)."""
    return torch.where(seq_lens > 0, seq_lens - 1, torch.zeros_like(seq_lens)).contiguous()


def lengths(n: int, dtype: torch.dtype, device="cuda") -> torch.Tensor:
    """Random lengths in [-5, 10^6) with the dtype's extremes, 0 and 1 at the front."""
    info = torch.iinfo(dtype)
    x = torch.randint(-5, 1_000_000, (n,), dtype=dtype, device=device)
    extremes = torch.tensor([info.min, info.max, 0, 1, -1], dtype=dtype, device=device)
    x[: min(n, 5)] = extremes[: min(n, 5)]
    return x


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_clamp_position_values(dtype, n):
    x = lengths(n, dtype)
    before = x.clone()
    out = clamp_position_cuda(x)
    assert out.dtype == dtype and out.is_contiguous() and out.shape == (n,)
    assert torch.equal(out, reference(x))
    assert torch.equal(x, before)


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("step,start", [(2, 0), (3, 1), (7, 5)])
def test_clamp_position_strided_and_offset_views(dtype, step, start):
    wide = lengths(3000, dtype)
    x = wide[start::step]
    out = clamp_position_cuda(x)
    assert out.is_contiguous() and out.data_ptr() != x.data_ptr()
    assert torch.equal(out, reference(x))


@requires_cuda
def test_clamp_position_returns_a_new_tensor_each_call():
    x = lengths(64, torch.int32)
    a, b = clamp_position_cuda(x), clamp_position_cuda(x)
    assert a.data_ptr() != b.data_ptr() and a.data_ptr() != x.data_ptr()
    assert torch.equal(a, b)


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_clamp_position_empty(dtype):
    out = clamp_position_cuda(torch.empty(0, dtype=dtype, device="cuda"))
    assert out.shape == (0,) and out.dtype == dtype and out.is_cuda


@requires_cuda
def test_clamp_position_cuda_graph():
    x = lengths(256, torch.int64)
    clamp_position_cuda(x)  # load outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = clamp_position_cuda(x)
    x.copy_(lengths(256, torch.int64).flip(0))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, reference(x))


@requires_cuda
def test_clamp_position_torch_compile_fullgraph():
    torch._dynamo.reset()

    def f(seq_lens):
        return clamp_position_cuda(seq_lens * 2) + 1

    x = lengths(100, torch.int32)
    out = torch.compile(f, fullgraph=True)(x)
    assert torch.equal(out, reference(x * 2) + 1)


@requires_two_gpus
def test_clamp_position_on_second_gpu_while_first_is_current():
    torch.cuda.set_device(0)
    x = lengths(77, torch.int64, "cuda:1")
    out = clamp_position_cuda(x)
    assert out.device == x.device and torch.equal(out, reference(x))


def test_clamp_position_cpu_and_non_tensors():
    with pytest.raises(RuntimeError, match=r"^clamp_position_cuda: seq_lens device: expected a CUDA device, got cpu$"):
        clamp_position_cuda(torch.ones(4, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"^clamp_position_cuda: seq_lens type: expected a torch.Tensor, got list$"):
        clamp_position_cuda([1, 2])


@requires_cuda
@pytest.mark.parametrize(
    "make,pattern",
    [
        (
            lambda: torch.ones(4, device="cuda"),
            r"^clamp_position_cuda: seq_lens dtype: expected one of int32, int64, got float32$",
        ),
        (
            lambda: torch.ones(4, dtype=torch.int16, device="cuda"),
            r"^clamp_position_cuda: seq_lens dtype: expected one of int32, int64, got int16$",
        ),
        (
            lambda: torch.ones(2, 3, dtype=torch.int32, device="cuda"),
            r"^clamp_position_cuda: seq_lens shape: expected \[num_seqs\], got \(2, 3\)$",
        ),
        (
            lambda: torch.tensor(5, device="cuda"),
            r"^clamp_position_cuda: seq_lens shape: expected \[num_seqs\], got \(\)$",
        ),
    ],
)
def test_clamp_position_bad_inputs(make, pattern):
    clamp_position_cuda(torch.ones(2, dtype=torch.int32, device="cuda"))  # the fast path is live
    with pytest.raises(RuntimeError, match=pattern):
        clamp_position_cuda(make())


@requires_cuda
def test_clamp_position_ffi_rejects_mismatch_from_cpp():
    from sglang.jit_kernel.clamp_position import _jit_clamp_position_module

    fn = _jit_clamp_position_module().clamp_position
    x = lengths(8, torch.int32)
    with pytest.raises(RuntimeError, match="out"):
        fn(torch.empty(8, dtype=torch.int64, device="cuda"), x)
    with pytest.raises(RuntimeError, match="overlaps"):
        fn(x, x)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))
