"""Aliasing and scalar types across the two paths of the wrappers: outputs whose rows alias (an
expanded cache, qkv or k, or one tensor passed as both caches) are refused before any launch,
naming the argument, with every tensor left as it was; outputs that interleave with an input in
one buffer without sharing an element are taken on every call (the first call's checked path as the
later calls' fast path); a bool where the eager fast paths take a float or an int raises the checked
path's TypeError on every call (the FFI would read True as 1); and a RoPE position outside the cache
rotates by cos = 1, sin = 0 as documented (finite values kept, the partner of an inf NaN)."""

import pytest
import torch

import sglang.jit_kernel.norm as norm
from sglang.jit_kernel.activation import silu_and_mul
from sglang.jit_kernel.concat_mla import concat_mla_k
from sglang.jit_kernel.fused_qknorm_rope import fused_qk_norm_rope
from sglang.jit_kernel.kvcache import set_mla_kv_buffer, store_cache
from sglang.jit_kernel.per_token_quant_fp8 import per_token_quant_fp8
from sglang.jit_kernel.rope import apply_rope_inplace, apply_rope_inplace_with_kvcache, make_cos_sin_cache
from sglang.jit_kernel.scale import scale
from sglang.jit_kernel.testing import requires_cuda
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=30, suite="stage-b-kernel-unit-1-gpu-large")

BF16 = torch.bfloat16


def refused(call, match, *tensors):
    """``call()`` raises RuntimeError matching ``match`` and leaves every tensor byte-identical."""
    before = [t.clone() for t in tensors]
    with pytest.raises(RuntimeError, match=match):
        call()
    torch.cuda.synchronize()
    for t, b in zip(tensors, before):
        assert torch.equal(
            t.view(torch.uint8) if t.dtype.is_floating_point else t,
            b.view(torch.uint8) if b.dtype.is_floating_point else b,
        )


@requires_cuda
def test_store_cache_refuses_aliasing_caches():
    k = torch.randn(4, 256, device="cuda").to(BF16)
    v = torch.randn(4, 256, device="cuda").to(BF16)
    idx = torch.tensor([0, 2, 5, 7], device="cuda")
    cache = torch.zeros(8, 256, dtype=BF16, device="cuda")
    other = torch.zeros(8, 256, dtype=BF16, device="cuda")
    store_cache(k, v, cache, other, idx)  # loads the module: the next calls take the fast path
    refused(lambda: store_cache(k, v, cache, cache, idx), "v_cache", cache)
    expanded = torch.zeros(1, 256, dtype=BF16, device="cuda").expand(8, 256)
    refused(lambda: store_cache(k, v, expanded, other, idx), "k_cache", other)
    rows_overlap = torch.zeros(8 * 128 + 128, dtype=BF16, device="cuda").as_strided((8, 256), (128, 1))
    refused(lambda: store_cache(k, v, other, rows_overlap, idx), "v_cache", other)


@requires_cuda
def test_store_cache_bool_knobs_raise_type_error():
    k = torch.randn(4, 256, device="cuda").to(BF16)
    idx = torch.arange(4, device="cuda")
    kc, vc = torch.zeros(8, 256, dtype=BF16, device="cuda"), torch.zeros(8, 256, dtype=BF16, device="cuda")
    store_cache(k, k, kc, vc, idx)
    kc.zero_()
    for kwargs in ({"num_split": True}, {"row_bytes": True}):
        with pytest.raises(TypeError, match="store_cache"):
            store_cache(k, k, kc, vc, idx, **kwargs)
    torch.cuda.synchronize()
    assert not kc.any(), "written before the error"


@requires_cuda
def test_set_mla_kv_buffer_refuses_an_expanded_buffer():
    nope = torch.randn(3, 512, device="cuda").to(BF16)
    rope = torch.randn(3, 64, device="cuda").to(BF16)
    loc = torch.tensor([0, 1, 2], device="cuda")
    expanded = torch.zeros(1, 576, dtype=BF16, device="cuda").expand(6, 576)
    refused(lambda: set_mla_kv_buffer(expanded, loc, nope, rope), "kv_buffer", nope, rope)


@requires_cuda
def test_concat_mla_k_refuses_an_expanded_k():
    k_nope = torch.randn(2, 128, 128, device="cuda").to(BF16)
    k_rope = torch.randn(2, 1, 64, device="cuda").to(BF16)
    k = torch.zeros(2, 1, 192, dtype=BF16, device="cuda").expand(2, 128, 192)
    refused(lambda: concat_mla_k(k, k_nope, k_rope), "concat_mla", k_nope, k_rope)


def _qknorm_args(qkv):
    d = 128
    qw = torch.randn(d, device="cuda").to(qkv.dtype)
    kw = torch.randn(d, device="cuda").to(qkv.dtype)
    pos = torch.arange(qkv.shape[0], device="cuda")
    return (qkv, 4, 2, 2, d, 1e-6, qw, kw, 1e4, True, pos, 1.0, 0.0, 0.0, 1.0)


@requires_cuda
def test_fused_qk_norm_rope_refuses_overlapping_tokens():
    row = 8 * 128
    expanded = torch.randn(1, row, device="cuda").to(BF16).expand(5, row)
    refused(lambda: fused_qk_norm_rope(*_qknorm_args(expanded)), "qkv", expanded)
    base = torch.randn(5 * 512 + row, device="cuda").to(BF16)
    overlapping = base.as_strided((5, row), (512, 1))  # token stride below the row
    refused(lambda: fused_qk_norm_rope(*_qknorm_args(overlapping)), "qkv", base)
    good = torch.randn(5, row, device="cuda").to(BF16)
    fused_qk_norm_rope(*_qknorm_args(good))  # the same call with tokens of their own runs
    torch.cuda.synchronize()


@requires_cuda
def test_rope_kv_refuses_an_expanded_cache():
    q = torch.randn(2, 4, 128, device="cuda").to(BF16)
    k = torch.randn(2, 2, 128, device="cuda").to(BF16)
    v = torch.randn(2, 2, 128, device="cuda").to(BF16)
    cache = make_cos_sin_cache(64, 128)
    pos = torch.tensor([3, 9], device="cuda")
    loc = torch.tensor([0, 1], device="cuda")
    v_cache = torch.zeros(4, 256, dtype=BF16, device="cuda")
    expanded = torch.zeros(1, 256, dtype=BF16, device="cuda").expand(4, 256)
    refused(
        lambda: apply_rope_inplace_with_kvcache(q, k, v, expanded, v_cache, cache, pos, loc, is_neox=True),
        "k_cache",
        q,
        k,
        v_cache,
    )


@requires_cuda
@pytest.mark.parametrize("op", ["rmsnorm", "rmsnorm_hf", "fused_add_rmsnorm", "fused_inplace_qknorm", "per_token"])
def test_bool_eps_raises_type_error_on_the_fast_path(op):
    x = torch.randn(4, 128, device="cuda").to(BF16)
    w = torch.randn(128, device="cuda").to(BF16)
    if op == "per_token":
        q = torch.empty(4, 128, dtype=torch.float8_e4m3fn, device="cuda")
        s = torch.empty(4, device="cuda")

        def call(eps):
            per_token_quant_fp8(x, q, s, eps=eps)

    elif op == "fused_add_rmsnorm":
        r = torch.randn_like(x)

        def call(eps):
            norm.fused_add_rmsnorm(x, r, w, eps=eps)

    elif op == "fused_inplace_qknorm":
        k = torch.randn(4, 2, 128, device="cuda").to(BF16)
        q3 = x.view(4, 1, 128)

        def call(eps):
            norm.fused_inplace_qknorm(q3, k, w, w, eps=eps)

    else:

        def call(eps):
            getattr(norm, op)(x, w, eps=eps)

    call(1e-6)  # loads the module: the fast path is taken next
    x_before = x.clone()
    with pytest.raises(TypeError, match="eps"):
        call(True)
    torch.cuda.synchronize()
    assert torch.equal(x, x_before)


@requires_cuda
def test_interleaved_outputs_are_taken_on_every_call(monkeypatch):
    """silu_and_mul's out beside its input in each row of one buffer, and per_token_quant_fp8's
    scales packed after the quantized bytes of each row: no element shared, so the checked path
    (forced on the first call by emptying the loaded-launcher tables) and the fast path (the second
    call) both run, with the bits of separate buffers."""
    import sglang.jit_kernel.activation as activation
    import sglang.jit_kernel.per_token_quant_fp8 as ptq

    tokens, hidden = 5, 256
    buf = torch.zeros(tokens, 3 * hidden, dtype=BF16, device="cuda")
    buf[:, : 2 * hidden] = torch.randn(tokens, 2 * hidden, device="cuda").to(BF16)
    expected = silu_and_mul(buf[:, : 2 * hidden].clone())
    x = torch.randn(tokens, hidden, device="cuda").to(BF16)
    q_ref = torch.empty(tokens, hidden, dtype=torch.float8_e4m3fn, device="cuda")
    s_ref = torch.empty(tokens, device="cuda")
    per_token_quant_fp8(x, q_ref, s_ref)
    packed = torch.zeros(tokens, hidden + 4, dtype=torch.uint8, device="cuda")
    q, s = packed[:, :hidden].view(torch.float8_e4m3fn), packed[:, hidden:].view(torch.float32)[:, 0]
    monkeypatch.setitem(activation._FNS, "silu_and_mul", {})  # the first call takes the checked path
    monkeypatch.setattr(ptq, "_FNS", {})
    for _ in range(2):
        buf[:, 2 * hidden :].zero_()
        silu_and_mul(buf[:, : 2 * hidden], out=buf[:, 2 * hidden :])
        assert torch.equal(buf[:, 2 * hidden :], expected)
        packed.zero_()
        per_token_quant_fp8(x, q, s)
        assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
        assert torch.equal(s, s_ref)
    assert activation._FNS["silu_and_mul"] and ptq._FNS, "the second call did not take the fast path"


@requires_cuda
def test_rmsnorm_in_place_with_another_stride_of_the_size_1_dim(monkeypatch):
    """out = input as a [1, hidden] view with another (meaningless) row stride is the same view: the
    checked path (forced on the first call) takes it as the launcher does, and the fast path after."""
    buf = torch.randn(4, 256, device="cuda").to(BF16)
    w = torch.randn(256, device="cuda").to(BF16)
    x = buf[2:3]
    expected = norm.rmsnorm(x.clone(), w)
    original = x.clone()
    monkeypatch.delitem(norm._RMSNORM_FNS, BF16, raising=False)  # the first call takes the checked path
    for _ in range(2):
        x.copy_(original)
        norm.rmsnorm(x, w, out=torch.as_strided(x, (1, 256), (7, 1)))
        assert torch.equal(x, expected)


@requires_cuda
def test_outputs_over_an_input_the_wrapper_copies_are_refused():
    """An input that reaches the launcher as a copy (a strided last dim, a routing bias not fp32
    contiguous) is checked against the outputs by the wrapper's byte-range test: an output sharing
    its memory is refused before any launch, not written over it."""
    from sglang.jit_kernel.moe_topk_softmax import topk_softmax

    b = torch.zeros(2, 256, dtype=BF16, device="cuda")
    b.normal_()
    x = b[:, ::2]  # last stride 2: copied before the launch
    q = b.view(torch.uint8)[:, 2:130].view(torch.float8_e4m3fn)
    s = torch.empty(2, device="cuda")
    refused(lambda: per_token_quant_fp8(x, q, s), r"^per_token_quant_fp8: output_q overlaps input", b, s)

    buf = torch.zeros(16, device="cuda")
    weights = buf.view(4, 4)[:, :2]
    ids = torch.empty(4, 2, dtype=torch.int32, device="cuda")
    bias = buf[1::2]  # 8 experts, stride 2: the launcher would get a contiguous copy
    gating = torch.randn(4, 8, device="cuda")
    refused(
        lambda: topk_softmax(weights, ids, gating, correction_bias=bias),
        r"^topk_softmax: topk_weights overlaps correction_bias",
        buf,
        ids,
    )


@requires_cuda
def test_bools_for_other_scalars_raise_type_error_on_every_call():
    """cast_x_before_out_mul=1 and scale(x, True): TypeError on the first call and again once the
    module is loaded (the fast path would pass them on as numbers)."""
    x = torch.randn(4, 128, device="cuda").to(BF16)
    w = torch.randn(128, device="cuda").to(BF16)
    norm.rmsnorm(x, w)  # loads the module
    scale(x[0], 2.0)
    for _ in range(2):
        with pytest.raises(TypeError, match="cast_x_before_out_mul"):
            norm.rmsnorm(x, w, cast_x_before_out_mul=1)
        with pytest.raises(TypeError, match="factor"):
            scale(x[0], True)


@requires_cuda
@pytest.mark.parametrize("is_neox", [True, False])
def test_out_of_range_position_rotates_by_identity(is_neox):
    """cos = 1, sin = 0 in fp32: finite values keep their value; with an inf in a pair, the inf
    stays and its partner becomes NaN (inf * 0); a NaN makes both NaN."""
    d = 128
    cache = make_cos_sin_cache(16, d)
    q = torch.randn(2, 2, d, device="cuda").to(BF16)
    k = torch.randn(2, 1, d, device="cuda").to(BF16)
    partner = (lambda i: i + d // 2) if is_neox else (lambda i: i ^ 1)
    q[0, 0, 4], q[0, 1, 10] = float("inf"), float("nan")
    q_before, k_before = q.clone(), k.clone()
    apply_rope_inplace(q, k, cache, torch.tensor([16, 16], device="cuda"), is_neox=is_neox)  # both out of range
    torch.cuda.synchronize()
    special = torch.zeros_like(q, dtype=torch.bool)
    for head, i in ((0, 4), (1, 10)):
        special[0, head, i] = special[0, head, partner(i)] = True
    assert torch.equal(q[~special].float(), q_before[~special].float())  # values (-0.0 == +0.0)
    assert torch.equal(k.float(), k_before.float())
    assert q[0, 0, 4] == float("inf") and torch.isnan(q[0, 0, partner(4)])
    assert torch.isnan(q[0, 1, 10]) and torch.isnan(q[0, 1, partner(10)])


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
