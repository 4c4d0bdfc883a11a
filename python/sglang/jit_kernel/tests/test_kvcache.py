"""kvcache: store_cache and set_mla_kv_buffer as bit copies into sentinel-filled caches (every byte
not addressed must keep the sentinel), row sizes, dtypes, slot maps with -1 and stray entries,
views, graphs, compile, the index check and every error case."""

import pytest
import torch

from sglang.jit_kernel._validate import CHECK_INDICES_ENV, check_indices
from sglang.jit_kernel.kvcache import can_use_set_mla_kv_buffer, can_use_store_cache, set_mla_kv_buffer, store_cache
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

register_cuda_ci(est_time=90, suite="stage-b-kernel-unit-1-gpu-large")
register_cuda_ci(est_time=240, suite="nightly-kernel-1-gpu", nightly=True)


# Row sizes in elements (the grid: 2 ... 4096); a row of n elements of a dtype of e bytes
# is n * e bytes, so 6 elements of fp8 is a 6-byte row (2-byte vectors), 98 bf16 a 196-byte row.
ROWS = get_ci_test_range(
    full_range=[1, 2, 3, 6, 7, 64, 96, 98, 100, 128, 576, 1024, 4096],
    ci_range=[2, 6, 98, 128, 576, 1024],
)
CACHE_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn]
TOKENS = get_ci_test_range(full_range=[1, 7, 129, 1000, 4097], ci_range=[1, 7, 129])


def byte_rows(t: torch.Tensor) -> torch.Tensor:
    """``[n, ...]`` of any dtype -> its bytes as ``[n, row_bytes]`` uint8 (a copy, never a view)."""
    return as_bytes(t.reshape(t.shape[0], -1)).view(t.shape[0], -1).clone()


def reference_store(cache: torch.Tensor, rows: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``cache`` with ``cache[indices[i]] = rows[i]`` for the indices inside the cache (others
    skipped), computed on the raw bytes (fp8 has no index_put); ``rows`` of the cache's dtype or
    uint8 bytes."""
    expected = byte_rows(cache)
    idx = indices.long()
    valid = (idx >= 0) & (idx < cache.shape[0])
    expected[idx[valid]] = byte_rows(rows)[: len(idx)][valid]
    return expected.view(cache.dtype).view(cache.shape)


def slot_map(kind: str, num_tokens: int, num_slots: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """Distinct slots: random, sorted, or random with every third entry -1 (padding rows)."""
    slots = torch.randperm(num_slots, device="cuda")[:num_tokens]
    if kind == "sorted":
        slots = slots.sort().values
    elif kind == "padded":
        slots[::3] = -1
    return slots.to(dtype)


def make_store(
    num_tokens: int,
    num_slots: int,
    k_row: int,
    v_row: int | None = None,
    dtype: torch.dtype = torch.bfloat16,
    v_dtype: torch.dtype | None = None,
) -> list[torch.Tensor]:
    """Random k, v and sentinel caches: ``[k, v, k_cache, v_cache]``."""
    v_row, v_dtype = v_row if v_row is not None else k_row, v_dtype or dtype
    return [
        random_of((num_tokens, k_row), dtype),
        random_of((num_tokens, v_row), v_dtype),
        sentinel_filled((num_slots, k_row), dtype),
        sentinel_filled((num_slots, v_row), v_dtype),
    ]


def store_and_check(k, v, k_cache, v_cache, indices, **kwargs) -> None:
    """store_cache, then both caches bit for bit against the reference and the sources unchanged."""
    expected_k, expected_v = reference_store(k_cache, k, indices), reference_store(v_cache, v, indices)
    k_before, v_before = k.clone(), v.clone()
    store_cache(k, v, k_cache, v_cache, indices, **kwargs)
    assert_bits_equal(k_cache, expected_k)
    assert_bits_equal(v_cache, expected_v)
    assert_bits_equal(k, k_before)
    assert_bits_equal(v, v_before)


# ---- store_cache: values ----
@requires_cuda
@pytest.mark.parametrize("dtype", CACHE_DTYPES)
@pytest.mark.parametrize("row", ROWS)
@pytest.mark.parametrize("num_tokens", TOKENS)
def test_store_cache_rows_and_dtypes(dtype, row, num_tokens):
    num_slots = 2 * num_tokens + 3
    store_and_check(*make_store(num_tokens, num_slots, row, dtype=dtype), slot_map("random", num_tokens, num_slots))


@requires_cuda
@pytest.mark.parametrize("kind", ["random", "sorted", "padded"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_store_cache_slot_maps(kind, index_dtype):
    store_and_check(*make_store(300, 1025, 1024), slot_map(kind, 300, 1025, index_dtype))


@requires_cuda
@pytest.mark.parametrize("k_row,v_row", [(128, 64), (576, 512), (64, 1), (6, 98), (2, 4096)])
def test_store_cache_different_k_and_v_rows(k_row, v_row):
    """v_head_dim != head_dim: each part uses its own row width (v's row is inferred)."""
    store_and_check(*make_store(129, 300, k_row, v_row, torch.float16), slot_map("padded", 129, 300))


@requires_cuda
def test_store_cache_k_and_v_of_different_dtypes():
    """Bit copies: an fp8 k cache next to a bf16 v cache is fine (each cache matches its source)."""
    tensors = make_store(64, 100, 128, 96, torch.float8_e4m3fn, torch.bfloat16)
    store_and_check(*tensors, slot_map("random", 64, 100))


@requires_cuda
def test_store_cache_slot_map_shorter_than_k():
    """Only the first len(indices) rows are written; the padded rows of k and v are not read."""
    store_and_check(*make_store(64, 80, 256), slot_map("random", 40, 80))


@requires_cuda
@pytest.mark.parametrize("bad", [-1, -2, 80, 81, 2**31, 2**40, -(2**40)])
def test_store_cache_out_of_range_indices_write_nothing(bad):
    """Any index outside [0, num_slots) skips its row: nothing out of bounds or in another slot, and
    the context stays usable (no device trap)."""
    row, num_slots = 1024, 80
    big = sentinel_filled((num_slots + 2, row), torch.bfloat16)  # a slot of poison on each side
    k_cache = big[1:-1]
    v_cache = sentinel_filled((num_slots, row), torch.bfloat16)
    k, v = random_of((16, row), torch.bfloat16), random_of((16, row), torch.bfloat16)
    indices = slot_map("random", 16, num_slots)
    indices[[0, 5, 15]] = bad
    expected_big = big.clone()
    expected_big[1:-1] = reference_store(k_cache, k, indices)
    expected_v = reference_store(v_cache, v, indices)
    store_cache(k, v, k_cache, v_cache, indices)
    torch.cuda.synchronize()
    assert_bits_equal(big, expected_big)
    assert_bits_equal(v_cache, expected_v)
    assert torch.ones(4, device="cuda").sum().item() == 4  # the context still works


@requires_cuda
@pytest.mark.parametrize("num_split", [1, 2, 3, 7, 64, 10_000])
def test_store_cache_num_split(num_split):
    """The tuning knob changes the work split, never the result (values above the vectors per row
    are clamped)."""
    tensors = make_store(257, 600, 1024, 576)
    store_and_check(*tensors, slot_map("padded", 257, 600), num_split=num_split, row_bytes=2048)


# Indices whose k + v rows (bf16 1024 + 1024: 4 KiB) make 32 MiB, store_cache.cuh's
# kStoreCacheWideMinBytes: from here on the flat kernel moves two 16-byte vectors a thread, one below.
WIDE_MIN_INDICES = (32 << 20) // (2 * 1024 * 2)


@requires_cuda
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("num_indices", [WIDE_MIN_INDICES - 1, WIDE_MIN_INDICES, 2 * WIDE_MIN_INDICES + 1])
def test_store_cache_both_sides_of_the_wide_switch(num_indices, index_dtype):
    """Just below, at and above 32 MiB of k + v rows (one and two vectors a thread): the reference's
    bytes, padding (-1) and out-of-range slots skipped."""
    num_slots = 2 * num_indices + 1
    indices = slot_map("padded", num_indices, num_slots, index_dtype)
    indices[[1, num_indices - 1]] = num_slots
    store_and_check(*make_store(num_indices, num_slots, 1024), indices)


@requires_cuda
@pytest.mark.parametrize("offset", [0, 1, 2, 3, 5])
@pytest.mark.parametrize("row", [64, 98, 1024])
def test_store_cache_strided_and_unaligned_views(offset, row):
    """Sources and caches sliced from wider buffers (token and slot strides free, data pointers off
    16-byte alignment by `offset` elements): right bytes, poison around every cache row intact."""
    dtype, num_tokens, num_slots, pad = torch.bfloat16, 77, 200, 11
    k_wide, v_wide = random_of((num_tokens, row + 2 * pad), dtype), random_of((num_tokens, row + 7), dtype)
    k, v = k_wide[:, offset : offset + row], v_wide[:, 7 - offset % 7 : 7 - offset % 7 + row]
    k_big = sentinel_filled((num_slots, row + 2 * pad), dtype)
    v_big = sentinel_filled((num_slots, row + 2 * pad), dtype)
    k_cache, v_cache = k_big[:, pad + offset : pad + offset + row], v_big[:, pad : pad + row]
    indices_wide = slot_map("padded", 2 * num_tokens, num_slots)
    indices = indices_wide[::2]  # an index stride of 2
    expected_k_big, expected_v_big = k_big.clone(), v_big.clone()
    expected_k_big[:, pad + offset : pad + offset + row] = reference_store(k_cache, k, indices)
    expected_v_big[:, pad : pad + row] = reference_store(v_cache, v, indices)
    store_cache(k, v, k_cache, v_cache, indices)
    assert_bits_equal(k_big, expected_k_big)
    assert_bits_equal(v_big, expected_v_big)


@requires_cuda
@pytest.mark.parametrize("check_indices", [False, True])
def test_store_cache_interleaved_caches_of_one_buffer(monkeypatch, check_indices):
    """k and v caches as the two halves of each slot of one fused kv buffer [num_slots, 2, row]:
    they share no element, so the checked path (first call, or SGLANG_JIT_CHECK_INDICES=1) takes
    them as the fast path does; a v cache on the same elements as k's is refused on both."""
    if check_indices:
        monkeypatch.setenv(CHECK_INDICES_ENV, "1")
    else:
        monkeypatch.delenv(CHECK_INDICES_ENV, raising=False)
    dtype, num_tokens, num_slots, row = torch.bfloat16, 37, 96, 256
    kv = sentinel_filled((num_slots, 2, row), dtype)
    k_cache, v_cache = kv[:, 0], kv[:, 1]
    k, v = random_of((num_tokens, row), dtype), random_of((num_tokens, row), dtype)
    indices = slot_map("padded", num_tokens, num_slots)
    expected = kv.clone()
    expected[:, 0] = reference_store(k_cache, k, indices)
    expected[:, 1] = reference_store(v_cache, v, indices)
    for _ in range(2):  # checked path on a first call (always with the env set), then the fast path
        kv.copy_(sentinel_filled((num_slots, 2, row), dtype))
        store_cache(k, v, k_cache, v_cache, indices)
        assert_bits_equal(kv, expected)
    with pytest.raises(RuntimeError, match=r"^store_cache: .*v_cache.*overlap"):
        store_cache(k, v, k_cache, kv[:, 0], indices)


@requires_cuda
def test_store_cache_head_shaped_tensors():
    """[num_tokens, num_kv_heads, head_dim] sources into [num_slots, num_kv_heads, head_dim] caches."""
    k, v = random_of((33, 8, 128), torch.bfloat16), random_of((33, 8, 128), torch.bfloat16)
    k_cache, v_cache = sentinel_filled((99, 8, 128), torch.bfloat16), sentinel_filled((99, 8, 128), torch.bfloat16)
    store_and_check(k, v, k_cache, v_cache, slot_map("random", 33, 99, torch.int32))


@requires_cuda
@pytest.mark.parametrize("shape", [(0, 1024), (5, 1024)])
def test_store_cache_empty(shape):
    k = random_of(shape, torch.bfloat16)
    k_cache = sentinel_filled((10, 1024), torch.bfloat16)
    v_cache = sentinel_filled((10, 1024), torch.bfloat16)
    before = k_cache.clone()
    store_cache(k, k.clone(), k_cache, v_cache, torch.empty(0, dtype=torch.int64, device="cuda"))
    assert_bits_equal(k_cache, before)
    # no slots at all: every index is outside the cache
    k, v = random_of((3, 8), torch.bfloat16), random_of((3, 8), torch.bfloat16)
    no_slots = [sentinel_filled((0, 8), torch.bfloat16) for _ in range(2)]
    store_cache(k, v, *no_slots, torch.full((3,), -1, device="cuda"))


@requires_cuda
def test_store_cache_offsets_past_4_gib():
    """64-bit offsets: a slot whose bytes start past 2^32 (a 4.1 GiB cache)."""
    row, num_slots = 4096, (1 << 19) + 8  # 8 KiB rows: slot 2^19 starts at byte 2^32
    free, _ = torch.cuda.mem_get_info()
    if free < 3 * num_slots * row * 2:
        pytest.skip(f"needs {3 * num_slots * row * 2 / 2**30:.0f} GiB free GPU memory")
    k_cache = torch.zeros(num_slots, row, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.zeros(num_slots, row, dtype=torch.bfloat16, device="cuda")
    k, v = random_of((3, row), torch.bfloat16), random_of((3, row), torch.bfloat16)
    indices = torch.tensor([num_slots - 1, 1 << 19, 5], device="cuda")
    store_cache(k, v, k_cache, v_cache, indices)
    for i, slot in enumerate(indices.tolist()):
        assert_bits_equal(k_cache[slot], k[i])
        assert_bits_equal(v_cache[slot], v[i])
    assert k_cache[(1 << 19) - 1].abs().sum().item() == 0 and k_cache[(1 << 19) + 1].abs().sum().item() == 0
    del k_cache, v_cache
    torch.cuda.empty_cache()


@requires_cuda
def test_store_cache_cuda_graph():
    """Captured once, replayed with new k, v and slots (padding rows -1) in the same buffers."""
    k, v = random_of((64, 1024), torch.bfloat16), random_of((64, 1024), torch.bfloat16)
    k_cache, v_cache = sentinel_filled((300, 1024), torch.bfloat16), sentinel_filled((300, 1024), torch.bfloat16)
    indices = slot_map("random", 64, 300)
    store_cache(k, v, k_cache, v_cache, indices)  # load outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        store_cache(k, v, k_cache, v_cache, indices)
    k.copy_(random_of((64, 1024), torch.bfloat16))
    v.copy_(random_of((64, 1024), torch.bfloat16))
    indices.copy_(slot_map("padded", 64, 300))
    k_cache.view(torch.uint8).fill_(SENTINEL_BYTE)
    v_cache.view(torch.uint8).fill_(SENTINEL_BYTE)
    expected_k, expected_v = reference_store(k_cache, k, indices), reference_store(v_cache, v, indices)
    graph.replay()
    torch.cuda.synchronize()
    assert_bits_equal(k_cache, expected_k)
    assert_bits_equal(v_cache, expected_v)


@requires_cuda
def test_store_cache_index_check_left_out_while_capturing(monkeypatch):
    """SGLANG_JIT_CHECK_INDICES=1 cannot read the indices during capture: the capture succeeds."""
    monkeypatch.setenv(CHECK_INDICES_ENV, "1")
    k, v = random_of((8, 64), torch.float16), random_of((8, 64), torch.float16)
    k_cache, v_cache = sentinel_filled((16, 64), torch.float16), sentinel_filled((16, 64), torch.float16)
    indices = slot_map("random", 8, 16)
    store_cache(k, v, k_cache, v_cache, indices)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        store_cache(k, v, k_cache, v_cache, indices)
    graph.replay()
    torch.cuda.synchronize()
    assert_bits_equal(k_cache, reference_store(sentinel_filled((16, 64), torch.float16), k, indices))


@requires_cuda
def test_store_cache_torch_compile_fullgraph():
    torch._dynamo.reset()

    def f(k, v, k_cache, v_cache, indices):
        store_cache(k * 2, v, k_cache, v_cache, indices)
        return k_cache.float().sum(dim=-1)

    compiled = torch.compile(f, fullgraph=True)
    k, v = random_of((16, 8, 128), torch.bfloat16), random_of((16, 8, 128), torch.bfloat16)
    k_cache, v_cache = (
        torch.zeros(40, 8, 128, dtype=torch.bfloat16, device="cuda"),
        torch.zeros(40, 8, 128, dtype=torch.bfloat16, device="cuda"),
    )
    indices = slot_map("padded", 16, 40)
    expected_k, expected_v = reference_store(k_cache, k * 2, indices), reference_store(v_cache, v, indices)
    sums = compiled(k, v, k_cache, v_cache, indices)
    assert_bits_equal(k_cache, expected_k)
    assert_bits_equal(v_cache, expected_v)
    torch.testing.assert_close(sums, expected_k.float().sum(dim=-1))


@requires_two_gpus
def test_store_cache_on_second_gpu_while_first_is_current():
    torch.cuda.set_device(0)
    dev = "cuda:1"
    k, v = random_of((9, 96), torch.bfloat16, dev), random_of((9, 96), torch.bfloat16, dev)
    k_cache, v_cache = sentinel_filled((20, 96), torch.bfloat16, dev), sentinel_filled((20, 96), torch.bfloat16, dev)
    indices = torch.randperm(20, device=dev)[:9]
    expected_k = reference_store(k_cache, k, indices)
    store_cache(k, v, k_cache, v_cache, indices)
    assert_bits_equal(k_cache, expected_k)


@requires_cuda
@pytest.mark.parametrize("size", [1, 2, 3, 6, 98, 100, 2048, 4096, 65536])
def test_can_use_store_cache_every_row_size(size):
    assert can_use_store_cache(size) is True


def test_can_use_store_cache_refuses_nonpositive_and_non_ints():
    assert can_use_store_cache(0) is False
    assert can_use_store_cache(-3) is False
    with pytest.raises(TypeError, match=r"^can_use_store_cache: size type: expected an int, got float$"):
        can_use_store_cache(4.0)


@pytest.mark.parametrize(
    "nope_bytes,rope_bytes", [(1024, 128), (512, 64), (2048, 256), (1, 1), (7, 3), (1022, 130), (511, 65)]
)
def test_can_use_set_mla_kv_buffer_every_positive_row(nope_bytes, rope_bytes):
    """Any positive byte counts, aligned or not (no GPU needed: nothing is loaded)."""
    assert can_use_set_mla_kv_buffer(nope_bytes, rope_bytes) is True


def test_can_use_set_mla_kv_buffer_refuses_empty_parts_and_non_ints():
    for nope_bytes, rope_bytes in ((0, 128), (1024, 0), (0, 0), (-2, 128), (1024, -1)):
        assert can_use_set_mla_kv_buffer(nope_bytes, rope_bytes) is False, (nope_bytes, rope_bytes)
    for arg, bad, nope_bytes, rope_bytes in (
        ("nope_bytes", "float", 1024.0, 128),
        ("nope_bytes", "bool", True, 128),
        ("rope_bytes", "NoneType", 1024, None),
        ("rope_bytes", "str", 1024, "128"),
    ):
        with pytest.raises(TypeError, match=rf"^can_use_set_mla_kv_buffer: {arg} type: expected an int, got {bad}$"):
            can_use_set_mla_kv_buffer(nope_bytes, rope_bytes)


# ---- the index check (SGLANG_JIT_CHECK_INDICES=1) ----
def test_check_indices_is_off_by_default(monkeypatch):
    monkeypatch.delenv(CHECK_INDICES_ENV, raising=False)
    check_indices("store_cache", "indices", torch.tensor([0, 99, -7]), 4)


@pytest.mark.parametrize(
    "value,enabled",
    [("1", True), ("true", True), (" Yes ", True), ("ON", True), ("0", False), ("", False), ("no", False)],
)
def test_check_indices_switch_spellings(monkeypatch, value, enabled):
    """SGLANG_JIT_CHECK_INDICES takes the package's flag words (1/true/yes/on, any case), as the
    SGLANG_JIT_* build switches do; anything else leaves the check off."""
    from sglang.jit_kernel._validate import check_indices_enabled

    monkeypatch.setenv(CHECK_INDICES_ENV, value)
    assert check_indices_enabled() is enabled
    bad = torch.tensor([0, 9])
    if enabled:
        with pytest.raises(IndexError, match=r"got 9 at position 1$"):
            check_indices("store_cache", "indices", bad, 4)
    else:
        check_indices("store_cache", "indices", bad, 4)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_check_indices_names_the_first_bad_entry(monkeypatch, dtype):
    monkeypatch.setenv(CHECK_INDICES_ENV, "1")
    check_indices("store_cache", "indices", torch.tensor([0, -1, 3], dtype=dtype), 4)  # -1 is skipped
    with pytest.raises(
        IndexError,
        match=r"^store_cache: indices value: expected entries in \[0, 4\) \(num_slots\) "
        r"or -1 \(skipped\), got 7 at position 3$",
    ):
        check_indices("store_cache", "indices", torch.tensor([0, -1, 3, 7, -2], dtype=dtype), 4, dim_name="num_slots")
    with pytest.raises(
        IndexError,
        match=r"^rope: positions value: expected entries in \[0, 4\) \(size\), got 9 at "
        r"position \(1, 0\)$",
    ):
        check_indices("rope", "positions", torch.tensor([[0, 1], [9, -1]], dtype=dtype), 4, skip_value=None)


@requires_cuda
@pytest.mark.parametrize("bad", [-2, 16, 1 << 40])
def test_store_cache_index_check_raises_before_writing(monkeypatch, bad):
    monkeypatch.setenv(CHECK_INDICES_ENV, "1")
    k, v = random_of((8, 64), torch.float16), random_of((8, 64), torch.float16)
    k_cache, v_cache = sentinel_filled((16, 64), torch.float16), sentinel_filled((16, 64), torch.float16)
    store_cache(k, v, k_cache, v_cache, slot_map("padded", 8, 16))  # -1 passes the check
    k_cache.view(torch.uint8).fill_(SENTINEL_BYTE)
    before = k_cache.clone()
    indices = slot_map("random", 8, 16)
    indices[4] = bad
    with pytest.raises(
        IndexError,
        match=rf"^store_cache: indices value: expected entries in \[0, 16\) \(num_slots\) "
        rf"or -1 \(skipped\), got {bad} at position 4$",
    ):
        store_cache(k, v, k_cache, v_cache, indices)
    assert_bits_equal(k_cache, before)


@requires_cuda
def test_set_mla_kv_buffer_index_check(monkeypatch):
    monkeypatch.setenv(CHECK_INDICES_ENV, "1")
    kv = sentinel_filled((10, 576), torch.bfloat16)
    with pytest.raises(
        IndexError,
        match=r"^set_mla_kv_buffer: loc value: expected entries in \[0, 10\) "
        r"\(num_slots\) or -1 \(skipped\), got 10 at position 1$",
    ):
        set_mla_kv_buffer(
            kv,
            torch.tensor([3, 10], device="cuda"),
            random_of((2, 512), torch.bfloat16),
            random_of((2, 64), torch.bfloat16),
        )


# ---- store_cache: errors (raised before any launch) ----
def test_store_cache_cpu_and_non_tensors():
    k = torch.zeros(4, 8)
    with pytest.raises(RuntimeError, match=r"^store_cache: k device: expected a CUDA device, got cpu$"):
        store_cache(k, k, k.clone(), k.clone(), torch.zeros(4, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"^store_cache: k type: expected a torch.Tensor, got list$"):
        store_cache([1.0], k, k, k, k)


def _store_args() -> list[torch.Tensor]:
    return [*make_store(8, 16, 64), slot_map("random", 8, 16)]


@requires_cuda
@pytest.mark.parametrize(
    "position,replacement,error,pattern",
    [
        (
            2,
            lambda a: sentinel_filled((16, 64), torch.float16),
            RuntimeError,
            r"^store_cache: k_cache dtype: expected bfloat16 \(the dtype of k\), got float16$",
        ),
        (
            3,
            lambda a: sentinel_filled((16, 32), torch.bfloat16),
            RuntimeError,
            r"^store_cache: v_cache row size: expected 128 bytes \(the row of v\), got 64 bytes \(shape \(16, 32\)\)$",
        ),
        (
            3,
            lambda a: sentinel_filled((17, 64), torch.bfloat16),
            RuntimeError,
            r"^store_cache: v_cache shape: expected 16 slots \(the slots of k_cache\), got 17$",
        ),
        (
            4,
            lambda a: a[4].float(),
            RuntimeError,
            r"^store_cache: indices dtype: expected one of int32, int64, got float32$",
        ),
        (
            4,
            lambda a: a[4].view(2, 4),
            RuntimeError,
            r"^store_cache: indices shape: expected \[num_indices\], got \(2, 4\)$",
        ),
        (
            4,
            lambda a: torch.zeros(9, dtype=torch.int64, device="cuda"),
            RuntimeError,
            r"^store_cache: indices shape: expected at most 8 entries \(the rows of k\), got 9$",
        ),
        (
            1,
            lambda a: random_of((7, 64), torch.bfloat16),
            RuntimeError,
            r"^store_cache: v shape: expected 8 tokens \(the rows of k\), got 7$",
        ),
        (
            0,
            lambda a: random_of((8, 128), torch.bfloat16)[:, ::2],
            RuntimeError,
            r"^store_cache: k last-dim stride: expected 1 \(a contiguous row\), got 2 ",
        ),
        (
            0,
            lambda a: random_of((8,), torch.bfloat16),
            RuntimeError,
            r"^store_cache: k shape: expected \[num_tokens, row\.\.\.\] \(at least 2 dims\), got \(8,\)$",
        ),
        (4, lambda a: a[4].cpu(), RuntimeError, r"^store_cache: indices device: expected a CUDA device, got cpu$"),
    ],
)
def test_store_cache_bad_tensors(position, replacement, error, pattern):
    args = _store_args()
    args[position] = replacement(args)
    before = [a.clone() for a in args[2:4]]
    with pytest.raises(error, match=pattern):
        store_cache(*args)
    for a, b in zip(args[2:4], before):
        assert_bits_equal(a, b)


@requires_cuda
def test_store_cache_bad_scalars():
    args = _store_args()
    with pytest.raises(
        ValueError,
        match=r"^store_cache: row_bytes value: expected 0 or 128 \(the row of k in bytes\), "
        r"got 64$",
    ):
        store_cache(*args, row_bytes=64)
    with pytest.raises(
        ValueError, match=r"^store_cache: num_split value: expected >= 0 and <= 9223372036854775807, got -1$"
    ):
        store_cache(*args, num_split=-1)
    with pytest.raises(TypeError, match=r"^store_cache: row_bytes type: expected an int, got float$"):
        store_cache(*args, row_bytes=128.0)


@requires_cuda
def test_store_cache_cache_sharing_memory_with_a_source():
    k, v, k_cache, v_cache, indices = _store_args()
    with pytest.raises(RuntimeError, match=r"^store_cache: k_cache overlaps k: expected disjoint memory, got "):
        store_cache(k, v, k, v_cache[:8], indices)


@requires_cuda
def test_store_cache_ffi_rejects_mismatch_from_cpp():
    """The launcher's TensorMatcher is the second line: bad tensors straight to the module raise a
    RuntimeError naming the tensor, never a CUDA fault."""
    from sglang.jit_kernel.kvcache import _jit_store_cache_module

    module = _jit_store_cache_module(torch.int64, "wide")
    k, v, k_cache, v_cache, indices = _store_args()
    with pytest.raises(RuntimeError, match="k_cache"):
        module.store_cache(k, v, k_cache.half(), v_cache, indices, 0, 0)
    with pytest.raises(RuntimeError, match="indices"):
        module.store_cache(k, v, k_cache, v_cache, indices.float(), 0, 0)
    with pytest.raises(RuntimeError, match="at most num_tokens"):
        module.store_cache(k, v, k_cache, v_cache, torch.zeros(9, dtype=torch.int64, device="cuda"), 0, 0)
    with pytest.raises(RuntimeError, match="row_bytes"):
        module.store_cache(k, v, k_cache, v_cache, indices, 7, 0)
    with pytest.raises(RuntimeError, match="overlaps"):
        module.store_cache(k, v, k, v_cache[:8], indices, 0, 0)
    with pytest.raises(RuntimeError, match="indices"):  # the int64 build takes no int32 indices
        module.store_cache(k, v, k_cache, v_cache, indices.int(), 0, 0)
    # rows that do not allow 16-byte vectors: the wide build declines (False) and writes nothing
    before = k_cache.clone()
    assert module.store_cache(k[:, 1:], v[:, 1:], k_cache[:, 1:], v_cache[:, 1:], indices, 0, 0) is False
    assert torch.equal(k_cache, before)


# ---- set_mla_kv_buffer ----
def reference_mla(kv: torch.Tensor, loc: torch.Tensor, nope: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    rows = torch.cat([byte_rows(nope), byte_rows(rope)], dim=-1)  # bytes: fp8 has no cat
    return reference_store(kv, rows, loc)


MLA_DIMS = get_ci_test_range(
    full_range=[(512, 64), (128, 64), (64, 32), (7, 3), (1, 1), (511, 65)],
    ci_range=[(512, 64), (7, 3), (511, 65)],
)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float32])
@pytest.mark.parametrize("nope,rope", MLA_DIMS)
@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("head_dim_of_one", [False, True])
def test_set_mla_kv_buffer_values(dtype, nope, rope, num_tokens, head_dim_of_one):
    num_slots = 2 * num_tokens + 5
    mid = (1,) if head_dim_of_one else ()
    kv = sentinel_filled((num_slots, *mid, nope + rope), dtype)
    k_nope, k_rope = random_of((num_tokens, *mid, nope), dtype), random_of((num_tokens, *mid, rope), dtype)
    loc = slot_map("padded" if num_tokens > 1 else "random", num_tokens, num_slots)
    expected = reference_mla(kv, loc, k_nope, k_rope)
    set_mla_kv_buffer(kv, loc, k_nope, k_rope)
    assert_bits_equal(kv, expected)


@requires_cuda
@pytest.mark.parametrize("offset", [0, 1, 3])
def test_set_mla_kv_buffer_views(offset):
    """k_nope and k_rope as column slices of one fused buffer (token stride 576 + pad), loc strided
    int32, kv_buffer rows inside a wider poisoned buffer: right bytes, poison intact."""
    num_tokens, num_slots, pad = 100, 250, 8
    fused = random_of((num_tokens, 576 + pad), torch.bfloat16)
    k_nope, k_rope = fused[:, offset : offset + 512], fused[:, offset + 512 : offset + 576]
    big = sentinel_filled((num_slots, 576 + 2 * pad), torch.bfloat16)
    kv = big[:, pad + offset : pad + offset + 576]
    loc = slot_map("padded", 2 * num_tokens, num_slots, torch.int32)[::2]
    expected_big = big.clone()
    expected_big[:, pad + offset : pad + offset + 576] = reference_mla(kv, loc, k_nope, k_rope)
    set_mla_kv_buffer(kv, loc, k_nope, k_rope)
    assert_bits_equal(big, expected_big)


@requires_cuda
def test_set_mla_kv_buffer_out_of_range_and_empty():
    kv = sentinel_filled((32, 1, 576), torch.bfloat16)
    k_nope, k_rope = random_of((6, 1, 512), torch.bfloat16), random_of((6, 1, 64), torch.bfloat16)
    loc = torch.tensor([0, -1, 32, -5, 1 << 40, 31], device="cuda")
    expected = reference_mla(kv, loc, k_nope, k_rope)
    set_mla_kv_buffer(kv, loc, k_nope, k_rope)
    torch.cuda.synchronize()
    assert_bits_equal(kv, expected)
    set_mla_kv_buffer(kv, loc[:0], k_nope[:0], k_rope[:0])
    assert_bits_equal(kv, expected)


@requires_cuda
def test_set_mla_kv_buffer_cuda_graph_and_compile():
    kv = sentinel_filled((300, 1, 576), torch.bfloat16)
    k_nope, k_rope = random_of((64, 1, 512), torch.bfloat16), random_of((64, 1, 64), torch.bfloat16)
    loc = slot_map("random", 64, 300)
    set_mla_kv_buffer(kv, loc, k_nope, k_rope)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        set_mla_kv_buffer(kv, loc, k_nope, k_rope)
    k_nope.copy_(random_of((64, 1, 512), torch.bfloat16))
    loc.copy_(slot_map("padded", 64, 300))
    kv.view(torch.uint8).fill_(SENTINEL_BYTE)
    expected = reference_mla(kv, loc, k_nope, k_rope)
    graph.replay()
    torch.cuda.synchronize()
    assert_bits_equal(kv, expected)

    torch._dynamo.reset()

    def f(kv, loc, k_nope, k_rope):
        set_mla_kv_buffer(kv, loc, k_nope + 1, k_rope)
        return kv[:, 0, :4].float() * 2

    kv.view(torch.uint8).fill_(SENTINEL_BYTE)
    expected = reference_mla(kv, loc, k_nope + 1, k_rope)
    out = torch.compile(f, fullgraph=True)(kv, loc, k_nope, k_rope)
    assert_bits_equal(kv, expected)
    assert_bits_equal(out, expected[:, 0, :4].float() * 2)


def test_set_mla_kv_buffer_cpu_error():
    with pytest.raises(RuntimeError, match=r"^set_mla_kv_buffer: kv_buffer device: expected a CUDA device, got cpu$"):
        set_mla_kv_buffer(
            torch.zeros(4, 576), torch.zeros(2, dtype=torch.int64), torch.zeros(2, 512), torch.zeros(2, 64)
        )


@requires_cuda
@pytest.mark.parametrize(
    "name,replacement,pattern",
    [
        (
            "k_nope",
            lambda: random_of((4, 512), torch.float16),
            r"^set_mla_kv_buffer: cache_k_nope dtype: expected bfloat16 \(the dtype of kv_buffer\), got float16$",
        ),
        (
            "k_rope",
            lambda: random_of((4, 32), torch.bfloat16),
            r"^set_mla_kv_buffer: kv_buffer row size: expected nope \+ rope = 512 \+ 32 = 544 elements, got 576$",
        ),
        (
            "k_rope",
            lambda: random_of((3, 64), torch.bfloat16),
            r"^set_mla_kv_buffer: cache_k_rope shape: expected 4 tokens \(the entries of loc\), got 3$",
        ),
        (
            "k_nope",
            lambda: random_of((4, 2, 512), torch.bfloat16),
            r"^set_mla_kv_buffer: cache_k_nope shape: expected \[num_tokens, nope\] or \[num_tokens, 1, nope\], "
            r"got \(4, 2, 512\)$",
        ),
        (
            "loc",
            lambda: torch.zeros(4, device="cuda"),
            r"^set_mla_kv_buffer: loc dtype: expected one of int32, int64, got float32$",
        ),
    ],
)
def test_set_mla_kv_buffer_bad_inputs(name, replacement, pattern):
    args = {
        "kv": sentinel_filled((10, 576), torch.bfloat16),
        "loc": torch.arange(4, device="cuda"),
        "k_nope": random_of((4, 512), torch.bfloat16),
        "k_rope": random_of((4, 64), torch.bfloat16),
    }
    args[name] = replacement()
    before = args["kv"].clone()
    with pytest.raises(RuntimeError, match=pattern):
        set_mla_kv_buffer(args["kv"], args["loc"], args["k_nope"], args["k_rope"])
    assert_bits_equal(args["kv"], before)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))


def test_set_mla_kv_buffer_at_the_original_module_path():
    """``sglang.jit_kernel.set_mla_kv_buffer`` (the original package's path) serves the same op as
    ``kvcache.set_mla_kv_buffer`` and registers it (no GPU needed)."""
    from sglang.jit_kernel import kvcache
    from sglang.jit_kernel import set_mla_kv_buffer as module
    from sglang.jit_kernel.registry import all_ops

    assert module.set_mla_kv_buffer is kvcache.set_mla_kv_buffer
    assert module.can_use_set_mla_kv_buffer is kvcache.can_use_set_mla_kv_buffer
    assert "can_use_set_mla_kv_buffer" in module.__all__
    assert all_ops()["set_mla_kv_buffer"].source == "sglang.jit_kernel.set_mla_kv_buffer"
