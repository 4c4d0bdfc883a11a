"""apply_rope_inplace_with_kvcache (and FusedSetKVBufferArg) into float8_e4m3fn caches: q and k bit for
bit those of apply_rope_inplace, the caches bit for bit store_cache_quant's bytes of the rotated k and of
v (device scales, inverse scales), sentinel-filled caches (every slot not addressed keeps its bytes),
narrow vectors, out-of-range slots, empty inputs, graphs, compile and every error case."""

import pytest
import torch

from sglang.jit_kernel.kvcache import reference_store_cache_quant
from sglang.jit_kernel.rope import (
    FusedSetKVBufferArg,
    apply_rope_inplace,
    apply_rope_inplace_with_kvcache,
    apply_rope_with_cos_sin_cache_inplace,
    make_cos_sin_cache,
    rope_reference,
)
from sglang.jit_kernel.testing import (
    ROPE_KV_KERNEL_SHAPES,
    SENTINEL_BYTE,
    assert_bits_equal,
    assert_close,
    requires_cuda,
    sentinel_filled,
)
from sglang.jit_kernel.utils import get_ci_test_range
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=60, suite="stage-b-kernel-unit-1-gpu-large")
register_cuda_ci(est_time=180, suite="nightly-kernel-1-gpu", nightly=True)

FP8 = torch.float8_e4m3fn
MAX_POS = 4096
DTYPES = get_ci_test_range(
    full_range=[torch.bfloat16, torch.float16, torch.float32], ci_range=[torch.bfloat16, torch.float32]
)
# (head_dim, rope_dim): full, partial (an unrotated rest of k), R/2 not a multiple of 8 (one-element path)
DIMS = get_ci_test_range(
    full_range=[(64, 64), (128, 128), (128, 64), (256, 80), (96, 96), (128, 36)],
    ci_range=[(128, 128), (128, 64), (256, 80), (128, 36)],
)
HEADS = [(32, 8), (8, 1)]
TOKENS = get_ci_test_range(full_range=[1, 7, 129, 2048], ci_range=[1, 7, 129])


def inputs(n, hq, hk, d, r, dtype, slots):
    q = (torch.randn(n, hq, d, device="cuda") * 30).to(dtype)
    k = (torch.randn(n, hk, d, device="cuda") * 30).to(dtype)
    v = (torch.randn(n, hk, d, device="cuda") * 30).to(dtype)
    cache = make_cos_sin_cache(MAX_POS, r)
    positions = torch.randint(0, MAX_POS, (n,), device="cuda")
    k_cache, v_cache = sentinel_filled((slots, hk * d), FP8), sentinel_filled((slots, hk * d), FP8)
    loc = torch.randperm(slots, device="cuda")[:n]
    return q, k, v, cache, positions, k_cache, v_cache, loc


def inv_of(scale, inv_scale):
    if scale is not None:
        return 1.0 / scale.reshape(())
    return torch.tensor(inv_scale, dtype=torch.float32, device="cuda")


def expected_cache(cache, x, inv, loc):
    """``cache`` as bytes with the addressed valid rows set to store_cache_quant's bytes of ``x``."""
    expected = cache.view(torch.uint8).reshape(cache.shape[0], -1).clone()
    slots = loc.long()
    valid = (slots >= 0) & (slots < cache.shape[0])
    expected[slots[valid]] = reference_store_cache_quant(x.reshape(x.shape[0], -1), inv)[valid]
    return expected


def run_and_check(
    q, k, v, cache, positions, k_cache, v_cache, loc, *, is_neox, r, k_scale=None, v_scale=None, ki=1.0, vi=1.0
):
    """The fp8 KV op against apply_rope_inplace on copies of q and k (bit for bit), then the caches
    against store_cache_quant's bytes of the rotated k and of v; v and the scales unchanged."""
    q_ref, k_ref = q.clone(), k.clone()
    apply_rope_inplace(q_ref, k_ref, cache, positions, is_neox=is_neox, rope_dim=r)
    expected_k = expected_cache(k_cache, k_ref, inv_of(k_scale, ki), loc)
    expected_v = expected_cache(v_cache, v, inv_of(v_scale, vi), loc)
    kept = [t.clone() for t in (v, positions, loc) + tuple(s for s in (k_scale, v_scale) if s is not None)]
    apply_rope_inplace_with_kvcache(
        q,
        k,
        v,
        k_cache,
        v_cache,
        cache,
        positions,
        loc,
        is_neox=is_neox,
        rope_dim=r,
        k_scale=k_scale,
        v_scale=v_scale,
        k_inv_scale=ki,
        v_inv_scale=vi,
    )
    assert_bits_equal(q, q_ref)
    assert_bits_equal(k, k_ref)
    assert_bits_equal(k_cache.view(torch.uint8).reshape(k_cache.shape[0], -1), expected_k)
    assert_bits_equal(v_cache.view(torch.uint8).reshape(v_cache.shape[0], -1), expected_v)
    for t, b in zip((v, positions, loc) + tuple(s for s in (k_scale, v_scale) if s is not None), kept):
        assert_bits_equal(t, b)


# ---- values ----
@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("d,r", DIMS)
@pytest.mark.parametrize("hq,hk", HEADS)
@pytest.mark.parametrize("n", TOKENS)
@pytest.mark.parametrize("loc_dtype", [torch.int64, torch.int32])
def test_rope_fp8_kvcache_values(dtype, is_neox, d, r, hq, hk, n, loc_dtype):
    q, k, v, cache, positions, k_cache, v_cache, loc = inputs(n, hq, hk, d, r, dtype, 2 * n + 3)
    run_and_check(
        q,
        k,
        v,
        cache,
        positions,
        k_cache,
        v_cache,
        loc.to(loc_dtype),
        is_neox=is_neox,
        r=r,
        k_scale=torch.tensor([0.37], device="cuda"),
        vi=1 / 1.7,
    )


@requires_cuda
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n,hq,hk,d,r", ROPE_KV_KERNEL_SHAPES)  # rope.cuh's KV kernels, here with the quantizing store
def test_rope_fp8_kvcache_every_kernel(is_neox, dtype, n, hq, hk, d, r):
    """Each KV kernel the launcher picks, with skipped rows (out_loc -1) and positions outside the
    cos/sin cache, against apply_rope_inplace and store_cache_quant's bytes."""
    q, k, v, cache, positions, k_cache, v_cache, loc = inputs(n, hq, hk, d, r, dtype, 2 * n + 3)
    positions[::5] = -2
    loc[1::4] = -1
    run_and_check(
        q, k, v, cache, positions, k_cache, v_cache, loc, is_neox=is_neox, r=r, k_scale=torch.tensor([0.37], device="cuda"), vi=0.6
    )  # fmt: skip


@requires_cuda
def test_rope_fp8_kvcache_rotation_against_fp32_reference():
    """The rotation itself against the independent fp32 reference (one rounding to the dtype)."""
    q, k, v, cache, positions, k_cache, v_cache, loc = inputs(33, 8, 2, 128, 128, torch.bfloat16, 80)
    eq, ek = rope_reference(q, cache, positions, True), rope_reference(k, cache, positions, True)
    apply_rope_inplace_with_kvcache(q, k, v, k_cache, v_cache, cache, positions, loc, is_neox=True)
    assert_close(q, eq)
    assert_close(k, ek)


@requires_cuda
@pytest.mark.parametrize("scales", ["tensors", "floats", "default", "mixed"])
def test_rope_fp8_kvcache_scale_forms(scales):
    kw = {
        "tensors": {"k_scale": torch.tensor([0.37], device="cuda"), "v_scale": torch.tensor(3.0, device="cuda")},
        "floats": {"ki": 2.5, "vi": 1 / 3},
        "default": {},
        "mixed": {"ki": 0.125, "v_scale": torch.tensor([1.7], device="cuda")},
    }[scales]
    run_and_check(*inputs(20, 8, 2, 128, 128, torch.bfloat16, 50), is_neox=True, r=128, **kw)


@requires_cuda
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("offset", [1, 2, 4])
def test_rope_fp8_kvcache_unaligned_views_take_the_narrow_path(is_neox, offset):
    """q, k, v and the caches at element offsets inside wider buffers (vectors of 1, 2 and 4
    elements); the bytes around the cache rows keep the sentinel."""
    n, hq, hk, d, slots = 9, 4, 2, 128, 30
    qb = torch.randn(n, hq * d + 8, device="cuda").to(torch.bfloat16)
    kb = torch.randn(n, hk * d + 8, device="cuda").to(torch.bfloat16)
    vb = torch.randn(n, hk * d + 8, device="cuda").to(torch.bfloat16)
    q = qb[:, offset : offset + hq * d].view(n, hq, d)
    k = kb[:, offset : offset + hk * d].view(n, hk, d)
    v = vb[:, offset : offset + hk * d].view(n, hk, d)
    kcb, vcb = sentinel_filled((slots, hk * d + 16), FP8), sentinel_filled((slots, hk * d + 16), FP8)
    k_cache, v_cache = kcb[:, offset : offset + hk * d], vcb[:, offset : offset + hk * d]
    cache, positions = make_cos_sin_cache(MAX_POS, d), torch.randint(0, MAX_POS, (n,), device="cuda")
    loc = torch.randperm(slots, device="cuda")[:n]
    before_k, before_v = kcb.clone(), vcb.clone()
    run_and_check(q, k, v, cache, positions, k_cache, v_cache, loc, is_neox=is_neox, r=d, ki=0.5, vi=2.0)
    outside = torch.ones(kcb.shape, dtype=torch.bool, device="cuda")
    outside[:, offset : offset + hk * d] = False
    assert_bits_equal(kcb.view(torch.uint8)[outside], before_k.view(torch.uint8)[outside])
    assert_bits_equal(vcb.view(torch.uint8)[outside], before_v.view(torch.uint8)[outside])


@requires_cuda
def test_rope_fp8_kvcache_bad_locs_3d_caches_and_empty():
    n, hq, hk, d, slots = 16, 8, 2, 128, 40
    q, k, v, cache, positions, _, _, _ = inputs(n, hq, hk, d, d, torch.float16, slots)
    k_cache, v_cache = sentinel_filled((slots, hk, d), FP8), sentinel_filled((slots, hk, d), FP8)
    loc = torch.arange(n, device="cuda") * 2
    loc[3], loc[9] = slots, -5
    run_and_check(q, k, v, cache, positions, k_cache, v_cache, loc, is_neox=True, r=d, ki=0.25, vi=4.0)
    e = torch.empty(0, hq, d, dtype=torch.float16, device="cuda")
    ek, ev = (
        torch.empty(0, hk, d, dtype=torch.float16, device="cuda"),
        torch.empty(0, hk, d, dtype=torch.float16, device="cuda"),
    )
    before = k_cache.clone()
    apply_rope_inplace_with_kvcache(
        e, ek, ev, k_cache, v_cache, cache, positions[:0], loc[:0], is_neox=True, k_inv_scale=2.0
    )
    torch.cuda.synchronize()
    assert_bits_equal(k_cache, before)


@requires_cuda
@pytest.mark.parametrize("n", [1, 300])  # the early kernel's v rows, the split copy's
def test_rope_fp8_kvcache_no_slots_with_unaligned_v(n):
    """Caches of 0 slots: q and k rotated as apply_rope_inplace, nothing stored, and v (2 bytes off
    16, read by the v rows before they find no slot) loaded at a width it allows."""
    hq, hk, d = 8, 2, 128
    q, k, _, cache, positions, _, _, loc = inputs(n, hq, hk, d, d, torch.bfloat16, n)
    v = torch.randn(n * hk * d + 1, device="cuda").to(torch.bfloat16)[1:].view(n, hk, d)
    empty = torch.empty(0, hk * d, dtype=FP8, device="cuda")
    q_ref, k_ref = q.clone(), k.clone()
    apply_rope_inplace(q_ref, k_ref, cache, positions, is_neox=True)
    apply_rope_inplace_with_kvcache(q, k, v, empty, empty.clone(), cache, positions, loc, is_neox=True, v_inv_scale=0.5)
    torch.cuda.synchronize()
    assert_bits_equal(q, q_ref)
    assert_bits_equal(k, k_ref)


@requires_cuda
def test_rope_fp8_kvcache_fused_set_kv_buffer_arg():
    n, hq, hk, d = 7, 8, 2, 128
    q, k, v, cache, positions, k_cache, v_cache, loc = inputs(n, hq, hk, d, d, torch.bfloat16, 20)
    ks = torch.tensor([0.5], device="cuda")
    q_ref, k_ref = q.clone(), k.clone()
    apply_rope_inplace(q_ref, k_ref, cache, positions, is_neox=True)
    expected_k, expected_v = (
        expected_cache(k_cache, k_ref, 1.0 / ks, loc),
        expected_cache(v_cache, v, inv_of(None, 3.0), loc),
    )
    args = FusedSetKVBufferArg(
        value=v.view(n, hk * d), k_buffer=k_cache, v_buffer=v_cache, cache_loc=loc, k_scale=ks, v_inv_scale=3.0
    )
    apply_rope_with_cos_sin_cache_inplace(q, k, cache, positions, is_neox=True, fused_args=args)
    assert_bits_equal(q, q_ref)
    assert_bits_equal(k_cache.view(torch.uint8), expected_k)
    assert_bits_equal(v_cache.view(torch.uint8), expected_v)


# ---- graphs, compile ----
@requires_cuda
def test_rope_fp8_kvcache_cuda_graph():
    """Captured once, replayed with new q, k, v, scale values, positions and slots in the same buffers."""
    n, hq, hk, d = 32, 8, 2, 128
    q, k, v, cache, positions, k_cache, v_cache, loc = inputs(n, hq, hk, d, d, torch.bfloat16, 100)
    ks, vs = torch.tensor([0.37], device="cuda"), torch.tensor([1.7], device="cuda")

    def call():
        apply_rope_inplace_with_kvcache(
            q, k, v, k_cache, v_cache, cache, positions, loc, is_neox=True, k_scale=ks, v_scale=vs
        )

    call()  # load outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for t in (q, k, v):
        t.copy_(torch.randn(t.shape, device="cuda") * 30)
    ks.fill_(0.9)
    vs.fill_(2.5)
    positions.copy_(torch.randint(0, MAX_POS, (n,), device="cuda"))
    loc.copy_(torch.randperm(100, device="cuda")[:n])
    loc[::5] = -1
    k_cache.view(torch.uint8).fill_(SENTINEL_BYTE)
    v_cache.view(torch.uint8).fill_(SENTINEL_BYTE)
    q_ref, k_ref = q.clone(), k.clone()
    apply_rope_inplace(q_ref, k_ref, cache, positions, is_neox=True)
    expected_k, expected_v = expected_cache(k_cache, k_ref, 1.0 / ks, loc), expected_cache(v_cache, v, 1.0 / vs, loc)
    graph.replay()
    torch.cuda.synchronize()
    assert_bits_equal(q, q_ref)
    assert_bits_equal(k_cache.view(torch.uint8), expected_k)
    assert_bits_equal(v_cache.view(torch.uint8), expected_v)


@requires_cuda
def test_rope_fp8_kvcache_torch_compile_fullgraph():
    torch._dynamo.reset()

    def f(q, k, v, k_cache, v_cache, cache, positions, loc, ks):
        apply_rope_inplace_with_kvcache(
            q, k, v * 2, k_cache, v_cache, cache, positions, loc, is_neox=False, k_scale=ks, v_inv_scale=0.5
        )
        return k_cache.float().sum(dim=-1)

    n, hq, hk, d = 16, 8, 2, 128
    q, k, v, cache, positions, k_cache, v_cache, loc = inputs(n, hq, hk, d, d, torch.bfloat16, 40)
    ks = torch.tensor([0.37], device="cuda")
    q_ref, k_ref = q.clone(), k.clone()
    apply_rope_inplace(q_ref, k_ref, cache, positions, is_neox=False)
    expected_k, expected_v = (
        expected_cache(k_cache, k_ref, 1.0 / ks, loc),
        expected_cache(v_cache, v * 2, inv_of(None, 0.5), loc),
    )
    sums = torch.compile(f, fullgraph=True)(q, k, v, k_cache, v_cache, cache, positions, loc, ks)
    assert_bits_equal(q, q_ref)
    assert_bits_equal(k_cache.view(torch.uint8), expected_k)
    assert_bits_equal(v_cache.view(torch.uint8), expected_v)
    torch.testing.assert_close(sums, expected_k.view(FP8).float().sum(dim=-1))


# ---- errors (raised before any launch, nothing written) ----
def _args():
    return list(inputs(8, 4, 2, 64, 64, torch.bfloat16, 16))


@requires_cuda
@pytest.mark.parametrize(
    "position,replacement,kwargs,exc,pattern",
    [
        (
            5,
            lambda a: a[5].view(torch.uint8),
            lambda: {},
            RuntimeError,
            r"k_cache dtype: expected one of bfloat16, float8_e4m3fn, got uint8$",
        ),
        (
            6,
            lambda a: sentinel_filled((16, 128), torch.bfloat16),
            lambda: {},
            RuntimeError,
            r"v_cache dtype: expected float8_e4m3fn \(the dtype of k_cache\), got bfloat16$",
        ),
        (
            6,
            lambda a: sentinel_filled((17, 128), FP8),
            dict,
            RuntimeError,
            r"v_cache shape: expected \[cache_size=16, ",
        ),
        (
            None,
            None,
            lambda: {"k_scale": torch.tensor([1.0], device="cuda").half()},
            RuntimeError,
            r"k_scale dtype: expected float32, got float16$",
        ),
        (
            None,
            None,
            lambda: {"v_scale": torch.ones(2, device="cuda")},
            RuntimeError,
            r"v_scale shape: expected \[1\] or \[\] \(one float32 on the device\), got \(2,\)$",
        ),
        (
            None,
            None,
            lambda: {"k_scale": torch.ones(1)},
            RuntimeError,
            r"k_scale device: expected a CUDA device, got cpu$",
        ),
        (None, None, lambda: {"k_scale": 0.5}, TypeError, r"k_scale type: expected a torch.Tensor, got float$"),
        (
            None,
            None,
            lambda: {"v_scale": torch.ones(1, device="cuda"), "v_inv_scale": 2.0},
            ValueError,
            r"v_inv_scale value: expected 1.0 \(the default\) when v_scale is given, got 2.0$",
        ),
        (None, None, lambda: {"k_inv_scale": "2"}, TypeError, r"k_inv_scale type: expected a real number"),
    ],
)
def test_rope_fp8_kvcache_bad_inputs(position, replacement, kwargs, exc, pattern):
    q, k, v, cache, positions, k_cache, v_cache, loc = args = _args()
    if position is not None:
        args[position] = replacement(args)
    q, k, v, cache, positions, k_cache, v_cache, loc = args
    snaps = [t.clone() for t in (q, k, k_cache, v_cache)]
    with pytest.raises(exc, match="^apply_rope_inplace_with_kvcache: " + pattern):
        apply_rope_inplace_with_kvcache(q, k, v, k_cache, v_cache, cache, positions, loc, is_neox=True, **kwargs())
    torch.cuda.synchronize()
    for t, b in zip((q, k, k_cache, v_cache), snaps):
        assert_bits_equal(t, b)


@requires_cuda
@pytest.mark.parametrize("rotated", ["q", "k"])
@pytest.mark.parametrize("arg", ["k_scale", "v_scale"])
def test_rope_fp8_kvcache_scale_sharing_q_or_k_raises(rotated, arg):
    """q and k are rotated in place while every CTA reads the scales: a scale inside either raises."""
    q, k, v, cache, positions, k_cache, v_cache, loc = _args()
    scale = (q if rotated == "q" else k)[0, 0, 0:2].view(torch.float32)
    snaps = [t.clone() for t in (q, k, k_cache, v_cache)]
    with pytest.raises(RuntimeError, match=rf"^apply_rope_inplace_with_kvcache: .*{rotated} overlaps {arg}"):
        apply_rope_inplace_with_kvcache(q, k, v, k_cache, v_cache, cache, positions, loc, is_neox=True, **{arg: scale})
    torch.cuda.synchronize()
    for t, b in zip((q, k, k_cache, v_cache), snaps):
        assert_bits_equal(t, b)


@requires_cuda
def test_rope_fp8_kvcache_scales_with_caches_of_the_model_dtype_are_refused():
    q, k, v, cache, positions, _, _, loc = _args()
    k_cache, v_cache = (
        torch.zeros(16, 128, dtype=torch.bfloat16, device="cuda"),
        torch.zeros(16, 128, dtype=torch.bfloat16, device="cuda"),
    )
    with pytest.raises(
        ValueError, match=r"^apply_rope_inplace_with_kvcache: k_scale value: expected None for caches of bfloat16"
    ):
        apply_rope_inplace_with_kvcache(
            q, k, v, k_cache, v_cache, cache, positions, loc, is_neox=True, k_scale=torch.ones(1, device="cuda")
        )
    with pytest.raises(
        ValueError, match=r"^apply_rope_inplace_with_kvcache: v_inv_scale value: expected 1.0 for caches of bfloat16"
    ):
        apply_rope_inplace_with_kvcache(q, k, v, k_cache, v_cache, cache, positions, loc, is_neox=True, v_inv_scale=2.0)
    assert not k_cache.any() and not v_cache.any()


@requires_cuda
def test_rope_fp8_kvcache_ffi_rejects_mismatch_from_cpp():
    """The fp8 launcher's own checks: a cache of the model dtype, a bad scale, a scale and an inverse
    scale together, a cache overlapping a scale."""
    from sglang.jit_kernel.rope import _jit_apply_rope_inplace_with_kvcache_module

    fn = _jit_apply_rope_inplace_with_kvcache_module(torch.bfloat16, FP8).apply_rope_inplace_with_kvcache
    q, k, v, cache, positions, k_cache, v_cache, loc = _args()
    base = (q, k, v, k_cache, v_cache, cache, positions, loc, True, 0, -1)
    ks = torch.ones(1, device="cuda")
    with pytest.raises(RuntimeError, match="k_cache"):
        fn(q, k, v, k_cache.view(torch.uint8), v_cache, cache, positions, loc, True, 0, -1, None, None, 1.0, 1.0)
    with pytest.raises(RuntimeError, match="k_scale"):
        fn(*base, ks.half(), None, 1.0, 1.0)
    with pytest.raises(RuntimeError, match="v_scale"):
        fn(*base, None, ks, 1.0, 2.0)
    with pytest.raises(RuntimeError, match="overlaps"):
        fn(*base, k_cache.view(torch.uint8)[0, :4].view(torch.float32), None, 1.0, 1.0)


@pytest.mark.parametrize("arg", ["k_inv_scale", "v_inv_scale"])
def test_rope_fp8_kvcache_inv_scale_int_past_the_float_range(arg):
    """An int inverse scale too large for a float raised a bare OverflowError from float(); now the
    ValueError naming it. The op reaches this check only on CUDA (q's device is checked first), so the
    shared check is called as apply_rope_inplace_with_kvcache calls it."""
    from sglang.jit_kernel._validate import check_static_scale

    op = "apply_rope_inplace_with_kvcache"
    q = torch.zeros(4, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=rf"^{op}: {arg} value: expected a real number in the float range"):
        check_static_scale(op, arg.replace("_inv", ""), None, arg, -(10**400), (q, "q"))


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))
