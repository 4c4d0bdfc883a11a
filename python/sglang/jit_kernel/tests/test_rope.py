"""RoPE ops: apply_rope_inplace, apply_rope_inplace_with_kvcache, apply_rope_with_cos_sin_cache_inplace
and rotary_embedding against fp32 references (NeoX and GPT-J written apart), views, out-of-range
indices, graphs, compile, errors."""

import sys

import pytest
import torch

from sglang.jit_kernel.rope import (
    FusedSetKVBufferArg,
    apply_rope_inplace,
    apply_rope_inplace_with_kvcache,
    apply_rope_with_cos_sin_cache_inplace,
    make_cos_sin_cache,
    rotary_embedding,
    rotary_embedding_with_key,
    rotary_embedding_without_key,
)
from sglang.jit_kernel.testing import (
    FLOAT_DTYPES,
    ROPE_KV_KERNEL_SHAPES,
    TOLERANCE,
    assert_close,
    poisoned,
    requires_cuda,
    requires_two_gpus,
)
from sglang.jit_kernel.utils import get_ci_test_range
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=90, suite="stage-b-kernel-unit-1-gpu-large")
register_cuda_ci(est_time=300, suite="nightly-kernel-1-gpu", nightly=True)

MAX_POS = 8192
TOKENS = get_ci_test_range(full_range=[0, 1, 7, 129, 8192], ci_range=[1, 7, 129])
HEADS = [(32, 8), (64, 1), (8, 8)]
# (head_dim, rope_dim): full, partial, awkward (R/2 not a multiple of 8: narrower vectors)
DIMS = get_ci_test_range(
    full_range=[(64, 64), (80, 80), (96, 96), (128, 128), (128, 64), (256, 256), (256, 80), (512, 512), (512, 96)],
    ci_range=[(64, 64), (128, 128), (128, 64), (256, 80), (512, 512)],
)


KV_DIMS = get_ci_test_range(
    full_range=[(64, 64), (128, 128), (128, 64), (256, 80), (512, 512)], ci_range=[(128, 128), (256, 80)]
)
DTYPES = get_ci_test_range(full_range=list(FLOAT_DTYPES), ci_range=[torch.bfloat16, torch.float32])


# ---- independent fp32 references ----
def cos_sin_of(cache: torch.Tensor, positions: torch.Tensor, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, 1, R/2] cos and sin (fp32) of each token; (1, 0) for a position outside the cache."""
    pos = positions.long()
    valid = ((pos >= 0) & (pos < cache.shape[0]))[:, None]
    row = cache.float()[pos.clamp(0, cache.shape[0] - 1)]
    cos = torch.where(valid, row[:, : r // 2], torch.ones_like(row[:, : r // 2]))
    sin = torch.where(valid, row[:, r // 2 : r], torch.zeros_like(row[:, : r // 2]))
    return cos[:, None, :], sin[:, None, :]


def neox_reference(x: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor, r: int) -> torch.Tensor:
    """NeoX: pairs (x[i], x[i + R/2]); fp32, rounded once."""
    cos, sin = cos_sin_of(cache, positions, r)
    xf = x.float()
    x1, x2 = xf[..., : r // 2], xf[..., r // 2 : r]
    rotated = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return torch.cat([rotated, xf[..., r:]], dim=-1).to(x.dtype)


def gptj_reference(x: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor, r: int) -> torch.Tensor:
    """GPT-J: pairs (x[2i], x[2i + 1]); fp32, rounded once."""
    cos, sin = cos_sin_of(cache, positions, r)
    xf = x.float()
    pairs = xf[..., :r].unflatten(-1, (r // 2, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)
    return torch.cat([rotated, xf[..., r:]], dim=-1).to(x.dtype)


def reference(x, cache, positions, r, is_neox):
    return (neox_reference if is_neox else gptj_reference)(x, cache, positions, r)


def make_inputs(n, hq, hk, d, r, dtype, pos_dtype=torch.int64):
    q = torch.randn(n, hq, d, dtype=dtype, device="cuda")
    k = torch.randn(n, hk, d, dtype=dtype, device="cuda")
    cache = make_cos_sin_cache(MAX_POS, r)
    positions = torch.randint(0, MAX_POS, (n,), device="cuda", dtype=pos_dtype)
    return q, k, cache, positions


# ---- apply_rope_inplace ----
@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("d,r", DIMS)
@pytest.mark.parametrize("hq,hk", HEADS)
@pytest.mark.parametrize("n", TOKENS)
def test_apply_rope_inplace(dtype, is_neox, d, r, hq, hk, n):
    q, k, cache, positions = make_inputs(n, hq, hk, d, r, dtype)
    expected_q, expected_k = reference(q, cache, positions, r, is_neox), reference(k, cache, positions, r, is_neox)
    cache_before = cache.clone()
    apply_rope_inplace(q, k, cache, positions, is_neox=is_neox, rope_dim=r if r != d else 0)
    assert_close(q, expected_q)
    assert_close(k, expected_k)
    assert torch.equal(cache, cache_before)


@requires_cuda
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("is_neox", [True, False])
def test_apply_rope_position_dtypes_and_narrow_rope_dim(pos_dtype, is_neox):
    """rope_dim below the cache width: only the first R columns of the cache rows are used."""
    n, d, r = 33, 128, 64
    q, k, _, positions = make_inputs(n, 4, 2, d, r, torch.bfloat16, pos_dtype)
    wide = make_cos_sin_cache(MAX_POS, 96)  # width 96: cos in [:48]; with R = 64 cos is [:32], sin [32:64]
    expected_q = reference(q, wide, positions, r, is_neox)
    expected_k = reference(k, wide, positions, r, is_neox)
    apply_rope_inplace(q, k, wide, positions, is_neox=is_neox, rope_dim=r)
    assert_close(q, expected_q)
    assert_close(k, expected_k)


@requires_cuda
def test_styles_differ():
    q, k, cache, positions = make_inputs(16, 4, 2, 128, 128, torch.float32)
    positions.fill_(1000)  # every pair rotated by a non-trivial angle
    q2, k2 = q.clone(), k.clone()
    apply_rope_inplace(q, k, cache, positions, is_neox=True)
    apply_rope_inplace(q2, k2, cache, positions, is_neox=False)
    assert not torch.allclose(q, q2), "NeoX and GPT-J gave the same result"
    assert not torch.allclose(k, k2), "NeoX and GPT-J gave the same result"


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
def test_fused_qkv_views_with_own_strides(dtype, is_neox):
    """q and k views of one qkv buffer inside a poisoned allocation; v and the padding untouched."""
    n, hq, hk, d = 129, 8, 2, 128
    pad = 64
    row = (hq + 2 * hk) * d + pad
    buffer = poisoned((n + 2, row), dtype)
    qkv = buffer[1 : n + 1, : (hq + 2 * hk) * d]
    qkv.copy_(torch.randn(n, (hq + 2 * hk) * d, dtype=dtype, device="cuda"))
    before = buffer.clone()
    q = qkv[:, : hq * d].view(n, hq, d)
    k = qkv[:, hq * d : (hq + hk) * d].view(n, hk, d)
    _, _, cache, positions = make_inputs(n, 1, 1, d, d, dtype)
    eq, ek = reference(q, cache, positions, d, is_neox), reference(k, cache, positions, d, is_neox)
    apply_rope_inplace(q, k, cache, positions, is_neox=is_neox)
    assert_close(q, eq)
    assert_close(k, ek)
    untouched = torch.ones_like(buffer, dtype=torch.bool)
    untouched[1 : n + 1, : (hq + hk) * d] = False
    # v, the row padding and the poison rows around qkv are untouched (NaN poison compares via isnan)
    assert torch.equal(buffer[untouched].isnan(), before[untouched].isnan())
    assert torch.equal(torch.nan_to_num(buffer[untouched]), torch.nan_to_num(before[untouched]))


@requires_cuda
@pytest.mark.parametrize("is_neox", [True, False])
def test_q_wider_buffer_k_separate_and_partial_views(is_neox):
    """q as q_full[..., :R] of a wider head (head stride != head_dim), k a separate tensor with
    another token stride; the elements past R stay as they were."""
    n, hq, hk, d, r = 65, 16, 4, 256, 64
    q_full = torch.randn(n, hq, d, dtype=torch.bfloat16, device="cuda")
    k_full = torch.randn(n, hk, d + 32, dtype=torch.bfloat16, device="cuda")
    q, k = q_full[..., :r], k_full[..., :r]
    _, _, cache, positions = make_inputs(n, 1, 1, r, r, torch.bfloat16)
    eq, ek = reference(q, cache, positions, r, is_neox), reference(k, cache, positions, r, is_neox)
    q_rest, k_rest = q_full[..., r:].clone(), k_full[..., r:].clone()
    apply_rope_inplace(q, k, cache, positions, is_neox=is_neox)
    assert_close(q, eq)
    assert_close(k, ek)
    assert torch.equal(q_full[..., r:], q_rest) and torch.equal(k_full[..., r:], k_rest)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("offset", [1, 2, 4])
def test_unaligned_views(dtype, offset):
    """Data pointers off 16-byte alignment: narrower vectors, same answer, nothing written outside."""
    n, hq, hk, d = 31, 4, 2, 128
    base_q = poisoned((n * hq * d + 2 * offset,), dtype)
    q = base_q[offset : offset + n * hq * d].view(n, hq, d)
    q.copy_(torch.randn(n, hq, d, dtype=dtype, device="cuda"))
    _, k, cache, positions = make_inputs(n, hq, hk, d, d, dtype)
    eq, ek = neox_reference(q, cache, positions, d), neox_reference(k, cache, positions, d)
    apply_rope_inplace(q, k, cache, positions, is_neox=True)
    assert_close(q, eq)
    assert_close(k, ek)
    assert base_q[:offset].isnan().all() and base_q[offset + n * hq * d :].isnan().all()


@requires_cuda
def test_zero_tokens_and_zero_heads():
    q, k, cache, positions = make_inputs(0, 8, 2, 128, 128, torch.bfloat16)
    apply_rope_inplace(q, k, cache, positions, is_neox=True)
    q, k, cache, positions = make_inputs(5, 8, 0, 128, 128, torch.bfloat16)
    eq = neox_reference(q, cache, positions, 128)
    apply_rope_inplace(q, k, cache, positions, is_neox=True)
    assert_close(q, eq)


@requires_cuda
@pytest.mark.parametrize("is_neox", [True, False])
def test_out_of_range_positions_leave_rows(is_neox, monkeypatch):
    """Positions outside [0, max_position): no fault, the context stays usable, the token is left as
    it was; SGLANG_JIT_CHECK_INDICES=1 raises IndexError naming the first bad one."""
    monkeypatch.delenv("SGLANG_JIT_CHECK_INDICES", raising=False)
    n = 9
    q, k, cache, positions = make_inputs(n, 4, 2, 128, 128, torch.bfloat16)
    positions[2], positions[5], positions[7] = MAX_POS, -1, 1 << 40
    q0, k0 = q.clone(), k.clone()
    eq, ek = reference(q, cache, positions, 128, is_neox), reference(k, cache, positions, 128, is_neox)
    apply_rope_inplace(q, k, cache, positions, is_neox=is_neox)
    torch.cuda.synchronize()
    assert_close(q, eq)
    assert_close(k, ek)
    for t in (2, 5, 7):
        assert torch.equal(q[t], q0[t]) and torch.equal(k[t], k0[t])
    monkeypatch.setenv("SGLANG_JIT_CHECK_INDICES", "1")
    with pytest.raises(
        IndexError,
        match=r"^apply_rope_inplace: positions value: expected entries in \[0, 8192\) "
        r"\(max_position\), got 8192 at position 2$",
    ):
        apply_rope_inplace(q, k, cache, positions, is_neox=is_neox)


@requires_cuda
def test_more_than_2_pow_31_elements():
    """64-bit offsets: q of 2^31 + 2^12 bf16 elements (4 GiB)."""
    hq, d = 32, 128
    n = (1 << 31) // (hq * d) + 1
    free, _ = torch.cuda.mem_get_info()
    if free < 3 * n * hq * d * 2:
        pytest.skip(f"needs {3 * n * hq * d * 2 / 2**30:.0f} GiB free GPU memory, {free / 2**30:.0f} GiB free")
    q = torch.empty(n, hq, d, dtype=torch.bfloat16, device="cuda").normal_()
    k = torch.randn(n, 1, d, dtype=torch.bfloat16, device="cuda")
    cache = make_cos_sin_cache(MAX_POS, d)
    positions = torch.randint(0, MAX_POS, (n,), device="cuda")
    rows = torch.tensor([0, n // 2, n - 2, n - 1], device="cuda")
    eq = neox_reference(q[rows], cache, positions[rows], d)
    apply_rope_inplace(q, k, cache, positions, is_neox=True)
    assert_close(q[rows], eq)
    del q, k
    torch.cuda.empty_cache()


# ---- with the KV store ----
def kv_inputs(n, hk, d, slots, dtype):
    v = torch.randn(n, hk, d, dtype=dtype, device="cuda")
    k_cache = poisoned((slots, hk * d), dtype)
    v_cache = poisoned((slots, hk * d), dtype)
    loc = torch.randperm(slots, device="cuda")[:n]
    return v, k_cache, v_cache, loc


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("d,r", KV_DIMS)
@pytest.mark.parametrize("hq,hk", HEADS)
@pytest.mark.parametrize("n", TOKENS)
@pytest.mark.parametrize("loc_dtype", [torch.int64, torch.int32])
def test_apply_rope_inplace_with_kvcache(dtype, is_neox, d, r, hq, hk, n, loc_dtype):
    q, k, cache, positions = make_inputs(n, hq, hk, d, r, dtype)
    slots = 2 * n + 3
    v, k_cache, v_cache, loc = kv_inputs(n, hk, d, slots, dtype)
    loc = loc.to(loc_dtype)
    eq, ek = reference(q, cache, positions, r, is_neox), reference(k, cache, positions, r, is_neox)
    v_before = v.clone()
    apply_rope_inplace_with_kvcache(q, k, v, k_cache, v_cache, cache, positions, loc, is_neox=is_neox, rope_dim=r)
    assert_close(q, eq)
    assert_close(k, ek)
    assert torch.equal(k_cache[loc.long()].view(n, hk, d), k), "k_cache rows are not the rotated k"
    assert torch.equal(v_cache[loc.long()].view(n, hk, d), v_before), "v_cache rows are not v bit for bit"
    assert torch.equal(v, v_before)
    others = torch.ones(slots, dtype=torch.bool, device="cuda")
    others[loc.long()] = False
    assert k_cache[others].isnan().all() and v_cache[others].isnan().all(), "a cache row outside out_loc was written"


@requires_cuda
def test_kvcache_3d_caches_strided_rows_and_bad_locs(monkeypatch):
    """Caches as [slots, Hk, D] views with a row stride wider than the row; out_loc entries outside
    [0, cache_size) store nothing (q and k are still rotated); the check raises with the switch."""
    monkeypatch.delenv("SGLANG_JIT_CHECK_INDICES", raising=False)
    n, hq, hk, d, slots = 16, 8, 2, 128, 40
    q, k, cache, positions = make_inputs(n, hq, hk, d, d, torch.bfloat16)
    v = torch.randn(n, hk, d, dtype=torch.bfloat16, device="cuda")
    k_wide = poisoned((slots, hk * d + 64), torch.bfloat16)
    v_wide = poisoned((slots, hk * d + 64), torch.bfloat16)
    k_cache, v_cache = k_wide[:, : hk * d].view(slots, hk, d), v_wide[:, : hk * d].view(slots, hk, d)
    loc = torch.arange(n, device="cuda") * 2
    loc[3], loc[9] = slots, -5
    ek = neox_reference(k, cache, positions, d)
    apply_rope_inplace_with_kvcache(q, k, v, k_cache, v_cache, cache, positions, loc, is_neox=True)
    assert_close(k, ek)
    good = torch.tensor([i for i in range(n) if i not in (3, 9)], device="cuda")
    assert torch.equal(k_cache[loc[good]], k[good]) and torch.equal(v_cache[loc[good]], v[good])
    written = torch.zeros(slots, dtype=torch.bool, device="cuda")
    written[loc[good]] = True
    assert k_wide[~written].isnan().all() and v_wide[~written].isnan().all()
    assert k_wide[:, hk * d :].isnan().all() and v_wide[:, hk * d :].isnan().all()
    monkeypatch.setenv("SGLANG_JIT_CHECK_INDICES", "1")
    with pytest.raises(
        IndexError,
        match=r"^apply_rope_inplace_with_kvcache: out_loc value: expected entries in "
        r"\[0, 40\) \(cache_size\), got 40 at position 3$",
    ):
        apply_rope_inplace_with_kvcache(q, k, v, k_cache, v_cache, cache, positions, loc, is_neox=True)


@requires_cuda
@pytest.mark.parametrize("fused", [False, True])
def test_apply_rope_with_cos_sin_cache_inplace_dispatch(fused):
    n, hq, hk, d = 7, 8, 2, 128
    q, k, cache, positions = make_inputs(n, hq, hk, d, d, torch.bfloat16)
    eq, ek = neox_reference(q, cache, positions, d), neox_reference(k, cache, positions, d)
    args = None
    if fused:
        v, k_cache, v_cache, loc = kv_inputs(n, hk, d, 20, torch.bfloat16)
        args = FusedSetKVBufferArg(value=v.view(n, hk * d), k_buffer=k_cache, v_buffer=v_cache, cache_loc=loc)
    apply_rope_with_cos_sin_cache_inplace(q, k, cache, positions, is_neox=True, fused_args=args)
    assert_close(q, eq)
    assert_close(k, ek)
    if fused:
        assert torch.equal(k_cache[loc].view(n, hk, d), k) and torch.equal(v_cache[loc].view(n, hk, d), v)


# ---- rotary_embedding (vLLM) ----
@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("layout", ["flat", "heads", "batch_flat", "batch_heads"])
@pytest.mark.parametrize("rot_dim", [128, 64])
@pytest.mark.parametrize("with_key", [True, False])
def test_rotary_embedding(dtype, is_neox, layout, rot_dim, with_key):
    b, s, hq, hk, hs = 3, 5, 8, 2, 128
    n = b * s
    cache = make_cos_sin_cache(MAX_POS, rot_dim, dtype=dtype)
    positions = torch.randint(0, MAX_POS, (n,), device="cuda")
    q3 = torch.randn(n, hq, hs, dtype=dtype, device="cuda")
    k3 = torch.randn(n, hk, hs, dtype=dtype, device="cuda")
    eq, ek = reference(q3, cache, positions, rot_dim, is_neox), reference(k3, cache, positions, rot_dim, is_neox)
    shape_of = {
        "flat": lambda t, h: t.view(n, h * hs),
        "heads": lambda t, h: t,
        "batch_flat": lambda t, h: t.view(b, s, h * hs),
        "batch_heads": lambda t, h: t.view(b, s, h, hs),
    }[layout]
    pos = positions.view(b, s) if layout.startswith("batch") else positions
    query, key = shape_of(q3, hq), shape_of(k3, hk) if with_key else None
    out_q, out_k = rotary_embedding(pos, query, key, hs, cache, is_neox)
    assert out_q is query and out_k is key
    assert_close(q3, eq)
    if with_key:
        assert_close(k3, ek)


@requires_cuda
def test_rotary_embedding_qkv_views():
    """query and key as column slices of one [N, qkv] buffer (token stride wider than the row)."""
    n, hq, hk, hs = 33, 8, 2, 64
    qkv = torch.randn(n, (hq + 2 * hk) * hs, dtype=torch.float16, device="cuda")
    cache = make_cos_sin_cache(MAX_POS, hs, dtype=torch.float16)
    positions = torch.randint(0, MAX_POS, (n,), device="cuda", dtype=torch.int32)
    query, key = qkv[:, : hq * hs], qkv[:, hq * hs : (hq + hk) * hs]
    v_before = qkv[:, (hq + hk) * hs :].clone()
    eq = neox_reference(query.reshape(n, hq, hs), cache, positions, hs)
    ek = neox_reference(key.reshape(n, hk, hs), cache, positions, hs)
    rotary_embedding(positions, query, key, hs, cache)
    assert_close(query.reshape(n, hq, hs), eq)
    assert_close(key.reshape(n, hk, hs), ek)
    assert torch.equal(qkv[:, (hq + hk) * hs :], v_before)


# ---- graphs, compile, streams, devices ----
@requires_cuda
def test_cuda_graph_replay():
    n, hq, hk, d = 64, 8, 2, 128
    q, k, cache, positions = make_inputs(n, hq, hk, d, d, torch.bfloat16)
    v, k_cache, v_cache, loc = kv_inputs(n, hk, d, 128, torch.bfloat16)
    apply_rope_inplace(q, k, cache, positions, is_neox=True)  # load outside capture
    apply_rope_inplace_with_kvcache(q, k, v, k_cache, v_cache, cache, positions, loc, is_neox=False)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        apply_rope_inplace(q, k, cache, positions, is_neox=True)
        apply_rope_inplace_with_kvcache(q, k, v, k_cache, v_cache, cache, positions, loc, is_neox=False)
    q.copy_(torch.randn_like(q))
    k.copy_(torch.randn_like(k))
    positions.copy_(torch.randint(0, MAX_POS, (n,), device="cuda"))
    eq = gptj_reference(neox_reference(q, cache, positions, d), cache, positions, d)
    ek = gptj_reference(neox_reference(k, cache, positions, d), cache, positions, d)
    graph.replay()
    torch.cuda.synchronize()
    # the references round after each op, as the two kernels do; each op is within one ulp of its
    # reference, and the first op's difference goes through the second rotation: two ulps
    rtol, atol = TOLERANCE[torch.bfloat16]
    torch.testing.assert_close(q, eq, rtol=2 * rtol, atol=atol)
    torch.testing.assert_close(k, ek, rtol=2 * rtol, atol=atol)
    assert torch.equal(k_cache[loc].view(n, hk, d), k)


@requires_cuda
def test_torch_compile_fullgraph():
    torch._dynamo.reset()
    n, hq, hk, d = 16, 8, 2, 128
    q, k, cache, positions = make_inputs(n, hq, hk, d, d, torch.bfloat16)
    v, k_cache, v_cache, loc = kv_inputs(n, hk, d, 64, torch.bfloat16)

    def f(qkv_q, qkv_k, v, kc, vc):
        q2 = qkv_q * 1
        k2 = qkv_k * 1
        apply_rope_inplace(q2, k2, cache, positions, is_neox=True)
        k3 = qkv_k * 1
        q3 = qkv_q * 1
        apply_rope_inplace_with_kvcache(q3, k3, v, kc, vc, cache, positions, loc, is_neox=True)
        query = (qkv_q * 1).view(n, hq * d)
        rotary_embedding(positions, query, None, d, cache.to(torch.bfloat16), True)
        return q2, k2, q3, query

    compiled = torch.compile(f, fullgraph=True)
    q2, k2, q3, query = compiled(q, k, v, k_cache, v_cache)
    eq, ek = neox_reference(q, cache, positions, d), neox_reference(k, cache, positions, d)
    assert_close(q2, eq)
    assert_close(k2, ek)
    assert_close(q3, eq)
    assert_close(k_cache[loc].view(n, hk, d), ek)
    assert_close(query.view(n, hq, d), neox_reference(q, cache.to(torch.bfloat16), positions, d))


@requires_cuda
def test_side_stream():
    q, k, cache, positions = make_inputs(300, 8, 2, 128, 128, torch.float16)
    eq = neox_reference(q, cache, positions, 128)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        apply_rope_inplace(q, k, cache, positions, is_neox=True)
    stream.synchronize()
    assert_close(q, eq)


@requires_two_gpus
def test_second_gpu_while_first_is_current():
    torch.cuda.set_device(0)
    n, d = 17, 128
    q = torch.randn(n, 4, d, dtype=torch.bfloat16, device="cuda:1")
    k = torch.randn(n, 2, d, dtype=torch.bfloat16, device="cuda:1")
    cache = make_cos_sin_cache(MAX_POS, d, device="cuda:1")
    positions = torch.randint(0, MAX_POS, (n,), device="cuda:1")
    eq = neox_reference(q, cache, positions, d)
    apply_rope_inplace(q, k, cache, positions, is_neox=True)
    assert_close(q, eq)


# ---- errors (raised before any launch; the CPU ones need no GPU) ----
def test_cpu_tensor_error():
    q, k = torch.randn(4, 2, 64), torch.randn(4, 1, 64)
    cache, positions = torch.randn(16, 64), torch.zeros(4, dtype=torch.int64)
    with pytest.raises(RuntimeError, match=r"^apply_rope_inplace: q device: expected a CUDA device, got cpu$"):
        apply_rope_inplace(q, k, cache, positions, is_neox=True)


def test_not_a_tensor_and_bad_flags():
    with pytest.raises(TypeError, match=r"^apply_rope_inplace: q type: expected a torch.Tensor, got list$"):
        apply_rope_inplace([1.0], None, None, None, is_neox=True)
    with pytest.raises(TypeError, match=r"^apply_rope_inplace: is_neox type: expected a bool, got int$"):
        apply_rope_inplace(torch.randn(1, 1, 2), torch.randn(1, 1, 2), torch.randn(1, 2), torch.zeros(1), is_neox=1)
    with pytest.raises(TypeError, match=r"^apply_rope_inplace: rope_dim type: expected an int, got float$"):
        apply_rope_inplace(
            torch.randn(1, 1, 2), torch.randn(1, 1, 2), torch.randn(1, 2), torch.zeros(1), is_neox=True, rope_dim=2.0
        )
    with pytest.raises(
        TypeError,
        match=r"^apply_rope_with_cos_sin_cache_inplace: fused_args type: expected a "
        r"FusedSetKVBufferArg or None, got dict$",
    ):
        apply_rope_with_cos_sin_cache_inplace(None, None, None, None, is_neox=True, fused_args={})
    with pytest.raises(TypeError, match=r"^rotary_embedding: head_size type: expected an int, got float$"):
        rotary_embedding(torch.zeros(1), torch.randn(1, 2), None, 2.0, torch.randn(4, 2))


@requires_cuda
def test_bad_inputs():
    op = "apply_rope_inplace"
    q, k, cache, positions = make_inputs(4, 2, 1, 128, 128, torch.bfloat16)

    def call(q=q, k=k, cache=cache, positions=positions, **kw):
        apply_rope_inplace(q, k, cache, positions, is_neox=kw.pop("is_neox", True), **kw)

    cases = [
        (RuntimeError, r"k dtype: expected bfloat16 \(the dtype of q\), got float16$", dict(k=k.half())),
        (RuntimeError, r"q dtype: expected one of float16, bfloat16, float32, got int32$", dict(q=q.int())),
        (RuntimeError, r"cos_sin_cache dtype: expected float32, got bfloat16$", dict(cache=cache.bfloat16())),
        (
            RuntimeError,
            r"positions dtype: expected one of int32, int64, got float32$",
            dict(positions=positions.float()),
        ),
        (
            RuntimeError,
            r"k shape: expected \[num_tokens=4, num_kv_heads, head_dim=128\], got \(3, 1, 128\)$",
            dict(k=k[:3]),
        ),
        (
            RuntimeError,
            r"k shape: expected \[num_tokens=4, num_kv_heads, head_dim=128\], got \(4, 1, 64\)$",
            dict(k=k[..., :64]),
        ),
        (
            RuntimeError,
            r"positions shape: expected \[num_tokens=4\], got \(5,\)$",
            dict(positions=torch.zeros(5, dtype=torch.int64, device="cuda")),
        ),
        (
            RuntimeError,
            r"q shape: expected \[num_tokens, num_q_heads, head_dim\], got \(4, 256\)$",
            dict(q=q.view(4, 256)),
        ),
        (RuntimeError, r"q last-dim stride: expected 1", dict(q=q.transpose(1, 2))),
        (
            ValueError,
            r"rope_dim value: expected an even number > 0 \(0: cos_sin_cache.size\(1\)\), got 63$",
            dict(rope_dim=63),
        ),
        (ValueError, r"rope_dim value: expected <= head_dim \(64\), got 128$", dict(q=q[..., :64], k=k[..., :64])),
        (
            ValueError,
            r"rope_dim value: expected <= cos_sin_cache.size\(1\) \(64\), got 128$",
            dict(cache=cache[:, :64].contiguous(), rope_dim=128),
        ),
        (ValueError, r"rope_dim value: expected >= 0, got -2$", dict(rope_dim=-2)),
        (RuntimeError, r"k device: expected a CUDA device, got cpu$", dict(k=k.cpu())),
    ]
    snapshot = q.clone()
    for error, message, kwargs in cases:
        with pytest.raises(error, match=rf"^{op}: {message}"):
            call(**kwargs)
    assert torch.equal(q, snapshot), "a refused call changed q"


@requires_cuda
def test_overlapping_q_k_refused():
    qkv = torch.randn(4, 6, 128, dtype=torch.bfloat16, device="cuda")
    cache = make_cos_sin_cache(64, 128)
    positions = torch.zeros(4, dtype=torch.int64, device="cuda")
    with pytest.raises(RuntimeError, match=r"k overlaps q: expected disjoint memory, got a partial overlap"):
        apply_rope_inplace(qkv[:, 0:4], qkv[:, 3:5], cache, positions, is_neox=True)


@requires_cuda
def test_kvcache_bad_inputs():
    op = "apply_rope_inplace_with_kvcache"
    n, hk, d = 4, 2, 128
    q, k, cache, positions = make_inputs(n, 4, hk, d, d, torch.bfloat16)
    v, k_cache, v_cache, loc = kv_inputs(n, hk, d, 16, torch.bfloat16)

    def call(v=v, k_cache=k_cache, v_cache=v_cache, loc=loc):
        apply_rope_inplace_with_kvcache(q, k, v, k_cache, v_cache, cache, positions, loc, is_neox=True)

    cases = [
        (r"v shape: expected \[num_tokens=4, num_kv_heads=2, head_dim=128\], got \(4, 1, 128\)$", dict(v=v[:, :1])),
        (r"v dtype: expected bfloat16 \(the dtype of q\), got float32$", dict(v=v.float())),
        (r"k_cache dtype: expected one of bfloat16, float8_e4m3fn, got float16$", dict(k_cache=k_cache.half())),
        (
            r"k_cache shape: expected \[cache_size, num_kv_heads \* head_dim=256\], got \(16, 128\)$",
            dict(k_cache=k_cache[:, :128]),
        ),
        (
            r"v_cache shape: expected \[cache_size=16, num_kv_heads \* head_dim=256\] \(the slots of k_cache\), "
            r"got \(8, 256\)$",
            dict(v_cache=v_cache[:8]),
        ),
        (r"out_loc shape: expected \[num_tokens=4\], got \(3,\)$", dict(loc=loc[:3])),
        (r"out_loc dtype: expected one of int32, int64, got float32$", dict(loc=loc.float())),
    ]
    for message, kwargs in cases:
        with pytest.raises(RuntimeError, match=rf"^{op}: {message}"):
            call(**kwargs)
    with pytest.raises(RuntimeError, match="k_cache overlaps"):
        kv = torch.randn(16, 2 * hk * d, dtype=torch.bfloat16, device="cuda")
        apply_rope_inplace_with_kvcache(
            q, k, v, kv[:, : hk * d + 8][:, 8:], kv[:, hk * d :], cache, positions, loc, is_neox=True
        )


@requires_cuda
def test_rotary_embedding_bad_inputs():
    op = "rotary_embedding"
    n, hs = 4, 64
    query = torch.randn(n, 2 * hs, dtype=torch.bfloat16, device="cuda")
    cache = make_cos_sin_cache(32, hs, dtype=torch.bfloat16)
    positions = torch.zeros(n, dtype=torch.int64, device="cuda")
    with pytest.raises(
        RuntimeError, match=rf"^{op}: cos_sin_cache dtype: expected bfloat16 \(the dtype of query\), got float32$"
    ):
        rotary_embedding(positions, query, None, hs, cache.float())
    with pytest.raises(RuntimeError, match=rf"^{op}: query shape: expected \[4, num_heads \* head_size\]"):
        rotary_embedding(positions, query[:, :100], None, hs, cache)
    with pytest.raises(RuntimeError, match=rf"^{op}: query shape: expected \[3, num_heads \* head_size\]"):
        rotary_embedding(positions[:3], query, None, hs, cache)
    with pytest.raises(ValueError, match=rf"^{op}: cos_sin_cache rot_dim: expected <= head_size \(32\), got 64$"):
        rotary_embedding(positions, query, None, 32, cache)
    with pytest.raises(
        RuntimeError, match=rf"^{op}: key dtype: expected bfloat16 \(the dtype of query\), got float16$"
    ):
        rotary_embedding(positions, query, query.half(), hs, cache)


# ---- rotary_embedding_with_key / rotary_embedding_without_key (the original package's forms) ----
@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("layout", ["flat", "batch_heads"])
@pytest.mark.parametrize("rot_dim", [128, 64])
def test_rotary_embedding_with_and_without_key_match_rotary_embedding(dtype, is_neox, layout, rot_dim):
    """Bit for bit the values of rotary_embedding on the same inputs (with key, and with None for
    the query-only form); both return None and leave their tensors' identity and shape alone."""
    b, s, hq, hk, hs = 3, 5, 8, 2, 128
    n = b * s
    cache = make_cos_sin_cache(MAX_POS, rot_dim, dtype=dtype)
    positions = torch.randint(0, MAX_POS, (n,), device="cuda")
    if layout == "batch_heads":
        positions = positions.view(b, s)
        q0, k0 = (
            torch.randn(b, s, hq, hs, dtype=dtype, device="cuda"),
            torch.randn(b, s, hk, hs, dtype=dtype, device="cuda"),
        )
    else:
        q0, k0 = (
            torch.randn(n, hq * hs, dtype=dtype, device="cuda"),
            torch.randn(n, hk * hs, dtype=dtype, device="cuda"),
        )
    eq, ek = q0.clone(), k0.clone()
    rotary_embedding(positions, eq, ek, hs, cache, is_neox)
    query, key = q0.clone(), k0.clone()
    assert rotary_embedding_with_key(positions, query, key, hs, cache, is_neox) is None
    assert torch.equal(query.view(torch.uint8), eq.view(torch.uint8))
    assert torch.equal(key.view(torch.uint8), ek.view(torch.uint8))
    alone, expected_alone = q0.clone(), q0.clone()
    rotary_embedding(positions, expected_alone, None, hs, cache, is_neox)
    assert rotary_embedding_without_key(positions, alone, hs, cache, is_neox) is None
    assert torch.equal(alone.view(torch.uint8), expected_alone.view(torch.uint8))
    assert torch.equal(alone.view(torch.uint8), eq.view(torch.uint8))  # the key never changes query


@requires_cuda
def test_rotary_embedding_with_and_without_key_defaults_and_views():
    """is_neox defaults to True; query and key as column slices of one qkv buffer (v untouched);
    0 tokens launch nothing."""
    n, hq, hk, hs = 33, 8, 2, 64
    qkv = torch.randn(n, (hq + 2 * hk) * hs, dtype=torch.float16, device="cuda")
    cache = make_cos_sin_cache(MAX_POS, hs, dtype=torch.float16)
    positions = torch.randint(0, MAX_POS, (n,), device="cuda", dtype=torch.int32)
    expected = qkv.clone()
    rotary_embedding(positions, expected[:, : hq * hs], expected[:, hq * hs : (hq + hk) * hs], hs, cache, True)
    rotary_embedding_with_key(positions, qkv[:, : hq * hs], qkv[:, hq * hs : (hq + hk) * hs], hs, cache)
    assert torch.equal(qkv.view(torch.uint8), expected.view(torch.uint8))
    expected_q = qkv.clone()
    rotary_embedding(positions, expected_q[:, : hq * hs], None, hs, cache, True)
    rotary_embedding_without_key(positions, qkv[:, : hq * hs], hs, cache)
    assert torch.equal(qkv.view(torch.uint8), expected_q.view(torch.uint8))
    empty = torch.empty(0, hq * hs, dtype=torch.float16, device="cuda")
    no_positions = positions[:0]
    rotary_embedding_with_key(no_positions, empty, empty.clone(), hs, cache)
    rotary_embedding_without_key(no_positions, empty, hs, cache)


@requires_cuda
def test_rotary_embedding_with_and_without_key_bad_inputs():
    """rotary_embedding's checks, in messages naming each form and the argument; a None key is a
    TypeError for the form with a key. Nothing is written."""
    n, hs = 4, 64
    query = torch.randn(n, 2 * hs, dtype=torch.bfloat16, device="cuda")
    before = query.clone()
    cache = make_cos_sin_cache(32, hs, dtype=torch.bfloat16)
    positions = torch.zeros(n, dtype=torch.int64, device="cuda")
    for op, call in (
        ("rotary_embedding_with_key", lambda p, q, h, c: rotary_embedding_with_key(p, q, q.clone(), h, c)),
        ("rotary_embedding_without_key", rotary_embedding_without_key),
    ):
        with pytest.raises(
            RuntimeError, match=rf"^{op}: cos_sin_cache dtype: expected bfloat16 \(the dtype of query\), got float32$"
        ):
            call(positions, query, hs, cache.float())
        with pytest.raises(RuntimeError, match=rf"^{op}: query shape: expected \[3, num_heads \* head_size\]"):
            call(positions[:3], query, hs, cache)
        with pytest.raises(ValueError, match=rf"^{op}: cos_sin_cache rot_dim: expected <= head_size \(32\), got 64$"):
            call(positions, query, 32, cache)
        with pytest.raises(RuntimeError, match=rf"^{op}: positions dtype: expected "):
            call(positions.float(), query, hs, cache)
    op = "rotary_embedding_with_key"
    with pytest.raises(TypeError, match=rf"^{op}: key type: expected a torch.Tensor, got NoneType$"):
        rotary_embedding_with_key(positions, query, None, hs, cache)
    with pytest.raises(
        RuntimeError, match=rf"^{op}: key dtype: expected bfloat16 \(the dtype of query\), got float16$"
    ):
        rotary_embedding_with_key(positions, query, query.half(), hs, cache)
    with pytest.raises(TypeError, match=rf"^{op}: is_neox type: expected a bool, got int$"):
        rotary_embedding_with_key(positions, query, query.clone(), hs, cache, 1)
    assert torch.equal(query, before)


def test_rotary_embedding_with_and_without_key_scalar_errors():
    """The scalar checks come first, so they run without a GPU."""
    with pytest.raises(TypeError, match=r"^rotary_embedding_with_key: head_size type: expected an int, got float$"):
        rotary_embedding_with_key(torch.zeros(1), torch.randn(1, 2), torch.randn(1, 2), 2.0, torch.randn(4, 2))
    with pytest.raises(TypeError, match=r"^rotary_embedding_without_key: head_size type: expected an int, got float$"):
        rotary_embedding_without_key(torch.zeros(1), torch.randn(1, 2), 2.0, torch.randn(4, 2))
    with pytest.raises(ValueError, match=r"^rotary_embedding_without_key: head_size value: expected >= 1, got 0$"):
        rotary_embedding_without_key(torch.zeros(1), torch.randn(1, 2), 0, torch.randn(4, 2))
    with pytest.raises(TypeError, match=r"^rotary_embedding_without_key: is_neox type: expected a bool, got str$"):
        rotary_embedding_without_key(torch.zeros(1), torch.randn(1, 2), 2, torch.randn(4, 2), "neox")


# ---- the default's kernels at awkward shapes and both sides of its size switches ----
# (n, hq, hk, d, r): the bench shape at 1 / 64 / 2048 tokens (the early kernel), heads past one
# pass of rows, partial R at 129 tokens, awkward tokens and lanes, 1024 chunks per head in fp32 (past
# kMaxLanes: rope_kernel), 0 kv heads, 0 tokens; 32 + 8 heads x 128 bf16 at 3276 / 3277 tokens: just
# below / above kEarlyMaxBytes (32 MiB) of rotated bytes (the early kernel / the L2-hinted rope_kernel)
DEFAULT_CASES = [
    (1, 32, 8, 128, 128),
    (64, 32, 8, 128, 128),
    (2048, 32, 8, 128, 128),
    (7, 64, 1, 128, 64),
    (3, 200, 3, 64, 64),
    (5, 8, 8, 256, 80),
    (2, 4, 0, 128, 128),
    (129, 32, 8, 128, 64),
    (769, 8, 8, 64, 64),
    (4097, 1, 1, 512, 96),
    (3, 2, 1, 8192, 8192),
    (0, 32, 8, 128, 128),
    (3276, 32, 8, 128, 128),
    (3277, 32, 8, 128, 128),
]


def _bits(x: torch.Tensor) -> torch.Tensor:
    """x's bit patterns (NaN payloads compare too)."""
    return x.view({2: torch.int16, 4: torch.int32}[x.element_size()])


def _fused_views(buf: torch.Tensor, hq: int, hk: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k as views of one [n, (hq + hk + 1) * d + pad] buffer (own token stride, k after q)."""
    n = buf.shape[0]
    return buf[:, : hq * d].view(n, hq, d), buf[:, hq * d : (hq + hk) * d].view(n, hk, d)


@requires_cuda
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("pos_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("n,hq,hk,d,r", DEFAULT_CASES)
def test_default_kernels_against_reference(is_neox, dtype, pos_dtype, n, hq, hk, d, r):
    """q and k views of one buffer with 16-byte token strides (the 16-byte kernels), out-of-range
    positions on both sides; v, the padding and [R, d) keep their bits."""
    max_pos = 64 if d > 512 else MAX_POS
    pad = 8
    buf = torch.randn(n, (hq + hk + 1) * d + pad, dtype=dtype, device="cuda")
    cache = make_cos_sin_cache(max_pos, r)
    positions = torch.randint(0, max_pos, (n,), device="cuda", dtype=pos_dtype)
    positions[::3] = max_pos + 5
    positions[1::7] = -1
    positions[2::11] = max_pos - 1
    before = buf.clone()
    q, k = _fused_views(buf, hq, hk, d)
    eq, ek = reference(q, cache, positions, r, is_neox), reference(k, cache, positions, r, is_neox)
    apply_rope_inplace(q, k, cache, positions, is_neox=is_neox, rope_dim=r if r != d else 0)
    assert_close(q, eq)
    assert_close(k, ek)
    rotated = torch.zeros_like(buf, dtype=torch.bool)
    for first, count in ((0, hq), (hq, hk)):
        rotated[:, first * d : (first + count) * d].view(n, count, d)[..., :r] = True
    assert torch.equal(_bits(buf)[~rotated], _bits(before)[~rotated])


@requires_cuda
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("offset", [0, 1, 8])
def test_separate_strided_and_unaligned(is_neox, offset):
    """q and k separate tensors with their own token and head strides (heads sliced from wider ones,
    a storage offset that breaks 16-byte alignment at 1: the narrow kernel), NaN around them;
    strided positions (the op copies them)."""
    n, hq, hk, d = 300, 16, 4, 128
    q_buf = torch.randn(offset + n * hq * 2 * d, dtype=torch.bfloat16, device="cuda")
    k_buf = torch.randn(offset + n * (hk + 3) * d, dtype=torch.bfloat16, device="cuda")
    q_buf[:offset] = float("nan")
    k_buf[:offset] = float("nan")
    q = q_buf[offset:].view(n, hq, 2 * d)[:, :, :d]  # head stride 2d
    k = k_buf[offset:].view(n, hk + 3, d)[:, 1 : hk + 1]  # token stride (hk + 3) d, heads from 1
    q_buf[offset:].view(n, hq, 2 * d)[:, :, d:] = float("nan")
    k_buf[offset:].view(n, hk + 3, d)[:, 0] = float("nan")
    k_buf[offset:].view(n, hk + 3, d)[:, hk + 1 :] = float("nan")
    cache = make_cos_sin_cache(MAX_POS, d)
    positions = torch.randint(0, MAX_POS, (2 * n,), device="cuda")[::2]
    eq, ek = reference(q, cache, positions, d, is_neox), reference(k, cache, positions, d, is_neox)
    apply_rope_inplace(q, k, cache, positions, is_neox=is_neox)
    assert_close(q, eq)
    assert_close(k, ek)
    assert q_buf[:offset].isnan().all() and q_buf[offset:].view(n, hq, 2 * d)[:, :, d:].isnan().all()
    kh = k_buf[offset:].view(n, hk + 3, d)
    assert k_buf[:offset].isnan().all() and kh[:, 0].isnan().all() and kh[:, hk + 1 :].isnan().all()


@requires_cuda
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n,hq,hk,d,r", ROPE_KV_KERNEL_SHAPES)
def test_kv_store_default_kernels(is_neox, dtype, n, hq, hk, d, r):
    """Every KV kernel of the default against the reference, skipped rows and out-of-range positions."""
    q, k, cache, positions = make_inputs(n, hq, hk, d, r, dtype)
    positions[::5] = -2
    v = torch.randn(n, hk, d, dtype=dtype, device="cuda")
    slots = 2 * n + 3
    loc = torch.randperm(slots, device="cuda")[:n]
    loc[1::4] = -1  # stores nothing
    kv = poisoned((2, slots, hk * d), dtype)
    eq, ek = reference(q, cache, positions, r, is_neox), reference(k, cache, positions, r, is_neox)
    apply_rope_inplace_with_kvcache(
        q, k, v, kv[0], kv[1], cache, positions, loc, is_neox=is_neox, rope_dim=r if r != d else 0
    )
    assert_close(q, eq)
    assert_close(k, ek)
    good = loc >= 0
    assert torch.equal(kv[0][loc[good]].view(-1, hk, d), k[good]) and torch.equal(
        kv[1][loc[good]].view(-1, hk, d), v[good]
    )
    written = torch.zeros(slots, dtype=torch.bool, device="cuda")
    written[loc[good]] = True
    assert kv[:, ~written].isnan().all(), "a cache row outside out_loc was written"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v", "-s"]))
