"""concat_mla: concat_mla_k and concat_mla_absorb_q bit-exact against torch.cat, DeepSeek and other
shapes and dtypes, strided and unaligned views inside poisoned buffers, empty inputs, graphs,
compile, and the error cases."""

import pytest
import torch

from sglang.jit_kernel.concat_mla import concat_mla_absorb_q, concat_mla_k
from sglang.jit_kernel.testing import (
    SENTINEL_BYTE,
    as_bytes,
    assert_bits_equal,
    random_of,
    requires_cuda,
    requires_two_gpus,
    sentinel_filled,
)
from sglang.jit_kernel.utils import get_ci_test_range
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=150, suite="stage-b-kernel-unit-1-gpu-large")  # compiles ~8 row-size pairs
register_cuda_ci(est_time=120, suite="nightly-kernel-1-gpu", nightly=True)

TOKENS = get_ci_test_range(full_range=[1, 7, 64, 129, 1000, 4097], ci_range=[1, 7, 129])
# (num_heads, nope, rope): DeepSeek first, then other head counts and dims (each pair compiles once)
K_SHAPES = get_ci_test_range(
    full_range=[(128, 128, 64), (16, 128, 64), (1, 128, 64), (5, 7, 3), (16, 64, 32), (3, 1, 1)],
    ci_range=[(128, 128, 64), (5, 7, 3)],
)
DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn]


def cat_bytes(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``cat([a, b], -1)`` on the raw bytes (fp8 has no cat), ``b`` broadcast over dim 1."""
    b = b.expand(-1, a.shape[1], -1)
    return torch.cat([as_bytes(a), as_bytes(b)], dim=-1).view(a.dtype)


# ---- concat_mla_k ----
@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,nope,rope", K_SHAPES)
@pytest.mark.parametrize("num_tokens", TOKENS)
def test_concat_mla_k_values(dtype, heads, nope, rope, num_tokens):
    k = sentinel_filled((num_tokens, heads, nope + rope), dtype)
    k_nope, k_rope = random_of((num_tokens, heads, nope), dtype), random_of((num_tokens, 1, rope), dtype)
    before = k_nope.clone(), k_rope.clone()
    concat_mla_k(k, k_nope, k_rope)
    assert_bits_equal(k, cat_bytes(k_nope, k_rope))
    assert_bits_equal(k_nope, before[0])
    assert_bits_equal(k_rope, before[1])


@requires_cuda
def test_concat_mla_k_rope_per_head():
    """k_rope with every head (no broadcast) is taken head by head."""
    k = sentinel_filled((33, 16, 192), torch.bfloat16)
    k_nope, k_rope = random_of((33, 16, 128), torch.bfloat16), random_of((33, 16, 64), torch.bfloat16)
    concat_mla_k(k, k_nope, k_rope)
    assert_bits_equal(k, cat_bytes(k_nope, k_rope))


@requires_cuda
@pytest.mark.parametrize("offset", [0, 1, 2, 3, 8])
def test_concat_mla_k_strided_and_unaligned_views(offset):
    """k inside a wider poisoned buffer (token and head strides free, pointer off 16-byte alignment),
    k_nope a slice of a wider per-head buffer, k_rope a slice of a per-token buffer: right bits,
    poison around k intact."""
    n, h, nope, rope, pad = 65, 128, 128, 64, 12
    big = sentinel_filled((n, h, nope + rope + 2 * pad), torch.bfloat16)
    k = big[:, :, pad + offset : pad + offset + nope + rope]
    nope_wide = random_of((n, h, nope + 9), torch.bfloat16)
    k_nope = nope_wide[:, :, 9 - offset % 9 : 9 - offset % 9 + nope]
    rope_wide = random_of((n, 2, rope + 5), torch.bfloat16)
    k_rope = rope_wide[:, 1:2, offset % 5 : offset % 5 + rope]
    expected = big.clone()
    expected[:, :, pad + offset : pad + offset + nope + rope] = cat_bytes(k_nope, k_rope)
    concat_mla_k(k, k_nope, k_rope)
    assert_bits_equal(big, expected)


@requires_cuda
def test_concat_mla_k_transposed_heads():
    """Head-major storage (token stride smaller than the head stride) is just other strides."""
    n, h = 40, 128
    k = sentinel_filled((h, n, 192), torch.bfloat16).transpose(0, 1)
    k_nope = random_of((h, n, 128), torch.bfloat16).transpose(0, 1)
    k_rope = random_of((n, 1, 64), torch.bfloat16)
    concat_mla_k(k, k_nope, k_rope)
    assert_bits_equal(k, cat_bytes(k_nope, k_rope))


@requires_cuda
def test_concat_mla_k_empty():
    k = sentinel_filled((0, 128, 192), torch.bfloat16)
    concat_mla_k(k, random_of((0, 128, 128), torch.bfloat16), random_of((0, 1, 64), torch.bfloat16))
    k = sentinel_filled((4, 0, 192), torch.bfloat16)
    concat_mla_k(k, random_of((4, 0, 128), torch.bfloat16), random_of((4, 1, 64), torch.bfloat16))


@requires_cuda
def test_concat_mla_k_cuda_graph_and_compile():
    n, h = 64, 128
    k = sentinel_filled((n, h, 192), torch.bfloat16)
    k_nope, k_rope = random_of((n, h, 128), torch.bfloat16), random_of((n, 1, 64), torch.bfloat16)
    concat_mla_k(k, k_nope, k_rope)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        concat_mla_k(k, k_nope, k_rope)
    k_nope.copy_(random_of((n, h, 128), torch.bfloat16))
    k_rope.copy_(random_of((n, 1, 64), torch.bfloat16))
    k.view(torch.uint8).fill_(SENTINEL_BYTE)
    graph.replay()
    torch.cuda.synchronize()
    assert_bits_equal(k, cat_bytes(k_nope, k_rope))

    torch._dynamo.reset()

    def f(k_nope, k_rope):
        k = torch.empty(k_nope.shape[0], k_nope.shape[1], 192, dtype=k_nope.dtype, device=k_nope.device)
        concat_mla_k(k, k_nope * 2, k_rope)
        return k

    out = torch.compile(f, fullgraph=True)(k_nope, k_rope)
    assert_bits_equal(out, cat_bytes(k_nope * 2, k_rope))


@requires_two_gpus
def test_concat_mla_k_on_second_gpu_while_first_is_current():
    torch.cuda.set_device(0)
    k = sentinel_filled((9, 128, 192), torch.bfloat16, "cuda:1")
    k_nope, k_rope = random_of((9, 128, 128), torch.bfloat16, "cuda:1"), random_of((9, 1, 64), torch.bfloat16, "cuda:1")
    concat_mla_k(k, k_nope, k_rope)
    assert_bits_equal(k, cat_bytes(k_nope, k_rope))


# ---- concat_mla_absorb_q ----
Q_SHAPES = get_ci_test_range(
    full_range=[(1, 128), (7, 16), (129, 1), (1000, 128)],
    ci_range=[(1, 128), (7, 16), (129, 1)],
)


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d0,d1", Q_SHAPES)
@pytest.mark.parametrize("a_dim,b_dim", [(512, 64), (7, 3)])
def test_concat_mla_absorb_q_values(dtype, d0, d1, a_dim, b_dim):
    a, b = random_of((d0, d1, a_dim), dtype), random_of((d0, d1, b_dim), dtype)
    before = a.clone(), b.clone()
    out = concat_mla_absorb_q(a, b)
    assert out.is_contiguous() and out.shape == (d0, d1, a_dim + b_dim) and out.dtype == dtype
    assert_bits_equal(out, cat_bytes(a, b))
    assert_bits_equal(a, before[0])
    assert_bits_equal(b, before[1])


@requires_cuda
@pytest.mark.parametrize("offset", [0, 1, 3])
def test_concat_mla_absorb_q_strided_views(offset):
    """a a slice of a fused [d0, d1, 576 + pad] buffer (unaligned by `offset`), b with transposed
    leading dims: leading strides are free."""
    d0, d1 = 37, 128
    fused = random_of((d0, d1, 576 + 8), torch.bfloat16)
    a = fused[:, :, offset : offset + 512]
    b = random_of((d1, d0, 64), torch.bfloat16).transpose(0, 1)
    assert_bits_equal(concat_mla_absorb_q(a, b), cat_bytes(a, b))


@requires_cuda
def test_concat_mla_absorb_q_empty_graph_and_compile():
    empty = concat_mla_absorb_q(random_of((0, 128, 512), torch.bfloat16), random_of((0, 128, 64), torch.bfloat16))
    assert empty.shape == (0, 128, 576)
    a, b = random_of((16, 128, 512), torch.bfloat16), random_of((16, 128, 64), torch.bfloat16)
    concat_mla_absorb_q(a, b)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = concat_mla_absorb_q(a, b)
    a.copy_(random_of((16, 128, 512), torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    assert_bits_equal(out, cat_bytes(a, b))

    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b: concat_mla_absorb_q(a + 1, b).float() * 2, fullgraph=True)
    assert_bits_equal(compiled(a, b), cat_bytes(a + 1, b).float() * 2)


# ---- both block orders ----
# concat_mla.cuh's ConcatMlaConfig::kTokenMajorMinTokens: a 2-D grid (token x head block) below this
# many tokens, the token-major 1-D grid from here on.
TOKEN_MAJOR_MIN_TOKENS = 1024
SWITCH_TOKENS = [TOKEN_MAJOR_MIN_TOKENS - 1, TOKEN_MAJOR_MIN_TOKENS, 2 * TOKEN_MAJOR_MIN_TOKENS + 3]


@requires_cuda
@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("num_tokens", SWITCH_TOKENS)
def test_concat_mla_k_both_sides_of_the_token_major_switch(num_tokens, offset):
    """Just below, at and above the switch, k_rope broadcast and per head, k 16-byte aligned and
    (offset 1) off by one element (2-byte vectors): torch.cat's bytes, the poison before k intact.
    16 heads: two blocks a token at 16-byte vectors, the second partly idle."""
    heads = 16
    big = sentinel_filled((offset + num_tokens * heads * 192,), torch.bfloat16)
    k = big[offset:].view(num_tokens, heads, 192)
    k_nope = random_of((num_tokens, heads, 128), torch.bfloat16)
    for rope_heads in (1, heads):
        k_rope = random_of((num_tokens, rope_heads, 64), torch.bfloat16)
        big.view(torch.uint8).fill_(SENTINEL_BYTE)
        expected = big.clone()
        expected[offset:] = cat_bytes(k_nope, k_rope).reshape(-1)
        concat_mla_k(k, k_nope, k_rope)
        assert_bits_equal(big, expected)


@requires_cuda
@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("num_tokens", SWITCH_TOKENS)
def test_concat_mla_absorb_q_both_sides_of_the_token_major_switch(num_tokens, offset):
    """The same for absorb_q [T, 16, 512 + 64] (4.5 blocks a token), a 16-byte aligned or (offset 1)
    not."""
    a = random_of((num_tokens, 16, offset + 512), torch.bfloat16)[:, :, offset:]
    b = random_of((num_tokens, 16, 64), torch.bfloat16)
    assert_bits_equal(concat_mla_absorb_q(a, b), cat_bytes(a, b))


# ---- errors (raised before any launch) ----
def test_concat_mla_cpu_and_non_tensors():
    with pytest.raises(RuntimeError, match=r"^concat_mla_k: k device: expected a CUDA device, got cpu$"):
        concat_mla_k(torch.zeros(2, 4, 192), torch.zeros(2, 4, 128), torch.zeros(2, 1, 64))
    with pytest.raises(TypeError, match=r"^concat_mla_k: k type: expected a torch.Tensor, got list$"):
        concat_mla_k([0.0], torch.zeros(2, 4, 128), torch.zeros(2, 1, 64))
    with pytest.raises(RuntimeError, match=r"^concat_mla_absorb_q: a device: expected a CUDA device, got cpu$"):
        concat_mla_absorb_q(torch.zeros(2, 4, 512), torch.zeros(2, 4, 64))


@requires_cuda
@pytest.mark.parametrize(
    "name,replacement,pattern",
    [
        (
            "k_nope",
            lambda: random_of((4, 8, 128), torch.float16),
            r"^concat_mla_k: k_nope dtype: expected bfloat16 \(the dtype of k\), got float16$",
        ),
        (
            "k_rope",
            lambda: random_of((4, 1, 32), torch.bfloat16),
            r"^concat_mla_k: k shape: expected a last dim of 128 \+ 32 = 160 \(k_nope \+ k_rope\), got \(4, 8, 192\)$",
        ),
        (
            "k_rope",
            lambda: random_of((4, 2, 64), torch.bfloat16),
            r"^concat_mla_k: k_rope shape: expected \[4, 8 or 1, rope\], got \(4, 2, 64\)$",
        ),
        (
            "k_nope",
            lambda: random_of((4, 7, 128), torch.bfloat16),
            r"^concat_mla_k: k_nope shape: expected \(4, 8\) leading dims \(those of k\), got \(4, 7, 128\)$",
        ),
        (
            "k_nope",
            lambda: random_of((4, 8 * 128), torch.bfloat16),
            r"^concat_mla_k: k_nope shape: expected \[num_tokens, num_heads, nope\], got \(4, 1024\)$",
        ),
        (
            "k",
            lambda: random_of((4, 8, 384), torch.bfloat16)[:, :, ::2],
            r"^concat_mla_k: k last-dim stride: expected 1 \(a contiguous last dim\), got 2 ",
        ),
    ],
)
def test_concat_mla_k_bad_inputs(name, replacement, pattern):
    args = {
        "k": sentinel_filled((4, 8, 192), torch.bfloat16),
        "k_nope": random_of((4, 8, 128), torch.bfloat16),
        "k_rope": random_of((4, 1, 64), torch.bfloat16),
    }
    concat_mla_k(**args)  # load the module: the call below takes the eager fast path first
    args[name] = replacement()
    before = as_bytes(args["k"]).clone()
    with pytest.raises(RuntimeError, match=pattern):
        concat_mla_k(args["k"], args["k_nope"], args["k_rope"])
    assert torch.equal(as_bytes(args["k"]), before)


@requires_cuda
def test_concat_mla_k_output_sharing_memory_with_a_source():
    buffer = random_of((4, 8, 192 + 128), torch.bfloat16)
    with pytest.raises(RuntimeError, match=r"^concat_mla_k: k overlaps k_nope: expected disjoint memory, got "):
        concat_mla_k(buffer[:, :, :192], buffer[:, :, 100:228], random_of((4, 1, 64), torch.bfloat16))


@requires_cuda
def test_concat_mla_absorb_q_bad_inputs():
    a = random_of((4, 8, 512), torch.bfloat16)
    with pytest.raises(
        RuntimeError,
        match=r"^concat_mla_absorb_q: b dtype: expected bfloat16 \(the dtype of a\), "
        r"got float32$",
    ):
        concat_mla_absorb_q(a, random_of((4, 8, 64), torch.float32))
    with pytest.raises(
        RuntimeError,
        match=r"^concat_mla_absorb_q: b shape: expected \[4, 8, B\] \(the leading dims "
        r"of a\), got \(4, 7, 64\)$",
    ):
        concat_mla_absorb_q(a, random_of((4, 7, 64), torch.bfloat16))
    with pytest.raises(RuntimeError, match=r"^concat_mla_absorb_q: a shape: expected \[d0, d1, A\], got \(4, 512\)$"):
        concat_mla_absorb_q(a[:, 0], random_of((4, 64), torch.bfloat16))


@requires_cuda
def test_concat_mla_ffi_rejects_mismatch_from_cpp():
    """The launcher checks the row sizes the module was built for, shapes and overlap itself."""
    from sglang.jit_kernel.concat_mla import _jit_concat_mla_module

    module = _jit_concat_mla_module(256, 128)
    k, k_nope, k_rope = (
        sentinel_filled((4, 8, 192), torch.bfloat16),
        random_of((4, 8, 128), torch.bfloat16),
        random_of((4, 1, 64), torch.bfloat16),
    )
    with pytest.raises(RuntimeError, match="built for 256 \\+ 128"):
        module.concat_mla(k[:, :, :160], k_nope, k_rope[:, :, :32])
    with pytest.raises(RuntimeError, match="k_nope|a"):
        module.concat_mla(k, k_nope.half(), k_rope)
    with pytest.raises(RuntimeError, match="overlaps|share memory"):  # refused either as shared or as undecidable
        module.concat_mla(k, k[:, :, :128], k_rope)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))
