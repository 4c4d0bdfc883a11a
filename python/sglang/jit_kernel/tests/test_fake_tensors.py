"""Every registered op under a FakeTensorMode outside torch.compile (shape propagation, memory
planning): it takes its torch.library path, whose fake implementation returns outputs of the right
shapes and dtypes, without compiling, launching or reading the fake tensors' (absent) data. Runs
without a GPU: fake CUDA tensors need no device."""

import pytest
import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
)

from sglang.jit_kernel.registry import all_ops
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="stage-a-kernel-cpu")

OPS = sorted(all_ops())


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    return []


@pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")  # references copying layouts
@pytest.mark.parametrize("op", OPS)
def test_op_under_fake_tensor_mode_propagates_shapes(op, monkeypatch):
    monkeypatch.setenv("SGLANG_JIT_CRASH_ON_COMPILE", "1")  # a first call would compile: refuse it
    cases = all_ops()[op].check_cases()
    if not cases:  # register_op's check_cases is optional: such an op has no inputs to trace here
        pytest.skip(f"{op}: registered without check_cases (register_op(..., check_cases=...)): no inputs to trace")
    case = cases[0]
    with FakeTensorMode(allow_non_fake_inputs=True):
        inputs = case.make_inputs()
        try:  # the fp32 reference, where its torch ops have shapes without data (moe_align's have not)
            expected = case.reference(*inputs)
        except (DataDependentOutputException, DynamicOutputShapeException):
            expected = None
        try:
            result = case.call(*inputs)
        except Exception as exc:  # noqa: BLE001 (any failure is the op's: name the rule it breaks)
            pytest.fail(
                f"{op}: a registered op's wrapper takes its torch.library path while "
                "sglang.jit_kernel._validate.tracing() is true (docs/developer_guide/"
                "development_jit_kernel_guide.md, 'Register the op'); under a FakeTensorMode it raised "
                f"{type(exc).__name__}: {exc}"
            )
        compared = case.compared(result, inputs)
    assert all(isinstance(t, FakeTensor) for t in _tensors(result) + [compared])
    if expected is not None:
        assert (compared.shape, compared.dtype) == (expected.shape, expected.dtype)


def _cannot_flatten(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    """A [shape[0], ...] CUDA tensor whose trailing dims do not flatten to one contiguous row."""
    return torch.empty(shape[0], shape[2], shape[1], dtype=dtype, device="cuda").transpose(1, 2)


@pytest.mark.parametrize("case", ["store_cache", "per_token_group_quant"])
def test_layout_refusal_under_fake_tensor_mode_names_the_argument(case):
    """A layout that needs a copy gets the op's RuntimeError naming the argument while tracing too
    (fake tensors' view raises ValueError where real tensors' raises RuntimeError)."""
    from sglang.jit_kernel.kvcache import store_cache
    from sglang.jit_kernel.per_token_group_quant import per_token_group_quant

    with FakeTensorMode():
        if case == "store_cache":
            kv = torch.empty(4, 8, dtype=torch.float16, device="cuda")
            cache = torch.empty(16, 8, dtype=torch.float16, device="cuda")
            indices = torch.arange(4, device="cuda")
            call = lambda: store_cache(kv, kv, _cannot_flatten(16, 4, 2, dtype=torch.float16), cache, indices)  # noqa: E731
            arg = "k_cache"
        else:
            x = torch.empty(2, 2, 512, dtype=torch.bfloat16, device="cuda")
            q = torch.empty(2, 2, 256, dtype=torch.float8_e4m3fn, device="cuda").transpose(0, 1)
            call = lambda: per_token_group_quant(x, q.contiguous().transpose(0, 1), fuse_silu_and_mul=True)  # noqa: E731
            arg = "output_q"
        with pytest.raises(RuntimeError, match=f"{case}: {arg} layout"):
            call()


def test_int_bound_past_float32_is_refused_while_tracing():
    """A plain int is checked while tracing as in eager mode (only symbolic values wait for the
    launcher): -2**200 would become -inf as the kernel's float32 bound."""
    from sglang.jit_kernel.per_token_group_quant_8bit import per_token_group_quant_8bit

    with FakeTensorMode():
        x = torch.empty(4, 256, dtype=torch.bfloat16, device="cuda")
        q = torch.empty(4, 256, dtype=torch.float8_e4m3fn, device="cuda")
        s = torch.empty(4, 2, device="cuda")
        with pytest.raises(ValueError, match="per_token_group_quant_8bit: fp8_min value: expected a magnitude"):
            per_token_group_quant_8bit(x, q, s, 128, 1e-10, -(2**200), 448.0)


def test_dynamic_int_scalar_traces_under_dynamo():
    """torch.compile(dynamic=True, fullgraph=True) traces an op's finite-float32 check of a dynamic
    int (its magnitude only: math.isfinite would break the graph) and reaches the op's own checks;
    on CPU tensors that is the device refusal."""
    from sglang.jit_kernel.fused_qknorm_rope import fused_qk_norm_rope

    qkv = torch.zeros(2, 384, dtype=torch.bfloat16)
    w = torch.ones(128, dtype=torch.bfloat16)
    positions = torch.zeros(2, dtype=torch.int64)

    def f(qkv: torch.Tensor, base: int) -> None:
        fused_qk_norm_rope(qkv, 1, 1, 1, 128, 1e-6, w, w, base, True, positions, 1.0, 1.0, 1.0, 1.0)

    torch._dynamo.reset()
    with pytest.raises(Exception) as info:  # noqa: PT011 (dynamo wraps the op's RuntimeError)
        torch.compile(f, backend="eager", fullgraph=True, dynamic=True)(qkv, 10000)
    assert "qkv device: expected a CUDA device, got cpu" in str(info.value), str(info.value)[:2000]


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))
