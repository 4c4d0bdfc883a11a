"""per_tensor_quant_fp8: dynamic and static scales against fp64 and the kernel's fp32 arithmetic,
the single-block and two-pass paths, special values, views, empty and huge inputs, graphs, compile,
errors."""

import pytest
import torch
from test_per_token_group_quant_8bit import FLOAT_DTYPES, FP8, assert_on_grid

from sglang.jit_kernel.per_tensor_quant_fp8 import per_tensor_quant_fp8, reference
from sglang.jit_kernel.testing import requires_cuda, requires_two_gpus
from sglang.jit_kernel.utils import get_ci_test_range
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=60, suite="stage-b-kernel-unit-1-gpu-large")
register_cuda_ci(est_time=120, suite="nightly-kernel-1-gpu", nightly=True)

FLT_MIN = 2.0**-126
# (1, 4096) and (7, 129) fit one block (the single pass); the others take the two launches.
SHAPES = get_ci_test_range(
    full_range=[(1, 1), (1, 4096), (7, 129), (1, 16384), (1, 16385), (4097, 1024), (2048, 4096), (3, 100003)],
    ci_range=[(1, 1), (1, 4096), (7, 129), (1, 16385), (4097, 1024)],
)


def run(x, is_static=False, scale=0.0):
    q = torch.empty(x.shape, dtype=FP8, device=x.device)
    s = torch.full((1,), scale, device=x.device)
    assert per_tensor_quant_fp8(x, q, s, is_static) is None
    return q, s


def assert_bitwise(q, s, x, scale=None):
    q_ref, s_ref = reference(x, scale)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(s.reshape(1), s_ref)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_dynamic_against_fp64_and_fp32_arithmetic(dtype, shape):
    x = (torch.randn(shape, device="cuda") * 7).to(dtype)
    before = x.clone()
    q, s = run(x)
    assert torch.equal(x, before)
    s64 = (x.double().abs().max().clamp_min(1e-10) / 448.0).clamp_min(FLT_MIN)
    torch.testing.assert_close(s.double()[0], s64, rtol=1e-5, atol=0)
    y64 = (x.double() / s64).clamp(-448, 448)
    assert_on_grid(q, y64.float().to(FP8), y64)
    assert_bitwise(q, s, x)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", [(1, 4096), (4097, 1024)])
def test_static_scale(dtype, shape):
    x = torch.randn(shape, device="cuda").to(dtype)
    q, s = run(x, is_static=True, scale=0.01)
    assert torch.equal(s, torch.full((1,), 0.01, device="cuda")), "static mode must only read output_s"
    assert_bitwise(q, s, x, scale=torch.full((1,), 0.01, device="cuda"))


@requires_cuda
@pytest.mark.parametrize("shape", [(1, 4096), (4097, 1024)])
def test_dynamic_max_reduces_into_output_s(shape):
    """Dynamic mode keeps a larger value already in output_s (the caller zeroes it, as in the original)."""
    x = torch.randn(shape, dtype=torch.bfloat16, device="cuda")
    q, s = run(x, scale=100.0)
    assert s[0] == 100.0
    assert_bitwise(q, s, x, scale=torch.full((1,), 100.0, device="cuda"))


@requires_cuda
@pytest.mark.parametrize("shape", [(1, 4096), (4097, 1024)])
def test_zero_tiny_inf_nan_and_zero_static_scale(shape):
    zeros = torch.zeros(shape, dtype=torch.float32, device="cuda")
    q, s = run(zeros)
    assert torch.isfinite(s).all() and s[0] > 0 and (q.float() == 0).all()
    q, s = run(torch.full(shape, 1e-30, device="cuda"))
    assert s[0] > 0 and torch.isfinite(q.float()).all()
    x_static = torch.randn(shape, device="cuda")
    q, s = run(x_static, is_static=True, scale=0.0)  # floored at FLT_MIN
    assert not torch.isnan(q.float()).any()
    # a NaN static scale is floored at FLT_MIN as well (documented): the same bits as scale = FLT_MIN
    q_nan, _ = run(x_static, is_static=True, scale=float("nan"))
    q_min, _ = run(x_static, is_static=True, scale=torch.finfo(torch.float32).tiny)
    assert not torch.isnan(q_nan.float()).any()
    assert torch.equal(q_nan.view(torch.uint8), q_min.view(torch.uint8))
    assert torch.equal(q.view(torch.uint8), q_min.view(torch.uint8))
    x = torch.randn(shape, device="cuda")
    x.view(-1)[5] = float("nan")
    q, s = run(x)
    assert torch.isfinite(s).all() and torch.isnan(q.float().view(-1)[5])
    clean = x.clone()
    clean.view(-1)[5] = 0
    assert torch.equal(s, reference(clean)[1])
    x.view(-1)[7] = float("inf")
    q, s = run(x)
    assert s[0] == torch.finfo(torch.float32).max and q.float().view(-1)[7] == 448


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("m", [1, 300])
def test_strided_offset_views_with_poisoned_outputs(dtype, offset, m):
    k = 1000
    x = torch.randn(m, k + 8, dtype=dtype, device="cuda")[:, offset : offset + k]
    q_buffer = torch.full((m, k + 8), 0x7F, dtype=torch.uint8, device="cuda").view(FP8)
    q = q_buffer[:, offset : offset + k]
    s_buffer = torch.full((3,), float("nan"), device="cuda")
    s = s_buffer[1:2].zero_()
    per_tensor_quant_fp8(x, q, s)
    assert_bitwise(q, s, x.contiguous())
    outside = torch.ones(m, k + 8, dtype=torch.bool, device="cuda")
    outside[:, offset : offset + k] = False
    assert (q_buffer.view(torch.uint8)[outside] == 0x7F).all(), "wrote outside output_q"
    assert torch.isnan(s_buffer[[0, 2]]).all()


@requires_cuda
def test_transposed_and_3d_inputs():
    x_t = torch.randn(300, 40, dtype=torch.bfloat16, device="cuda").T
    q, s = run(x_t)
    assert_bitwise(q, s, x_t.contiguous())
    x3 = torch.randn(4, 5, 96, dtype=torch.float16, device="cuda")[:, :, :64]  # leading dims strided
    q3 = torch.empty(4, 5, 64, dtype=FP8, device="cuda")
    s3 = torch.zeros((), device="cuda")
    per_tensor_quant_fp8(x3, q3, s3)
    assert_bitwise(q3, s3, x3.contiguous())


@requires_cuda
def test_empty_input():
    q, s = run(torch.empty(0, 4096, dtype=torch.bfloat16, device="cuda"))
    assert q.shape == (0, 4096) and s[0] == 0


@requires_cuda
def test_more_than_2_pow_31_elements():
    n = (1 << 31) + (1 << 20) + 8
    free, _ = torch.cuda.mem_get_info()
    if free < n * 4 + (1 << 30):
        pytest.skip(f"needs {n * 4 / 2**30:.0f} GiB free GPU memory, {free / 2**30:.0f} GiB free")
    x = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    x[-3] = 1000.0  # the maximum sits past 2^31
    q, s = run(x)
    assert s[0] == torch.tensor(1000.0) / torch.tensor(448.0)
    for part in (slice(0, 1 << 16), slice(n - (1 << 16), n)):
        q_ref = reference(x[part], scale=s)[0]
        assert torch.equal(q[part].view(torch.uint8), q_ref.view(torch.uint8))
    del x, q
    torch.cuda.empty_cache()


@requires_cuda
@pytest.mark.parametrize("shape", [(1, 4096), (7, 129), (4097, 1024), (3, 100003)])
@pytest.mark.parametrize("prior", [100.0, float("nan"), -5.0, float("inf")])
def test_dynamic_without_accumulate_overwrites_output_s(shape, prior):
    """accumulate=False: output_s gets the tensor's own scale whatever it held (no zeroing needed),
    on the single pass and on the two-pass path (and a strided input, which takes rows)."""
    x = (torch.randn(shape, device="cuda") * 3).to(torch.bfloat16)
    for view in (x, torch.cat([x, x], dim=-1)[:, : shape[1]]):
        q = torch.empty(view.shape, dtype=FP8, device="cuda")
        s = torch.full((1,), prior, device="cuda")
        per_tensor_quant_fp8(view, q, s, accumulate=False)
        assert_bitwise(q, s, view)


def replay_on_new_data(graph, x, q, s):
    """Replays ``graph`` (quantizing x into q, s) twice on new data in x, each result bit for bit the
    reference's: the second replay must not keep the first one's scale."""
    for _ in range(2):
        x.copy_(torch.randn_like(x) * 3)
        graph.replay()
        torch.cuda.synchronize()
        assert_bitwise(q, s, x)
        x.mul_(0.01)


@requires_cuda
@pytest.mark.parametrize("shape", [(1, 4096), (2048, 4096)])
def test_cuda_graph_replay_without_accumulate(shape):
    x = torch.randn(shape, dtype=torch.bfloat16, device="cuda")
    q, s = run(x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        per_tensor_quant_fp8(x, q, s, accumulate=False)
    replay_on_new_data(graph, x, q, s)


@requires_cuda
@pytest.mark.parametrize("shape", [(1, 4096), (2048, 4096)])
def test_cuda_graph_replay(shape):
    x = torch.randn(shape, dtype=torch.bfloat16, device="cuda")
    q, s = run(x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        s.zero_()
        per_tensor_quant_fp8(x, q, s)
    x.copy_(torch.randn_like(x) * 3)
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise(q, s, x)


@requires_cuda
@pytest.mark.parametrize("is_static", [False, True])
@pytest.mark.parametrize("accumulate", [True, False])
def test_torch_compile_fullgraph(is_static, accumulate):
    torch._dynamo.reset()

    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x * 2
        q = torch.empty(y.shape, dtype=FP8, device=y.device)
        s = torch.full((1,), 0.05, device=y.device) if is_static else torch.zeros(1, device=y.device)
        per_tensor_quant_fp8(y, q, s, is_static, accumulate=accumulate)
        return q, s

    x = torch.randn(64, 4096, dtype=torch.bfloat16, device="cuda")
    q, s = torch.compile(f, fullgraph=True)(x)
    q_ref, s_ref = f(x)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s, s_ref)


@requires_two_gpus
def test_second_gpu_while_first_is_current():
    torch.cuda.set_device(0)
    x = torch.randn(129, 4096, dtype=torch.bfloat16, device="cuda:1")
    q, s = run(x)
    assert q.device == x.device
    assert_bitwise(q, s, x)


# ---- errors ----
def test_not_a_tensor_and_cpu():
    with pytest.raises(TypeError, match=r"^per_tensor_quant_fp8: input type: expected a torch.Tensor, got NoneType$"):
        per_tensor_quant_fp8(None, None, None)
    with pytest.raises(RuntimeError, match=r"^per_tensor_quant_fp8: input device: expected a CUDA device, got cpu$"):
        per_tensor_quant_fp8(torch.randn(4), torch.empty(4, dtype=FP8), torch.zeros(1))


@requires_cuda
def test_bad_arguments():
    x = torch.randn(4, 256, dtype=torch.bfloat16, device="cuda")
    q = torch.empty(4, 256, dtype=FP8, device="cuda")
    s = torch.full((1,), -1.0, device="cuda")
    run(x)  # load the module: the eager fast path is tried first
    op = r"^per_tensor_quant_fp8: "
    cases = [
        ((x, q.view(torch.int8), s), RuntimeError, r"output_q dtype: expected float8_e4m3fn, got int8"),
        ((x, q, s.double()), RuntimeError, r"output_s dtype: expected float32, got float64"),
        (
            (x, q[:, :128], s),
            RuntimeError,
            r"output_q shape: expected \(4, 256\) \(the shape of input\), got \(4, 128\)",
        ),
        (
            (x, q, torch.zeros(2, device="cuda")),
            RuntimeError,
            r"output_s shape: expected one element \(\[1\] or \[\]\), got \(2,\)",
        ),
        ((x, q.T.contiguous().T, s), RuntimeError, r"output_q last-dim stride: expected 1"),
        ((x, q, x.view(torch.float32)[0, :1]), RuntimeError, r"output_s overlaps input: expected disjoint memory"),
        ((x, q, s, 1), TypeError, r"is_static type: expected a bool, got int"),
    ]
    for args, error, pattern in cases:
        with pytest.raises(error, match=op + pattern):
            per_tensor_quant_fp8(*args)
    with pytest.raises(ValueError, match=op + r"eps value: expected >= 0.0, got -1.0$"):
        per_tensor_quant_fp8(x, q, s, eps=-1.0)
    with pytest.raises(TypeError, match=op + r"accumulate type: expected a bool, got int"):
        per_tensor_quant_fp8(x, q, s, accumulate=0)
    assert (s == -1).all(), "an output was written before the error"


# ---- the two-pass path (reset, absmax, quantize with early loads) ----
#: Past the one-block pass (one row of at most 2048 16-byte chunks): (1, 16392) one row just past it,
#: (1, 16385), (3, 1001) and (64, 4095) unaligned (element-wise chunks, no early loads), (7, 129) /
#: (2, 9) small multi-row, (33, 4000) rows ending inside a block, (64, 4096) / (2048, 4096) the sizes
#: the early loads are for, (70000, 8) more rows than gridDim.y (rows after each block's first are
#: loaded after the wait).
TWO_PASS_SHAPES = [(1, 16392), (1, 16385), (3, 1001), (64, 4095), (7, 129), (2, 9), (33, 4000), (64, 4096)]
TWO_PASS_SHAPES += get_ci_test_range(full_range=[(2048, 4096), (70000, 8), (4097, 1024)], ci_range=[(70000, 8)])


def two_pass_input(shape, dtype):
    """Rows scaled over four decades with a known maximum away from block 0, and the same rows as a
    view of a wider buffer (row stride shape[1] + 24, storage offset 8)."""
    x = (torch.randn(shape, device="cuda") * torch.logspace(-2, 2, shape[0], device="cuda").unsqueeze(1)).to(dtype)
    x.view(-1)[x.numel() * 2 // 3] = 37.5
    wide = torch.zeros(shape[0], shape[1] + 24, device="cuda").to(dtype)
    wide[:, 8 : 8 + shape[1]] = x
    return x, wide[:, 8 : 8 + shape[1]]


def expected_with_prior(x, accumulate, prior):
    """(q bytes, s) of the documented contract: s = the tensor's scale, max-reduced (fmaxf: a NaN
    prior is dropped) with ``prior`` when ``accumulate``; q from that s."""
    s_own = reference(x, None)[1]
    if accumulate and prior == prior:
        s_own = torch.full((1,), max(prior, s_own.item()), device=x.device)
    return reference(x, scale=s_own)[0].view(torch.uint8), s_own


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", TWO_PASS_SHAPES)
@pytest.mark.parametrize("accumulate,prior", [(True, 0.0), (True, 0.5), (True, float("nan")), (False, 100.0)])
def test_two_pass_path_against_reference(dtype, shape, accumulate, prior):
    """The two-pass path (and its early loads) gives the reference's bytes and scale, bit for bit:
    aligned and unaligned rows, rows ending inside a block, a row-strided view, accumulate with a zero,
    a larger and a NaN prior scale, and without accumulate (a prior of 100 overwritten)."""
    for view in two_pass_input(shape, dtype):
        q = torch.full(view.shape, 0x7F, dtype=torch.uint8, device="cuda").view(FP8)
        s = torch.full((1,), prior, device="cuda")
        per_tensor_quant_fp8(view, q, s, accumulate=accumulate)
        q_ref, s_ref = expected_with_prior(view, accumulate, prior)
        assert torch.equal(q.view(torch.uint8), q_ref) and torch.equal(s, s_ref)


@requires_cuda
@pytest.mark.parametrize("shape", [(1, 4096), (7, 129), (64, 4096)])
@pytest.mark.parametrize("prior", [float("nan"), -float("nan"), -5.0, -0.0, float("inf"), 1e-39, 3.0])
def test_accumulates_into_any_prior(shape, prior):
    """With accumulate, output_s = fmaxf(prior, the tensor's scale) on the single pass and on the two
    passes: a NaN of either sign is dropped, negative values and -0.0 lose, +inf stays (q then uses
    FLT_MAX), a subnormal loses, a prior above the tensor's scale stays."""
    x = torch.randn(shape, device="cuda").to(torch.bfloat16)
    q = torch.empty(shape, dtype=FP8, device="cuda")
    s = torch.full((1,), prior, device="cuda")
    per_tensor_quant_fp8(x, q, s)
    q_ref, s_ref = expected_with_prior(x, True, prior)
    assert torch.equal(q.view(torch.uint8), q_ref) and torch.equal(s, s_ref)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_two_pass_zeros_nan_inf(dtype):
    """All-zero input: s = eps / 448 and zeros; a NaN is ignored by the maximum and quantizes to NaN;
    an inf gives FLT_MAX and 448; -0.0 and subnormals: the reference's bits throughout."""
    q, s = run(torch.zeros(64, 4096, dtype=dtype, device="cuda"))
    assert (q.float() == 0).all() and torch.equal(s, reference(torch.zeros(1, device="cuda"))[1])
    x = torch.randn(64, 4096, device="cuda").to(dtype)
    x[40, 7], x[63, 4095], x[10] = float("nan"), -0.0, 1e-40
    q, s = run(x)
    clean = x.clone()
    clean[40, 7] = 0
    assert torch.isnan(q[40, 7].float()) and torch.equal(s, reference(clean)[1])
    keep = torch.ones_like(x, dtype=torch.bool)
    keep[40, 7] = False
    assert torch.equal(q.view(torch.uint8)[keep], reference(clean)[0].view(torch.uint8)[keep])
    x[3, 5] = float("inf")
    q, s = run(x)
    assert s[0] == torch.finfo(torch.float32).max and q[3, 5].float() == 448


@requires_cuda
@pytest.mark.parametrize("accumulate", [True, False])
def test_two_pass_graph_capture_and_replay(accumulate):
    """A CUDA graph of the two passes replays on new data, twice (the second replay must not keep
    the first one's scale); with accumulate the graph zeroes output_s first."""
    y = torch.randn(64, 4096, device="cuda").to(torch.bfloat16)
    q, s = run(y)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        if accumulate:
            s.zero_()
        per_tensor_quant_fp8(y, q, s, accumulate=accumulate)
    replay_on_new_data(graph, y, q, s)


@requires_cuda
@pytest.mark.parametrize("fill", ["zero_", "accumulate=False"])
@pytest.mark.parametrize("tokens", [64, 2048])
def test_early_loads_see_the_producer_in_a_graph(fill, tokens):
    """In a CUDA graph of producer -> (the caller's zero_) -> quantize, replayed on new data: the
    early loads of the quantize pass read what the producer (two or three kernels before it) wrote,
    every replay; a stale read would quantize the previous replay's input."""
    src = torch.randn(tokens, 4096, device="cuda")
    x = torch.empty(tokens, 4096, dtype=torch.bfloat16, device="cuda")
    q = torch.empty(x.shape, dtype=FP8, device="cuda")
    s = torch.zeros(1, device="cuda")

    def step():
        x.copy_(src * 3.0)  # the producer: a kernel writing the input right before the op
        if fill == "zero_":
            s.zero_()
            per_tensor_quant_fp8(x, q, s)
        else:
            per_tensor_quant_fp8(x, q, s, accumulate=False)

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(3):
            step()
    for i in range(4):
        src.copy_(torch.randn_like(src) * (i + 1))
        graph.replay()
        torch.cuda.synchronize()
        assert_bitwise(q, s, x)
        assert torch.equal(x, (src * 3.0).to(torch.bfloat16))


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))
