"""scale: values against an fp32 reference, awkward sizes, views, in place, graphs, compile, errors."""

import pytest
import torch

from sglang.jit_kernel.scale import scale
from sglang.jit_kernel.testing import (
    FLOAT_DTYPES,
    assert_close,
    assert_poison_intact,
    padded,
    poisoned,
    requires_cuda,
    requires_two_gpus,
)
from sglang.jit_kernel.utils import get_ci_test_range
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=60, suite="stage-b-kernel-unit-1-gpu-large")
register_cuda_ci(est_time=120, suite="nightly-kernel-1-gpu", nightly=True)

SIZES = get_ci_test_range(
    full_range=[1, 2, 7, 8, 127, 128, 129, 769, 1024, 4097, 65536 + 3, 1 << 20, (1 << 22) + 5],
    ci_range=[1, 7, 8, 129, 769, 4097, 65536 + 3],
)
FACTORS = [0.5, -3.0, 1.0009765625]


def reference(src: torch.Tensor, factor: float) -> torch.Tensor:
    """fp32 product of the same low-precision inputs, rounded once to the dtype."""
    return (src.float() * torch.tensor(factor, dtype=torch.float32)).to(src.dtype)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("factor", FACTORS)
def test_scale_correctness(dtype, size, factor):
    src = torch.randn(size, dtype=dtype, device="cuda")
    before = src.clone()
    out = scale(src, factor)
    assert out.shape == src.shape and out.dtype == dtype
    assert_close(out, reference(src, factor))
    assert torch.equal(src, before), "scale modified its input"


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", [(3, 5, 7), (129, 64), (1, 4096)])
def test_scale_multidim_with_out(dtype, shape):
    src = torch.randn(shape, dtype=dtype, device="cuda")
    out = poisoned(shape, dtype)
    result = scale(src, 2.5, out=out)
    assert result is out
    assert_close(out, reference(src, 2.5))


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("src_offset,out_offset", [(0, 0), (1, 0), (0, 3), (5, 5), (3, 7)])
@pytest.mark.parametrize("size", [1, 15, 1031, 8192 + 7])
def test_scale_unaligned_views(dtype, src_offset, out_offset, size):
    """Data pointers not 16-byte aligned (storage offsets): right result, no stray writes."""
    base = torch.randn(size, dtype=dtype, device="cuda")
    src, _ = padded(base, pad=src_offset + 16)
    src = src[0:size]  # a view with storage offset src_offset + 16 elements
    out_buffer = poisoned((size + 2 * (out_offset + 16),), dtype)
    pad = out_offset + 16
    out = out_buffer[pad : pad + size]
    scale(src, -1.5, out=out)
    assert_close(out, reference(base, -1.5))
    assert_poison_intact(out_buffer, pad, size)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_scale_strided_source(dtype):
    wide = torch.randn(257, 130, dtype=dtype, device="cuda")
    src = wide[:, 1:129:2]  # non-contiguous view
    out = scale(src, 0.75)
    assert out.is_contiguous()
    assert_close(out, reference(src, 0.75))


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_scale_in_place(dtype):
    src = torch.randn(4097, dtype=dtype, device="cuda")
    expected = reference(src, 3.0)
    result = scale(src, 3.0, out=src)
    assert result is src
    assert_close(src, expected)


@requires_cuda
@pytest.mark.parametrize("shape", [(0,), (0, 4096), (3, 0)])
def test_scale_empty(shape):
    src = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
    out = scale(src, 2.0)
    assert out.shape == src.shape
    out2 = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
    assert scale(src, 2.0, out=out2) is out2


@requires_cuda
def test_scale_more_than_2_pow_32_elements():
    """64-bit indexing: 2^32 + 9 bf16 elements (8 GiB each way)."""
    n = (1 << 32) + 9
    free, _ = torch.cuda.mem_get_info()
    if free < 3 * n * 2:
        pytest.skip(f"needs {3 * n * 2 / 2**30:.0f} GiB free GPU memory, {free / 2**30:.0f} GiB free")
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda").uniform_(-4, 4)
    out = torch.empty_like(src)
    out[-(1 << 20) :].fill_(float("nan"))
    scale(src, 0.5, out=out)
    for lo, hi in [(0, 1 << 20), ((1 << 32) - (1 << 19), (1 << 32) + (1 << 19)), (n - (1 << 20), n)]:
        lo, hi = max(lo, 0), min(hi, n)
        assert_close(out[lo:hi], reference(src[lo:hi], 0.5))
    del src, out
    torch.cuda.empty_cache()


@requires_cuda
def test_scale_cuda_graph():
    src = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
    out = poisoned((4096,), torch.bfloat16)
    scale(src, 2.0, out=out)  # compile/load outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        scale(src, 2.0, out=out)
    src.copy_(torch.randn_like(src))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, reference(src, 2.0))


@requires_cuda
def test_scale_on_side_stream():
    src = torch.randn(1 << 20, dtype=torch.float16, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = scale(src, 4.0)
    stream.synchronize()
    assert_close(out, reference(src, 4.0))


@requires_cuda
@pytest.mark.parametrize("in_place", [False, True])
def test_scale_torch_compile_fullgraph(in_place):
    torch._dynamo.reset()

    def f(x: torch.Tensor) -> torch.Tensor:
        y = x + 1
        return scale(y, 2.0, out=y if in_place else None) * 3

    compiled = torch.compile(f, fullgraph=True)
    x = torch.randn(1000, dtype=torch.bfloat16, device="cuda")
    expected = (reference(x + 1, 2.0).float() * 3).to(torch.bfloat16)
    assert_close(compiled(x), expected)


@requires_two_gpus
def test_scale_on_second_gpu_while_first_is_current():
    torch.cuda.set_device(0)
    src = torch.randn(4097, dtype=torch.bfloat16, device="cuda:1")
    out = scale(src, 2.0)
    assert out.device == src.device
    assert_close(out, reference(src, 2.0))


# ---- errors (raised before any launch) ----
def test_scale_cpu_error():
    src = torch.randn(128, dtype=torch.float16)
    with pytest.raises(RuntimeError, match=r"^scale: src device: expected a CUDA device, got cpu$"):
        scale(src, 2.0)


def test_scale_not_a_tensor():
    with pytest.raises(TypeError, match=r"^scale: src type: expected a torch.Tensor, got list$"):
        scale([1.0, 2.0], 2.0)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.int32, torch.float64, torch.float8_e4m3fn])
def test_scale_unsupported_dtype(dtype):
    src = torch.zeros(128, device="cuda").to(dtype)
    with pytest.raises(RuntimeError, match=r"^scale: src dtype: expected one of float16, bfloat16, float32, got "):
        scale(src, 2.0)


@requires_cuda
def test_scale_bad_out():
    src = torch.randn(128, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(RuntimeError, match=r"^scale: out shape: expected \(128,\) \(the shape of src\), got \(127,\)$"):
        scale(src, 2.0, out=torch.empty(127, dtype=torch.bfloat16, device="cuda"))
    with pytest.raises(RuntimeError, match=r"^scale: out dtype: expected bfloat16 \(the dtype of src\), got float16$"):
        scale(src, 2.0, out=torch.empty(128, dtype=torch.float16, device="cuda"))
    with pytest.raises(RuntimeError, match=r"^scale: out device: expected a CUDA device, got cpu$"):
        scale(src, 2.0, out=torch.empty(128, dtype=torch.bfloat16))
    with pytest.raises(
        RuntimeError, match=r"^scale: out layout: expected contiguous, got shape \(128,\) with strides \(2,\)$"
    ):
        scale(src, 2.0, out=torch.empty(256, dtype=torch.bfloat16, device="cuda")[::2])


@requires_cuda
@pytest.mark.parametrize("factor", ["2", None, [2.0], 1j])
def test_scale_bad_factor(factor):
    src = torch.randn(128, dtype=torch.bfloat16, device="cuda")
    scale(src, 1.0)  # load the module: the first call below takes the eager fast path
    with pytest.raises(TypeError, match=r"^scale: factor type: expected a real number \(int or float\), got "):
        scale(src, factor)


@requires_cuda
def test_scale_partial_overlap_rejected():
    """out shifted by one element against src would read overwritten elements: refused."""
    buffer = torch.randn(4097, dtype=torch.bfloat16, device="cuda")
    before = buffer.clone()
    with pytest.raises(
        RuntimeError,
        match=r"^scale: out overlaps src: expected disjoint memory or the same tensor, got ",
    ):
        scale(buffer[:-1], 2.0, out=buffer[1:])
    assert torch.equal(buffer, before)


@requires_cuda
def test_scale_ffi_rejects_mismatch_from_cpp():
    """The C++ TensorMatcher is the second line: calling the module directly with bad tensors
    raises RuntimeError naming the tensor, never a CUDA fault."""
    from sglang.jit_kernel.scale import _jit_scale_module

    module = _jit_scale_module(torch.bfloat16)
    src = torch.randn(128, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(RuntimeError, match="src"):
        module.scale(torch.empty(128, dtype=torch.bfloat16, device="cuda"), src.float(), 1.0)
    with pytest.raises(RuntimeError, match="num_elements"):
        module.scale(torch.empty(127, dtype=torch.bfloat16, device="cuda"), src, 1.0)
    with pytest.raises(RuntimeError):
        module.scale(torch.empty(128, dtype=torch.bfloat16), src.cpu(), 1.0)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))
