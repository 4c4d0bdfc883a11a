"""store_cache_quant: bit-exact against torch's own e4m3 cast of the documented formula (device scales
and inverse scales, boundary values, inf/NaN), sentinel-filled caches (every slot not addressed keeps
its bytes), size_limit, out-of-range slots, int32/int64 indices, strided and offset views, 3-D rows,
empty inputs, graphs, compile, the index check and every error case."""

import pytest
import torch

from sglang.jit_kernel._validate import CHECK_INDICES_ENV
from sglang.jit_kernel.kvcache import reference_store_cache_quant, store_cache_quant
from sglang.jit_kernel.testing import (
    SENTINEL_BYTE,
    assert_bits_equal,
    random_of,
    requires_cuda,
    requires_two_gpus,
    sentinel_filled,
)
from sglang.jit_kernel.utils import get_ci_test_range
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=60, suite="stage-b-kernel-unit-1-gpu-large")
register_cuda_ci(est_time=180, suite="nightly-kernel-1-gpu", nightly=True)

FP8 = torch.float8_e4m3fn
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# (k_row, v_row) in elements: whole 16-byte vectors, v_head_dim != head_dim, and rows that take the
# one-element path (7, 129).
ROWS = get_ci_test_range(
    full_range=[(1, 1), (7, 7), (128, 128), (1024, 1024), (129, 129), (192, 128), (576, 512), (4096, 8)],
    ci_range=[(7, 7), (1024, 1024), (129, 129), (192, 128)],
)
TOKENS = get_ci_test_range(full_range=[1, 7, 129, 1000, 4097], ci_range=[1, 7, 129])


def scale_of(value: float, device="cuda") -> torch.Tensor:
    """A ``[1]`` float32 scale on the device."""
    return torch.full((1,), value, dtype=torch.float32, device=device)


def inv_of(scale: torch.Tensor | None, inv_scale: float) -> torch.Tensor:
    """The kernel's fp32 multiplier: 1 / scale (correctly rounded) or the inverse scale in fp32."""
    if scale is not None:
        return 1.0 / scale.reshape(())
    return torch.tensor(inv_scale, dtype=torch.float32, device="cuda")


def source(shape, dtype, device="cuda") -> torch.Tensor:
    """Normal values of std 60 (many near and past 448 * scale), in `dtype`."""
    return (random_of(shape, torch.float32, device) * 60).to(dtype)


def expected_cache(cache: torch.Tensor, x: torch.Tensor, inv: torch.Tensor, indices: torch.Tensor, limit: int = 0):
    """``cache`` as bytes ``[num_slots, row]`` with the addressed valid slots set to the reference."""
    expected = cache.view(torch.uint8).reshape(cache.shape[0], -1).clone()
    slots = indices.long()
    bound = min(cache.shape[0], limit) if limit > 0 else cache.shape[0]
    valid = (slots >= 0) & (slots < bound)
    rows = reference_store_cache_quant(x[: indices.shape[0]].reshape(indices.shape[0], -1), inv)
    expected[slots[valid]] = rows[valid]
    return expected


def run_and_check(k, v, k_cache, v_cache, indices, k_scale=None, v_scale=None, k_inv=1.0, v_inv=1.0, limit=0):
    """store_cache_quant, then both caches bit for bit against the reference, the inputs unchanged."""
    expected_k = expected_cache(k_cache, k, inv_of(k_scale, k_inv), indices, limit)
    expected_v = expected_cache(v_cache, v, inv_of(v_scale, v_inv), indices, limit)
    inputs = [t for t in (k, v, indices, k_scale, v_scale) if t is not None]
    before = [t.clone() for t in inputs]
    store_cache_quant(
        k, v, k_cache, v_cache, indices, k_scale, v_scale, k_inv_scale=k_inv, v_inv_scale=v_inv, size_limit=limit
    )
    assert_bits_equal(k_cache.view(torch.uint8).reshape(k_cache.shape[0], -1), expected_k)
    assert_bits_equal(v_cache.view(torch.uint8).reshape(v_cache.shape[0], -1), expected_v)
    for t, b in zip(inputs, before):
        assert_bits_equal(t, b)


# ---- values ----
@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k_row,v_row", ROWS)
@pytest.mark.parametrize("num_tokens", TOKENS)
def test_store_cache_quant_values(dtype, k_row, v_row, num_tokens):
    slots = 2 * num_tokens + 3
    k, v = source((num_tokens, k_row), dtype), source((num_tokens, v_row), dtype)
    k_cache, v_cache = sentinel_filled((slots, k_row), FP8), sentinel_filled((slots, v_row), FP8)
    indices = torch.randperm(slots, device="cuda")[:num_tokens]
    run_and_check(k, v, k_cache, v_cache, indices, scale_of(0.37), v_inv=1 / 1.7)


@requires_cuda
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("scales", ["tensors", "floats", "default", "mixed"])
def test_store_cache_quant_index_dtypes_and_scale_forms(index_dtype, scales):
    k, v = source((33, 8, 128), torch.bfloat16), source((33, 8, 128), torch.bfloat16)
    k_cache, v_cache = sentinel_filled((100, 8, 128), FP8), sentinel_filled((100, 8, 128), FP8)
    indices = torch.randperm(100, device="cuda")[:33].to(index_dtype)
    kw = {
        "tensors": {"k_scale": scale_of(0.37), "v_scale": scale_of(3.0)},
        "floats": {"k_inv": 2.5, "v_inv": 1 / 3},
        "default": {},
        "mixed": {"k_inv": 0.125, "v_scale": scale_of(1.7)},
    }[scales]
    run_and_check(k, v, k_cache, v_cache, indices, **kw)


def boundary_values(dtype: torch.dtype) -> torch.Tensor:
    """Zeros, subnormal-range, midpoints of the e4m3 grid, 448 and past it, inf and NaN."""
    grid = torch.arange(256, dtype=torch.uint8, device="cuda").view(FP8).float()
    finite = grid[torch.isfinite(grid)]
    midpoints = (finite.sort().values[1:] + finite.sort().values[:-1]) / 2
    special = torch.tensor([0.0, -0.0, 448.0, -448.0, 464.0, 480.0, 1e9, -1e9, 2.0**-10, 2.0**-9], device="cuda")
    special = torch.cat([special, torch.tensor([float("inf"), -float("inf"), float("nan")], device="cuda")])
    return torch.cat([finite, midpoints, special]).to(dtype)


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1.0, 0.5, 2.0, 1.7, 0.0078125, 3.0])
def test_store_cache_quant_boundary_values_bit_exact(dtype, scale):
    values = boundary_values(dtype)
    n = values.numel() // 8 * 8
    k = values[:n].reshape(-1, 8)
    v = values.flip(0)[:n].reshape(-1, 8)
    k_cache, v_cache = sentinel_filled((k.shape[0] + 1, 8), FP8), sentinel_filled((k.shape[0] + 1, 8), FP8)
    indices = torch.arange(k.shape[0], device="cuda")
    run_and_check(k, v, k_cache, v_cache, indices, scale_of(scale), v_inv=1 / scale)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("row", [16, 7])
def test_store_cache_quant_every_source_value_bit_exact(dtype, row):
    """All 65536 bit patterns of the source dtype, through the vector path (16) and the element path (7)."""
    values = torch.arange(-(2**15), 2**15, dtype=torch.int32, device="cuda").to(torch.int16).view(dtype)
    n = values.numel() // row * row
    k = values[:n].reshape(-1, row)
    cache = sentinel_filled((k.shape[0], row), FP8)
    v_cache = sentinel_filled((k.shape[0], row), FP8)
    run_and_check(k, k, cache, v_cache, torch.arange(k.shape[0], device="cuda"), scale_of(0.37), v_inv=3.0)


@requires_cuda
def test_store_cache_quant_zero_and_nan_scales():
    k = torch.tensor([[1.0, -2.0, 0.0, 5.0, -0.0, 3.0, 1e-3, -7.0]], device="cuda", dtype=torch.bfloat16)
    k_cache, v_cache = sentinel_filled((2, 8), FP8), sentinel_filled((2, 8), FP8)
    store_cache_quant(k, k, k_cache, v_cache, torch.tensor([0], device="cuda"), scale_of(0.0), scale_of(float("nan")))
    got = k_cache[0].view(torch.uint8).tolist()
    assert got[:4] == [0x7E, 0xFE, 0x7F, 0x7E] and got[4] == 0x7F, got  # +-448, 0 * inf = NaN
    assert v_cache[0].view(torch.uint8).tolist() == [0x7F] * 8


# ---- slots ----
@requires_cuda
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("bad", [-1, -2, 40, 41, 2**31 - 1])
def test_store_cache_quant_out_of_range_slots_are_skipped(index_dtype, bad):
    k, v = source((9, 128), torch.bfloat16), source((9, 64), torch.bfloat16)
    k_cache, v_cache = sentinel_filled((40, 128), FP8), sentinel_filled((40, 64), FP8)
    indices = torch.randperm(40, device="cuda")[:9].to(index_dtype)
    indices[::3] = bad
    run_and_check(k, v, k_cache, v_cache, indices, scale_of(0.5), scale_of(2.0))


@requires_cuda
@pytest.mark.parametrize("limit", [0, 1, 17, 40, 1000])
def test_store_cache_quant_size_limit(limit):
    """size_limit > 0: slots from size_limit on are skipped like slots outside the cache."""
    k, v = source((30, 256), torch.float16), source((30, 256), torch.float16)
    k_cache, v_cache = sentinel_filled((40, 256), FP8), sentinel_filled((40, 256), FP8)
    indices = torch.randperm(40, device="cuda")[:30]
    run_and_check(k, v, k_cache, v_cache, indices, k_inv=0.25, v_inv=4.0, limit=limit)


@requires_cuda
@pytest.mark.parametrize("limit", [1 << 63, 1 << 70])
def test_store_cache_quant_size_limit_past_int64_on_a_loaded_module(limit):
    """With the module loaded (the fast path calls the launcher directly), a size_limit the FFI cannot
    pass as int64 still raises the documented ValueError and writes nothing."""
    k, v = source((8, 128), torch.bfloat16), source((8, 128), torch.bfloat16)
    k_cache, v_cache = sentinel_filled((16, 128), FP8), sentinel_filled((16, 128), FP8)
    indices = torch.randperm(16, device="cuda")[:8]
    store_cache_quant(k, v, k_cache, v_cache, indices)  # loads the module
    k_cache.view(torch.uint8).fill_(SENTINEL_BYTE)
    before = k_cache.clone()
    with pytest.raises(ValueError, match=r"^store_cache_quant: size_limit"):
        store_cache_quant(k, v, k_cache, v_cache, indices, size_limit=limit)
    assert_bits_equal(k_cache.view(torch.uint8), before.view(torch.uint8))


@requires_cuda
def test_store_cache_quant_fewer_indices_than_tokens():
    k, v = source((16, 128), torch.bfloat16), source((16, 128), torch.bfloat16)
    k_cache, v_cache = sentinel_filled((32, 128), FP8), sentinel_filled((32, 128), FP8)
    run_and_check(k, v, k_cache, v_cache, torch.randperm(32, device="cuda")[:5], scale_of(0.3), scale_of(0.6))


# ---- layouts ----
@requires_cuda
@pytest.mark.parametrize("offset", [0, 1, 3])
@pytest.mark.parametrize("row", [128, 98, 7])
@pytest.mark.parametrize("dtype", DTYPES)
def test_store_cache_quant_strided_and_offset_views(offset, row, dtype):
    """Sources and caches sliced from wider buffers at element offsets (unaligned pointers and
    strides take the element path); the bytes around the caches' rows keep the sentinel."""
    n, slots = 37, 80
    k_buf, v_buf = source((n, row + 2 * offset + 5), dtype), source((n, row + offset + 3), dtype)
    k, v = k_buf[:, offset : offset + row], v_buf[:, offset : offset + row]
    k_cache_buf, v_cache_buf = sentinel_filled((slots, row + offset + 9), FP8), sentinel_filled((slots, 2 * row), FP8)
    k_cache, v_cache = k_cache_buf[:, offset : offset + row], v_cache_buf[:, :row]
    indices_buf = torch.randperm(slots, device="cuda")[: 2 * n]
    indices = indices_buf[::2]
    before_k, before_v = k_cache_buf.clone(), v_cache_buf.clone()
    run_and_check(k, v, k_cache, v_cache, indices, scale_of(0.37), scale_of(1.7))
    outside_k = torch.ones(k_cache_buf.shape, dtype=torch.bool, device="cuda")
    outside_k[:, offset : offset + row] = False
    outside_v = torch.ones(v_cache_buf.shape, dtype=torch.bool, device="cuda")
    outside_v[:, :row] = False
    assert_bits_equal(k_cache_buf.view(torch.uint8)[outside_k], before_k.view(torch.uint8)[outside_k])
    assert_bits_equal(v_cache_buf.view(torch.uint8)[outside_v], before_v.view(torch.uint8)[outside_v])


@requires_cuda
@pytest.mark.parametrize("check_indices", [False, True])
def test_store_cache_quant_interleaved_caches_of_one_buffer(monkeypatch, check_indices):
    """fp8 k and v caches as the two halves of each slot of one buffer [num_slots, 2, row]: no shared
    element, so both paths take them; a v cache on k's elements is refused."""
    if check_indices:
        monkeypatch.setenv(CHECK_INDICES_ENV, "1")
    else:
        monkeypatch.delenv(CHECK_INDICES_ENV, raising=False)
    num_tokens, num_slots, row = 37, 96, 256
    kv = torch.zeros(num_slots, 2, row, dtype=torch.float8_e4m3fn, device="cuda")
    k_cache, v_cache = kv[:, 0], kv[:, 1]
    k, v = source((num_tokens, row), torch.bfloat16), source((num_tokens, row), torch.bfloat16)
    indices = torch.randperm(num_slots, device="cuda")[:num_tokens]
    for _ in range(2):  # checked path on a first call (always with the env set), then the fast path
        kv.zero_()
        run_and_check(k, v, k_cache, v_cache, indices, k_scale=scale_of(0.5), v_scale=scale_of(2.0))
    with pytest.raises(RuntimeError, match=r"^store_cache_quant: .*v_cache.*overlap"):
        store_cache_quant(k, v, k_cache, kv[:, 0], indices)


@requires_cuda
def test_store_cache_quant_3d_rows_and_0d_scales():
    k, v = source((12, 8, 128), torch.bfloat16), source((12, 8, 128), torch.bfloat16)
    k_cache, v_cache = sentinel_filled((50, 8, 128), FP8), sentinel_filled((50, 1024), FP8)
    indices = torch.randperm(50, device="cuda")[:12]
    scales = torch.tensor([0.5, 0.37, 1.7], device="cuda")
    run_and_check(k, v, k_cache, v_cache, indices, scales[1], scales[2:3])


@requires_cuda
def test_store_cache_quant_empty():
    k, v = source((0, 128), torch.bfloat16), source((0, 128), torch.bfloat16)
    k_cache, v_cache = sentinel_filled((8, 128), FP8), sentinel_filled((8, 128), FP8)
    store_cache_quant(k, v, k_cache, v_cache, torch.zeros(0, dtype=torch.int64, device="cuda"), scale_of(1.0))
    k2, v2 = source((4, 128), torch.bfloat16), source((4, 128), torch.bfloat16)
    store_cache_quant(k2, v2, k_cache, v_cache, torch.zeros(0, dtype=torch.int32, device="cuda"))
    store_cache_quant(k2, v2, k_cache[:0], v_cache[:0], torch.arange(4, device="cuda"))  # no slots
    torch.cuda.synchronize()
    assert (k_cache.view(torch.uint8) == SENTINEL_BYTE).all() and (v_cache.view(torch.uint8) == SENTINEL_BYTE).all()


@requires_cuda
def test_store_cache_quant_offsets_past_4_gib():
    """Slot offsets beyond 2^32 bytes: a cache of 2^19 + 2 slots of 8 KiB (4 GiB + 16 KiB)."""
    if torch.cuda.get_device_properties(0).total_memory < 16 * 2**30:
        pytest.skip("needs 16 GiB of device memory")
    row = 8192
    k_cache = torch.zeros((1 << 19) + 2, row, dtype=FP8, device="cuda")
    v_cache = torch.zeros((1 << 19) + 2, 8, dtype=FP8, device="cuda")
    k, v = source((2, row), torch.bfloat16), source((2, 8), torch.bfloat16)
    indices = torch.tensor([(1 << 19) + 1, 1], device="cuda")
    store_cache_quant(k, v, k_cache, v_cache, indices)
    torch.cuda.synchronize()
    inv = torch.tensor(1.0, device="cuda")
    assert_bits_equal(k_cache[(1 << 19) + 1].view(torch.uint8), reference_store_cache_quant(k[0], inv))
    assert_bits_equal(k_cache[1].view(torch.uint8), reference_store_cache_quant(k[1], inv))
    assert k_cache[1 << 19].view(torch.uint8).sum().item() == 0
    assert_bits_equal(v_cache[(1 << 19) + 1].view(torch.uint8), reference_store_cache_quant(v[0], inv))
    del k_cache, v_cache
    torch.cuda.empty_cache()


# ---- graphs, compile, devices ----
@requires_cuda
def test_store_cache_quant_cuda_graph():
    """Captured once, replayed with new k, v, scale values and slots in the same buffers."""
    k, v = source((64, 1024), torch.bfloat16), source((64, 1024), torch.bfloat16)
    k_cache, v_cache = sentinel_filled((300, 1024), FP8), sentinel_filled((300, 1024), FP8)
    ks, vs = scale_of(0.37), scale_of(1.7)
    indices = torch.randperm(300, device="cuda")[:64]
    store_cache_quant(k, v, k_cache, v_cache, indices, ks, vs)  # load outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        store_cache_quant(k, v, k_cache, v_cache, indices, ks, vs)
    k.copy_(source(k.shape, k.dtype))
    v.copy_(source(v.shape, v.dtype))
    ks.fill_(0.9)
    vs.fill_(2.5)
    indices.copy_(torch.randperm(300, device="cuda")[:64])
    indices[::5] = -1
    k_cache.view(torch.uint8).fill_(SENTINEL_BYTE)
    v_cache.view(torch.uint8).fill_(SENTINEL_BYTE)
    expected_k = expected_cache(k_cache, k, inv_of(ks, 1.0), indices)
    expected_v = expected_cache(v_cache, v, inv_of(vs, 1.0), indices)
    graph.replay()
    torch.cuda.synchronize()
    assert_bits_equal(k_cache.view(torch.uint8), expected_k)
    assert_bits_equal(v_cache.view(torch.uint8), expected_v)


@requires_cuda
def test_store_cache_quant_torch_compile_fullgraph():
    torch._dynamo.reset()

    def f(k, v, k_cache, v_cache, indices, ks):
        store_cache_quant(k * 2, v, k_cache, v_cache, indices, ks, v_inv_scale=0.5, size_limit=30)
        return k_cache.float().sum(dim=-1)

    k, v = source((16, 8, 128), torch.bfloat16), source((16, 8, 128), torch.bfloat16)
    k_cache, v_cache = sentinel_filled((40, 8, 128), FP8), sentinel_filled((40, 8, 128), FP8)
    ks = scale_of(0.37)
    indices = torch.randperm(40, device="cuda")[:16]
    expected_k = expected_cache(k_cache, k * 2, inv_of(ks, 1.0), indices, 30)
    expected_v = expected_cache(v_cache, v, inv_of(None, 0.5), indices, 30)
    sums = torch.compile(f, fullgraph=True)(k, v, k_cache, v_cache, indices, ks)
    assert_bits_equal(k_cache.view(torch.uint8).reshape(40, -1), expected_k)
    assert_bits_equal(v_cache.view(torch.uint8).reshape(40, -1), expected_v)
    torch.testing.assert_close(sums, expected_k.view(FP8).float().reshape(40, 8, 128).sum(dim=-1))


@requires_two_gpus
def test_store_cache_quant_on_second_gpu_while_first_is_current():
    torch.cuda.set_device(0)
    dev = "cuda:1"
    k, v = source((9, 128), torch.bfloat16, device=dev), source((9, 128), torch.bfloat16, device=dev)
    k_cache, v_cache = sentinel_filled((20, 128), FP8, dev), sentinel_filled((20, 128), FP8, dev)
    indices = torch.randperm(20, device=dev)[:9]
    ks = scale_of(0.5, dev)
    store_cache_quant(k, v, k_cache, v_cache, indices, ks, v_inv_scale=3.0)
    expected = k_cache.view(torch.uint8).clone().fill_(SENTINEL_BYTE)
    expected[indices] = reference_store_cache_quant(k, 1.0 / ks)
    assert_bits_equal(k_cache.view(torch.uint8), expected)


# ---- the index check (SGLANG_JIT_CHECK_INDICES=1) ----
@requires_cuda
def test_store_cache_quant_index_check(monkeypatch):
    monkeypatch.setenv(CHECK_INDICES_ENV, "1")
    k, v = source((4, 16), torch.bfloat16), source((4, 16), torch.bfloat16)
    k_cache, v_cache = sentinel_filled((10, 16), FP8), sentinel_filled((10, 16), FP8)
    store_cache_quant(k, v, k_cache, v_cache, torch.tensor([0, -1, 3, 9], device="cuda"), size_limit=5)  # skips
    before = k_cache.clone()
    with pytest.raises(
        IndexError,
        match=r"^store_cache_quant: indices value: expected entries in \[0, 10\) \(num_slots\) or -1 \(skipped\), "
        r"got 10 at position 2$",
    ):
        store_cache_quant(k, v, k_cache, v_cache, torch.tensor([0, 4, 10, -3], device="cuda"))
    assert_bits_equal(k_cache, before)


# ---- errors (raised before any launch) ----
def test_store_cache_quant_cpu_and_non_tensors():
    k = torch.zeros(4, 8, dtype=torch.bfloat16)
    cache = torch.zeros(8, 8, dtype=FP8)
    with pytest.raises(RuntimeError, match=r"^store_cache_quant: k device: expected a CUDA device, got cpu$"):
        store_cache_quant(k, k, cache, cache.clone(), torch.zeros(4, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"^store_cache_quant: k type: expected a torch.Tensor, got list$"):
        store_cache_quant([1.0], k, cache, cache, k)


def _args() -> list:
    k, v = source((8, 2, 16), torch.bfloat16), source((8, 2, 16), torch.bfloat16)
    k_cache, v_cache = sentinel_filled((16, 2, 16), FP8), sentinel_filled((16, 2, 16), FP8)
    return [k, v, k_cache, v_cache, torch.randperm(16, device="cuda")[:8], scale_of(0.5), scale_of(2.0)]


@requires_cuda
@pytest.mark.parametrize(
    "position,replacement,pattern",
    [
        (0, lambda a: a[0].double(), r"^store_cache_quant: k dtype: expected one of float16, bfloat16, float32, got "),
        (1, lambda a: a[1].half(), r"^store_cache_quant: v dtype: expected bfloat16 \(the dtype of k\), got float16$"),
        (1, lambda a: a[1][:7], r"^store_cache_quant: v shape: expected 8 tokens \(the rows of k\), got 7$"),
        (2, lambda a: a[2].view(torch.uint8), r"^store_cache_quant: k_cache dtype: expected float8_e4m3fn, got uint8$"),
        (
            3,
            lambda a: sentinel_filled((16, 2, 16), torch.bfloat16),
            r"^store_cache_quant: v_cache dtype: expected float8_e4m3fn, got bfloat16$",
        ),
        (
            2,
            lambda a: sentinel_filled((16, 2, 8), FP8),
            r"^store_cache_quant: k_cache row size: expected 32 elements \(the row of k\), got 16 elements ",
        ),
        (
            3,
            lambda a: sentinel_filled((17, 2, 16), FP8),
            r"^store_cache_quant: v_cache shape: expected 16 slots \(the slots of k_cache\), got 17$",
        ),
        (5, lambda a: a[5].half(), r"^store_cache_quant: k_scale dtype: expected float32, got float16$"),
        (
            6,
            lambda a: torch.ones(2, device="cuda"),
            r"^store_cache_quant: v_scale shape: expected \[1\] or \[\] \(one float32 on the device\), got \(2,\)$",
        ),
        (5, lambda a: torch.ones(1), r"^store_cache_quant: k_scale device: expected a CUDA device, got cpu$"),
        (5, lambda a: 0.5, r"^store_cache_quant: k_scale type: expected a torch.Tensor, got float$"),
        (4, lambda a: a[4].float(), r"^store_cache_quant: indices dtype: expected one of int32, int64, got float32$"),
        (4, lambda a: a[4].view(2, 4), r"^store_cache_quant: indices shape: expected \[num_indices\], got \(2, 4\)$"),
        (4, lambda a: torch.arange(9, device="cuda"), r"^store_cache_quant: indices shape: expected at most 8 entries"),
        (
            0,
            lambda a: source((8, 2, 32), torch.bfloat16)[:, :, ::2],
            r"^store_cache_quant: k last-dim stride: expected 1",
        ),
        (
            2,
            lambda a: a[0].view(torch.uint8).view(FP8).view(16, 2, 16),
            r"^store_cache_quant: k_cache overlaps k: expected disjoint memory, got ",
        ),
        (3, lambda a: a[2], r"^store_cache_quant: v_cache overlaps k_cache: expected disjoint memory, got "),
        (
            2,
            lambda a: sentinel_filled((1, 2, 16), FP8).expand(16, 2, 16),
            r"^store_cache_quant: k_cache ",
        ),
    ],
)
def test_store_cache_quant_bad_tensors(position, replacement, pattern):
    args = _args()
    args[position] = replacement(args)
    caches = [a for a in args[2:4] if isinstance(a, torch.Tensor)]
    before = [a.clone() for a in caches]
    with pytest.raises((RuntimeError, TypeError), match=pattern):
        store_cache_quant(*args)
    torch.cuda.synchronize()
    for a, b in zip(caches, before):
        assert_bits_equal(a, b)


@requires_cuda
def test_store_cache_quant_bad_scalars():
    args = _args()
    before = [a.clone() for a in args[2:4]]
    with pytest.raises(TypeError, match=r"^store_cache_quant: size_limit type: expected an int, got float$"):
        store_cache_quant(*args, size_limit=2.0)
    with pytest.raises(TypeError, match=r"^store_cache_quant: size_limit type: expected an int, got bool$"):
        store_cache_quant(*args, size_limit=True)
    with pytest.raises(ValueError, match=r"^store_cache_quant: size_limit value: expected >= 0 and <= \d+, got -1$"):
        store_cache_quant(*args, size_limit=-1)
    with pytest.raises(TypeError, match=r"^store_cache_quant: k_inv_scale type: expected a real number"):
        store_cache_quant(*args[:5], k_inv_scale="2")
    with pytest.raises(
        ValueError, match=r"^store_cache_quant: v_inv_scale value: expected 1.0 \(the default\) when v_scale is given"
    ):
        store_cache_quant(*args, v_inv_scale=2.0)
    torch.cuda.synchronize()
    for a, b in zip(args[2:4], before):
        assert_bits_equal(a, b)


@requires_cuda
def test_store_cache_quant_ffi_rejects_mismatch_from_cpp():
    """The launcher's TensorMatcher is the second line: bad tensors straight to the module raise a
    RuntimeError naming the tensor, never a CUDA fault."""
    from sglang.jit_kernel.kvcache import _jit_store_cache_quant_module

    module = _jit_store_cache_quant_module(torch.bfloat16)
    k, v, k_cache, v_cache, indices, ks, vs = _args()
    k, v, k_cache, v_cache = (t.flatten(1) for t in (k, v, k_cache, v_cache))
    with pytest.raises(RuntimeError, match="k_cache"):
        module.store_cache_quant(k, v, k_cache.view(torch.uint8), v_cache, indices, ks, vs, 1.0, 1.0, 0)
    with pytest.raises(RuntimeError, match="k_scale"):
        module.store_cache_quant(k, v, k_cache, v_cache, indices, ks.half(), vs, 1.0, 1.0, 0)
    with pytest.raises(RuntimeError, match="v_scale"):
        module.store_cache_quant(k, v, k_cache, v_cache, indices, ks, vs, 1.0, 2.0, 0)
    with pytest.raises(RuntimeError, match="indices"):
        module.store_cache_quant(k, v, k_cache, v_cache, torch.arange(9, device="cuda"), ks, vs, 1.0, 1.0, 0)
    with pytest.raises(RuntimeError, match="overlaps"):
        module.store_cache_quant(k, v, k_cache, k_cache, indices, ks, vs, 1.0, 1.0, 0)
    with pytest.raises(RuntimeError, match="size_limit"):
        module.store_cache_quant(k, v, k_cache, v_cache, indices, ks, vs, 1.0, 1.0, -1)
    with pytest.raises(RuntimeError):
        module.store_cache_quant(k.half(), v.half(), k_cache, v_cache, indices, ks, vs, 1.0, 1.0, 0)


@pytest.mark.parametrize("arg", ["k_inv_scale", "v_inv_scale"])
def test_store_cache_quant_inv_scale_int_past_the_float_range(arg):
    """An int inverse scale too large for a float raised a bare OverflowError from float(); now the
    ValueError naming it. The op's own call reaches this check only on CUDA (its tensors are checked
    first), so the shared check is called as the op calls it."""
    from sglang.jit_kernel._validate import check_static_scale

    k = torch.zeros(4, 8, dtype=torch.bfloat16)
    with pytest.raises(
        ValueError, match=rf"^store_cache_quant: {arg} value: expected a real number in the float range"
    ):
        check_static_scale("store_cache_quant", arg.replace("_inv", ""), None, arg, 10**400, (k, "k"))


@pytest.mark.parametrize(
    "size_limit,error,pattern",
    [
        (2**63, ValueError, r"size_limit value: expected >= 0 and <= 9223372036854775807, got 9223372036854775808$"),
        (-1, ValueError, r"size_limit value: expected >= 0"),
        (True, TypeError, r"size_limit type: expected an int, got bool$"),
        (2.0, TypeError, r"size_limit type: expected an int, got float$"),
    ],
)
def test_store_cache_quant_bad_size_limit_on_cpu(size_limit, error, pattern):
    """size_limit is checked before the tensors (reachable without a GPU); one past int64 passed the
    check and reached the FFI, which does not take it as an int64 (an error not naming size_limit)."""
    k = torch.zeros(4, 8, dtype=torch.bfloat16)
    cache = torch.zeros(8, 8, dtype=FP8)
    with pytest.raises(error, match=r"^store_cache_quant: " + pattern):
        store_cache_quant(k, k, cache, cache.clone(), torch.zeros(4, dtype=torch.int64), size_limit=size_limit)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))
