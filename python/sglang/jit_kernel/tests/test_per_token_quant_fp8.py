"""per_token_quant_fp8: fp64 references, the kernel's fp32 arithmetic bit for bit, any hidden size,
special values, views, empty and huge inputs, graphs, compile, errors."""

import pytest
import torch
from test_per_token_group_quant_8bit import FLOAT_DTYPES, FP8, assert_on_grid

from sglang.jit_kernel.per_token_quant_fp8 import per_token_quant_fp8, reference
from sglang.jit_kernel.testing import requires_cuda, requires_two_gpus
from sglang.jit_kernel.utils import get_ci_test_range
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=60, suite="stage-b-kernel-unit-1-gpu-large")
register_cuda_ci(est_time=120, suite="nightly-kernel-1-gpu", nightly=True)

FLT_MIN = 2.0**-126
SHAPES = get_ci_test_range(
    full_range=[
        (1, 1),
        (1, 4096),
        (7, 7),
        (129, 129),
        (33, 4097),
        (5, 7168),
        (2048, 4096),
        (3, 16384),
        (2, 40000),
        (600, 1000),
        (300, 129),
    ],
    ci_range=[(1, 1), (1, 4096), (7, 7), (129, 129), (33, 4097), (2, 40000), (600, 1000), (300, 129)],
)
# Rows >= 2 per SM (600 and 300 on a 132-SM H200) take the warp-per-row kernel, fewer the block-per-row one.


def fp64_reference(x: torch.Tensor, eps: float = 1e-10):
    """fp64 arithmetic on the same inputs: s = max(amax, eps) / 448, y = clamp(x / s), q = y rounded
    once; returns ``(q, s, y)``."""
    x64 = x.double()
    s = (x64.abs().amax(-1).clamp_min(eps) / 448.0).clamp_min(FLT_MIN)
    y = (x64 / s.unsqueeze(-1)).clamp(-448, 448)
    return y.float().to(FP8), s, y


def assert_bitwise(q, s, x):
    q_ref, s_ref = reference(x)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(s.reshape(-1), s_ref)


def run(x, scale_shape="flat"):
    m = x.shape[0]
    q = torch.empty(x.shape, dtype=FP8, device=x.device)
    s = torch.full((m,) if scale_shape == "flat" else (m, 1), float("nan"), device=x.device)
    assert per_token_quant_fp8(x, q, s) is None
    return q, s


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scale_shape", ["flat", "column"])
def test_values_against_fp64_and_fp32_arithmetic(dtype, shape, scale_shape):
    m, k = shape
    x = (torch.randn(m, k, device="cuda") * torch.logspace(-2, 2, m, device="cuda").unsqueeze(1)).to(dtype)
    before = x.clone()
    q, s = run(x, scale_shape)
    assert torch.equal(x, before)
    q64, s64, y64 = fp64_reference(x)
    torch.testing.assert_close(s.reshape(-1).double(), s64, rtol=1e-5, atol=0)
    assert_on_grid(q, q64, y64)
    assert_bitwise(q, s, x)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_zero_tiny_inf_nan_rows(dtype):
    """All-zero and tiny rows: s = eps / 448 and zeros; inf: s = FLT_MAX, +-448; NaN ignored by the
    maximum, quantized to NaN. No scale is NaN."""
    x = torch.randn(5, 300, device="cuda").to(dtype)
    x[0] = 0
    x[1] = 1e-30 if dtype == torch.float32 else 0
    x[2, 3] = float("inf")
    x[3, 4] = float("nan")
    q, s = run(x)
    assert torch.isfinite(s).all() and (s > 0).all()
    assert (q.float()[:2] == 0).all()
    assert s[2] == torch.finfo(torch.float32).max and q.float()[2, 3] == 448
    assert torch.isnan(q.float()[3, 4])
    clean = x.clone()
    clean[3, 4] = 0
    q_ref, s_ref = reference(clean)
    assert torch.equal(s[[0, 1, 3, 4]], s_ref[[0, 1, 3, 4]])
    assert torch.equal(q.view(torch.uint8)[4], q_ref.view(torch.uint8)[4])


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("offset", [0, 1, 5])
@pytest.mark.parametrize("k", [129, 4096])
@pytest.mark.parametrize("m", [37, 600])  # block per row, warp per row
def test_strided_offset_views_with_poisoned_outputs(dtype, offset, k, m):
    wide = torch.randn(m, k + 16, dtype=dtype, device="cuda")
    x = wide[:, offset : offset + k]
    q_buffer = torch.full((m, k + 20), 0x7F, dtype=torch.uint8, device="cuda").view(FP8)
    q = q_buffer[:, offset : offset + k]
    s_buffer = torch.full((m, 3), float("nan"), device="cuda")
    s = s_buffer[:, 1]  # stride 3
    per_token_quant_fp8(x, q, s)
    assert_bitwise(q, s, x.contiguous())
    outside = torch.ones(m, k + 20, dtype=torch.bool, device="cuda")
    outside[:, offset : offset + k] = False
    assert (q_buffer.view(torch.uint8)[outside] == 0x7F).all(), "wrote outside output_q"
    assert torch.isnan(s_buffer[:, [0, 2]]).all(), "wrote outside output_s"


@requires_cuda
def test_transposed_and_3d_inputs_match_contiguous():
    x_t = torch.randn(512, 9, dtype=torch.bfloat16, device="cuda").T
    q, s = run(x_t)
    assert_bitwise(q, s, x_t.contiguous())
    x3 = torch.randn(2, 3, 100, dtype=torch.float16, device="cuda")
    q3, s3 = torch.empty(2, 3, 100, dtype=FP8, device="cuda"), torch.empty(2, 3, device="cuda")
    per_token_quant_fp8(x3, q3, s3)
    assert_bitwise(q3.view(6, 100), s3, x3.view(6, 100))


@requires_cuda
def test_zero_rows():
    x = torch.empty(0, 4096, dtype=torch.bfloat16, device="cuda")
    q, s = run(x)
    assert q.shape == (0, 4096) and s.shape == (0,)


@requires_cuda
def test_more_than_2_pow_31_elements():
    k = 8192
    m = (1 << 31) // k + 128
    free, _ = torch.cuda.mem_get_info()
    if free < m * k * 4 + (1 << 30):
        pytest.skip(f"needs {m * k * 4 / 2**30:.0f} GiB free GPU memory, {free / 2**30:.0f} GiB free")
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    q, s = run(x)
    for rows in (slice(0, 64), slice(m - 256, m)):
        assert_bitwise(q[rows], s[rows], x[rows])
    del x, q, s
    torch.cuda.empty_cache()


@requires_cuda
def test_cuda_graph_replay():
    x = torch.randn(64, 4096, dtype=torch.bfloat16, device="cuda")
    q, s = run(x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        per_token_quant_fp8(x, q, s)
    x.copy_(torch.randn_like(x))
    s.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise(q, s, x)


@requires_cuda
def test_torch_compile_fullgraph():
    torch._dynamo.reset()

    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x + 1
        q = torch.empty(y.shape, dtype=FP8, device=y.device)
        s = torch.empty(y.shape[0], 1, device=y.device)
        per_token_quant_fp8(y, q, s)
        return q, s

    x = torch.randn(17, 4096, dtype=torch.bfloat16, device="cuda")
    q, s = torch.compile(f, fullgraph=True)(x)
    q_ref, s_ref = f(x)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s, s_ref)


@requires_two_gpus
def test_second_gpu_while_first_is_current():
    torch.cuda.set_device(0)
    x = torch.randn(33, 4096, dtype=torch.bfloat16, device="cuda:1")
    q, s = run(x)
    assert q.device == x.device
    assert_bitwise(q, s, x)


# ---- errors ----
def test_not_a_tensor_and_cpu():
    with pytest.raises(TypeError, match=r"^per_token_quant_fp8: input type: expected a torch.Tensor, got int$"):
        per_token_quant_fp8(3, None, None)
    x = torch.randn(4, 16)
    with pytest.raises(RuntimeError, match=r"^per_token_quant_fp8: input device: expected a CUDA device, got cpu$"):
        per_token_quant_fp8(x, torch.empty(4, 16, dtype=FP8), torch.empty(4))


@requires_cuda
def test_bad_arguments():
    x = torch.randn(4, 256, dtype=torch.bfloat16, device="cuda")
    q = torch.empty(4, 256, dtype=FP8, device="cuda")
    s = torch.full((4,), -1.0, device="cuda")
    run(x)  # load the module: the eager fast path is tried first
    op = r"^per_token_quant_fp8: "
    cases = [
        ((x, q.view(torch.int8), s), RuntimeError, r"output_q dtype: expected float8_e4m3fn, got int8"),
        ((x, q, s.half()), RuntimeError, r"output_s dtype: expected float32, got float16"),
        ((x, q[:2], s), RuntimeError, r"output_q shape: expected \(4, 256\) \(the shape of input\), got \(2, 256\)"),
        ((x, q, s[:3]), RuntimeError, r"output_s shape: expected \[dim0=4, 1=1\], got \(3,\)"),
        ((x, q.T.contiguous().T, s), RuntimeError, r"output_q last-dim stride: expected 1"),
        ((x, q, x.view(torch.float32)[0, :4]), RuntimeError, r"output_s overlaps input: expected disjoint memory"),
    ]
    for args, error, pattern in cases:
        with pytest.raises(error, match=op + pattern):
            per_token_quant_fp8(*args)
    with pytest.raises(ValueError, match=op + r"eps value: expected >= 0.0, got -1.0$"):
        per_token_quant_fp8(x, q, s, eps=-1.0)
    with pytest.raises(TypeError, match=op + r"eps type: expected a real number \(int or float\), got str$"):
        per_token_quant_fp8(x, q, s, eps="1")
    assert (s == -1).all(), "an output was written before the error"
    # [2, 3, K] input: output_s with the leading dims swapped has the right count but not the shape
    x3 = torch.randn(2, 3, 256, dtype=torch.bfloat16, device="cuda")
    q3 = torch.empty(2, 3, 256, dtype=FP8, device="cuda")
    s3 = torch.full((3, 2), -1.0, device="cuda")
    with pytest.raises(RuntimeError, match=op + r"output_s shape: expected \[dim0=2, dim1=3, 1=1\], got \(3, 2\)"):
        per_token_quant_fp8(x3, q3, s3)
    assert (s3 == -1).all()
    per_token_quant_fp8(x, q, s, eps=2**70)  # an int past int64: a real number, passed on as a float
    assert torch.equal(s, torch.full_like(s, 2.0**70) / 448)  # every row's floor is eps
    assert ((q.view(torch.uint8) & 0x7F) == 0).all()  # |x| / s underflows: +-0


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))
