"""add_constant: exact int32 results, every vector path and tail, views, in place, graphs, compile, errors.

The kernel (csrc/add_constant.cuh on the element-wise engine elementwise/unary_map.cuh) moves 4 int32
per 16-byte access when both data pointers are 16-byte aligned, 2 per 8-byte access when both are
8-byte aligned, and one at a time otherwise; the last ``num_elements % width`` elements are done one
by one. The offset-view grid puts ``src`` and ``out`` at storage offsets 0..3 elements (0, 4, 8, 12
bytes past a 16-byte boundary), so that every width is chosen, and at sizes that leave every tail.
"""

import pytest
import torch

from sglang.jit_kernel.add_constant import add_constant
from sglang.jit_kernel.testing import assert_poison_intact, padded, poisoned, requires_cuda, requires_two_gpus
from sglang.jit_kernel.utils import get_ci_test_range, should_run_full_tests
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=60, suite="stage-b-kernel-unit-1-gpu-large")
register_cuda_ci(est_time=120, suite="nightly-kernel-1-gpu", nightly=True)

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
# Each constant is its own module (a template argument): the grid stays at five builds.
CONSTANTS = [0, 1, -7, INT32_MAX, INT32_MIN]
SIZES = get_ci_test_range(
    full_range=[1, 2, 3, 4, 5, 7, 8, 129, 1023, 4097, 65536 + 3, 1 << 20, (1 << 24) + 3],
    ci_range=[1, 7, 129, 4097, (1 << 24) + 3],
)
OFFSETS = [0, 1, 2, 3]  # elements: 0 / 4 / 8 / 12 bytes past 16-byte alignment
# n % 4 = 1, 3, 1, 2, 3: every tail of the 4-wide path, and n % 2 = 1 for the 2-wide one; 2^20 + 3
# spans 1024 blocks, so the tail is done by the last of many.
VIEW_SIZES = get_ci_test_range(
    full_range=[1, 2, 3, 4, 5, 7, 8, 129, 4097, 4098, 4099, (1 << 20) + 3],
    ci_range=[1, 7, 129, 4098, (1 << 20) + 3],
)


def reference(src: torch.Tensor, constant: int) -> torch.Tensor:
    """int64 sum wrapped to int32 (two's complement)."""
    wrapped = (src.long() + constant) & 0xFFFFFFFF
    return torch.where(wrapped >= 2**31, wrapped - 2**32, wrapped).to(torch.int32)


def random_int32(size: int, device: str = "cuda") -> torch.Tensor:
    """Uniform over int32, with both extremes present (when size allows) so that sums wrap."""
    src = torch.randint(INT32_MIN, INT32_MAX, (size,), dtype=torch.int32, device=device)
    src[:2] = torch.tensor([INT32_MAX, INT32_MIN], dtype=torch.int32)[: min(size, 2)]
    return src


def vector_width(*tensors: torch.Tensor) -> int:
    """The int32 elements per access the kernel picks for these data pointers (4, 2 or 1)."""
    bits = 0
    for t in tensors:
        bits |= t.data_ptr()
    return 4 if bits % 16 == 0 else 2 if bits % 8 == 0 else 1


@requires_cuda
@pytest.mark.parametrize("constant", CONSTANTS)
@pytest.mark.parametrize("size", SIZES)
def test_add_constant_exact(constant, size):
    src = random_int32(size)
    before = src.clone()
    out = add_constant(src, constant)
    assert out.shape == src.shape and out.dtype == torch.int32
    assert torch.equal(out, reference(src, constant))
    assert torch.equal(src, before), "add_constant modified its input"


@requires_cuda
@pytest.mark.parametrize("src_offset", OFFSETS)
@pytest.mark.parametrize("out_offset", OFFSETS)
@pytest.mark.parametrize("size", VIEW_SIZES)
def test_add_constant_offset_views(src_offset, out_offset, size):
    """Data pointers not 16-byte aligned (storage offsets): every vector width and tail, exact
    results, no stray writes around the output, the input unchanged."""
    base = random_int32(size)
    src, src_buffer = padded(base, pad=16 + src_offset)
    out_buffer = poisoned((size + 2 * (16 + out_offset),), torch.int32)
    pad = 16 + out_offset
    out = out_buffer[pad : pad + size]
    assert src_buffer.data_ptr() % 16 == 0 and out_buffer.data_ptr() % 16 == 0  # offsets mean what they say
    assert vector_width(src, out) == (
        4 if src_offset == out_offset == 0 else 2 if src_offset % 2 == out_offset % 2 == 0 else 1
    )
    assert add_constant(src, -7, out=out) is out
    assert torch.equal(out, reference(base, -7))
    assert_poison_intact(out_buffer, pad, size)
    assert torch.equal(src, base)
    assert_poison_intact(src_buffer, 16 + src_offset, size)


@requires_cuda
@pytest.mark.parametrize("offset", OFFSETS)
def test_add_constant_in_place_offset_view(offset):
    size = 4097
    base = random_int32(size)
    x, buffer = padded(base, pad=16 + offset)
    assert add_constant(x, 1, out=x) is x
    assert torch.equal(x, reference(base, 1))
    assert_poison_intact(buffer, 16 + offset, size)


@requires_cuda
def test_add_constant_multidim_out_in_larger_buffer():
    buffer = poisoned((4096 + 10,), torch.int32)
    out = buffer[5 : 5 + 4096].view(64, 64)
    src = torch.randint(-1000, 1000, (64, 64), dtype=torch.int32, device="cuda")
    assert add_constant(src, 1, out=out) is out
    assert torch.equal(out, src + 1)
    assert_poison_intact(buffer, 5, 4096)


@requires_cuda
def test_add_constant_strided_source():
    wide = torch.randint(-1000, 1000, (257, 130), dtype=torch.int32, device="cuda")
    src = wide[:, 1:129:2]  # non-contiguous: copied to a contiguous tensor first
    out = add_constant(src, -7)
    assert out.is_contiguous() and out.shape == src.shape
    assert torch.equal(out, reference(src, -7))


@requires_cuda
def test_add_constant_in_place():
    x = random_int32(4097)
    expected = reference(x, INT32_MAX)
    assert add_constant(x, INT32_MAX, out=x) is x
    assert torch.equal(x, expected)


@requires_cuda
@pytest.mark.parametrize("shape", [(0,), (0, 4096), (3, 0)])
def test_add_constant_empty(shape):
    src = torch.empty(shape, dtype=torch.int32, device="cuda")
    out = add_constant(src, 1)
    assert out.shape == src.shape and out.dtype == torch.int32
    given = torch.empty(shape, dtype=torch.int32, device="cuda")
    assert add_constant(src, 1, out=given) is given


@requires_cuda
@pytest.mark.skipif(
    not should_run_full_tests(), reason="full grid only: set SGLANG_JIT_KERNEL_RUN_FULL_TESTS=1 (16 GiB of GPU memory)"
)
def test_add_constant_more_than_2_pow_31_elements():
    """64-bit offsets: 2^31 + 7 int32 elements (8 GiB in, 8 GiB out), checked whole, in chunks;
    the grid is capped, so blocks loop over tiles, and the 3-element tail lies past index 2^31."""
    n, pad, chunk = (1 << 31) + 7, 64, 1 << 26
    need = 2 * (n + pad) * 4 + 4 * chunk * 8
    free, _ = torch.cuda.mem_get_info()
    if free < need:
        pytest.skip(f"needs {need / 2**30:.1f} GiB free GPU memory, {free / 2**30:.1f} GiB free")
    src = torch.randint(INT32_MIN, INT32_MAX, (n,), dtype=torch.int32, device="cuda")
    src[-3:] = torch.tensor([INT32_MAX, INT32_MIN, -1], dtype=torch.int32)
    out_buffer = poisoned((n + pad,), torch.int32)
    out = out_buffer[:n]
    add_constant(src, -7, out=out)
    for lo in range(0, n, chunk):
        hi = min(lo + chunk, n)
        assert torch.equal(out[lo:hi], reference(src[lo:hi], -7)), f"mismatch in [{lo}, {hi})"
    assert (out_buffer[n:] == poisoned((1,), torch.int32)[0]).all(), "wrote past the end of out"
    del src, out, out_buffer
    torch.cuda.empty_cache()


@requires_cuda
def test_add_constant_cuda_graph():
    src = random_int32(4097)
    out = poisoned((4097,), torch.int32)
    add_constant(src, -7, out=out)  # compile/load outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        add_constant(src, -7, out=out)
    src.copy_(random_int32(4097))
    out.fill_(-1)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, reference(src, -7))


@requires_cuda
def test_add_constant_on_side_stream():
    src = random_int32(1 << 20)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = add_constant(src, 1)
    stream.synchronize()
    assert torch.equal(out, reference(src, 1))


@requires_cuda
@pytest.mark.parametrize("in_place", [False, True])
def test_add_constant_torch_compile_fullgraph(in_place):
    torch._dynamo.reset()

    def f(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        return add_constant(y, 1, out=y if in_place else None) - 1

    compiled = torch.compile(f, fullgraph=True)
    src = torch.arange(1000, dtype=torch.int32, device="cuda")
    assert torch.equal(compiled(src), src * 2)


@requires_two_gpus
def test_add_constant_on_second_gpu_while_first_is_current():
    torch.cuda.set_device(0)
    src = random_int32(4097, device="cuda:1")
    out = add_constant(src, 1)
    assert out.device == src.device
    assert torch.equal(out, reference(src, 1))


# ---- errors (raised before any launch) ----
def test_add_constant_cpu_error():
    with pytest.raises(RuntimeError, match=r"^add_constant: src device: expected a CUDA device, got cpu$"):
        add_constant(torch.zeros(4, dtype=torch.int32), 1)


def test_add_constant_not_a_tensor():
    with pytest.raises(TypeError, match=r"^add_constant: src type: expected a torch.Tensor, got list$"):
        add_constant([1, 2], 1)


@pytest.mark.parametrize("constant,name", [(1.5, "float"), (True, "bool"), ("1", "str"), (None, "NoneType")])
def test_add_constant_bad_constant_type(constant, name):
    with pytest.raises(TypeError, match=rf"^add_constant: constant type: expected an int, got {name}$"):
        add_constant(torch.zeros(4, dtype=torch.int32), constant)


@pytest.mark.parametrize("constant", [2**31, -(2**31) - 1])
def test_add_constant_constant_out_of_range(constant):
    with pytest.raises(
        ValueError, match=rf"^add_constant: constant value: expected >= -2147483648 and <= 2147483647, got {constant}$"
    ):
        add_constant(torch.zeros(4, dtype=torch.int32), constant)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.int16])
def test_add_constant_bad_dtype(dtype):
    src = torch.zeros(4, device="cuda").to(dtype)
    with pytest.raises(RuntimeError, match=rf"^add_constant: src dtype: expected int32, got {str(dtype)[6:]}$"):
        add_constant(src, 1)


@requires_cuda
def test_add_constant_bad_out():
    src = torch.zeros(128, dtype=torch.int32, device="cuda")
    with pytest.raises(TypeError, match=r"^add_constant: out type: expected a torch.Tensor, got list$"):
        add_constant(src, 1, out=[0] * 128)
    with pytest.raises(
        RuntimeError, match=r"^add_constant: out shape: expected \(128,\) \(the shape of src\), got \(127,\)$"
    ):
        add_constant(src, 1, out=torch.zeros(127, dtype=torch.int32, device="cuda"))
    with pytest.raises(
        RuntimeError, match=r"^add_constant: out dtype: expected int32 \(the dtype of src\), got float32$"
    ):
        add_constant(src, 1, out=torch.zeros(128, device="cuda"))
    with pytest.raises(RuntimeError, match=r"^add_constant: out device: expected a CUDA device, got cpu$"):
        add_constant(src, 1, out=torch.zeros(128, dtype=torch.int32))
    with pytest.raises(
        RuntimeError, match=r"^add_constant: out layout: expected contiguous, got shape \(128,\) with strides \(2,\)$"
    ):
        add_constant(src, 1, out=torch.zeros(256, dtype=torch.int32, device="cuda")[::2])


@requires_cuda
def test_add_constant_partial_overlap_rejected():
    """out shifted by one element against src would read overwritten elements: refused, nothing written."""
    buffer = random_int32(4097)
    before = buffer.clone()
    with pytest.raises(
        RuntimeError,
        match=r"^add_constant: out overlaps src: expected disjoint memory or the same tensor, got ",
    ):
        add_constant(buffer[:-1], 1, out=buffer[1:])
    assert torch.equal(buffer, before)


@requires_cuda
def test_add_constant_ffi_rejects_mismatch_from_cpp():
    """The C++ TensorMatcher is the second line: calling the module directly with bad tensors raises
    RuntimeError naming the tensor, never a CUDA fault, and writes nothing."""
    from sglang.jit_kernel.add_constant import _jit_add_constant_module

    module = _jit_add_constant_module(1)
    src = torch.zeros(128, dtype=torch.int32, device="cuda")
    with pytest.raises(RuntimeError, match="src"):
        module.add_constant(torch.empty(128, dtype=torch.int32, device="cuda"), src.float())
    with pytest.raises(RuntimeError, match="num_elements"):
        module.add_constant(torch.empty(127, dtype=torch.int32, device="cuda"), src)
    with pytest.raises(RuntimeError):
        module.add_constant(torch.empty(128, dtype=torch.int32), src.cpu())
    buffer = random_int32(4097)
    before = buffer.clone()
    with pytest.raises(RuntimeError, match="out"):
        module.add_constant(buffer[1:], buffer[:-1])
    assert torch.equal(buffer, before)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))
