"""moe_align_block_size: a plain numpy reference (counts, padded offsets, per-block experts, segment
contents as sets, then their ascending order), the issue's block/token/top-k/expert grid, the
sglang num_experts + 1 convention, skipped ids, padding fill, outputs inside poisoned buffers,
empty, large expert counts, determinism, graphs, compile, errors."""

import numpy as np
import pytest
import torch

from sglang.jit_kernel.moe_align import max_num_tokens_padded, moe_align_block_size
from sglang.jit_kernel.testing import assert_poison_intact, padded, poisoned, requires_cuda, requires_two_gpus
from sglang.jit_kernel.utils import get_ci_test_range
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=60, suite="stage-b-kernel-unit-1-gpu-large")
register_cuda_ci(est_time=600, suite="nightly-kernel-1-gpu", nightly=True)

BLOCK_SIZES = get_ci_test_range(full_range=[16, 32, 64, 128, 256], ci_range=[16, 64, 256])
TOKENS = get_ci_test_range(full_range=[1, 7, 64, 129, 1000, 4096], ci_range=[1, 129, 4096])
TOPKS = get_ci_test_range(full_range=[1, 2, 8, 64], ci_range=[1, 8])
EXPERTS = get_ci_test_range(full_range=[64, 160, 256, 257, 260, 264], ci_range=[64, 257])
PAD = 37  # poison elements on each side of every output view
POISON = int(poisoned((1,), torch.int32, "cpu")[0])


def routed_ids(num_tokens: int, topk: int, num_experts: int, dtype=torch.int32, seed: int = 0) -> torch.Tensor:
    """[num_tokens, topk] distinct experts per token, as a router picks them."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.rand(num_tokens, num_experts, generator=g).topk(topk, dim=-1).indices.to(dtype).cuda()


class Outputs:
    """The four output buffers, each a view inside a poisoned buffer, sized as sglang's caller does
    (``numel + num_experts * (block_size - 1)`` slots) unless given."""

    def __init__(self, numel: int, num_experts: int, block_size: int, sorted_len: int | None = None):
        self.sorted_len = sorted_len if sorted_len is not None else numel + num_experts * (block_size - 1)
        self.num_blocks = -(-self.sorted_len // block_size)
        self.sizes = (self.sorted_len, self.num_blocks, 1, num_experts + 2)
        pairs = [padded(poisoned((n,), torch.int32), PAD) for n in self.sizes]
        self.views = [v for v, _ in pairs]
        self.buffers = [b for _, b in pairs]

    def call(self, topk_ids, num_experts, block_size, pad):
        sorted_ids, expert_ids, total, cumsum = self.views
        moe_align_block_size(topk_ids, num_experts, block_size, sorted_ids, expert_ids, total, cumsum, pad)
        return self

    def host(self):
        for buffer, n in zip(self.buffers, self.sizes):
            assert_poison_intact(buffer, PAD, n)
        return [v.cpu().numpy() for v in self.views]


def reference(topk_ids: torch.Tensor, num_experts: int, block_size: int):
    """(members per expert in ascending flat index, padded starts [num_experts + 1])."""
    flat = topk_ids.reshape(-1).cpu().numpy().astype(np.int64)
    members = [np.flatnonzero(flat == e) for e in range(num_experts)]
    padded_counts = np.array([-(-len(m) // block_size) * block_size for m in members], dtype=np.int64)
    return members, np.concatenate([[0], np.cumsum(padded_counts)])


def check(topk_ids, num_experts, block_size, pad=True, out=None, reference_experts=None):
    """Runs the op and checks every output against the reference; returns the host outputs."""
    numel = topk_ids.numel()
    out = out or Outputs(numel, num_experts, block_size)
    sorted_ids, expert_ids, total, cumsum = out.call(topk_ids, num_experts, block_size, pad).host()
    members, starts = reference(topk_ids, reference_experts or num_experts, block_size)
    if reference_experts is not None:  # a larger count: its extra experts have empty segments
        starts = np.concatenate([starts, np.full(num_experts - reference_experts, starts[-1])])
    padded_total = int(starts[-1])
    assert int(total[0]) == padded_total
    assert np.array_equal(cumsum[: num_experts + 1], starts)
    assert (cumsum[num_experts + 1 :] == POISON).all()
    blocks = padded_total // block_size
    block_experts = np.repeat(np.arange(len(members)), np.diff(starts[: len(members) + 1]) // block_size)
    assert np.array_equal(expert_ids[:blocks], block_experts)
    assert (expert_ids[blocks:] == POISON).all(), "blocks past the padded total are not written"
    holds_token = np.zeros(out.sorted_len, dtype=bool)
    for e, m in enumerate(members):
        segment = sorted_ids[starts[e] : starts[e] + len(m)]
        assert set(segment.tolist()) == set(m.tolist()), f"expert {e}: segment contents"
        assert np.array_equal(segment, m), f"expert {e}: not in ascending flat index"
        holds_token[starts[e] : starts[e] + len(m)] = True
    assert (sorted_ids[~holds_token] == (numel if pad else POISON)).all(), "padding and tail slots"
    return sorted_ids, expert_ids, total, cumsum


@requires_cuda
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("topk", TOPKS)
@pytest.mark.parametrize("num_experts", EXPERTS)
def test_moe_align_grid(block_size, num_tokens, topk, num_experts):
    check(routed_ids(num_tokens, topk, num_experts), num_experts, block_size)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("pad", [False, True])
def test_moe_align_dtypes_and_padding_fill(dtype, pad):
    """Without pad_sorted_token_ids, the padding and tail keep the caller's poison."""
    check(routed_ids(129, 8, 256, dtype), 256, 64, pad=pad)


@requires_cuda
def test_moe_align_sglang_convention():
    """sglang passes num_experts + 1 (ids in [0, num_experts)): the extra expert is empty and the
    outputs equal those for num_experts."""
    ids = routed_ids(64, 8, 256)
    first = check(ids, 257, 64, reference_experts=256)
    second = check(ids, 256, 64)
    assert np.array_equal(first[0][: int(first[2][0])], second[0][: int(second[2][0])])
    assert np.array_equal(first[1][: int(first[2][0]) // 64], second[1][: int(second[2][0]) // 64])


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_moe_align_skips_ids_out_of_range(dtype):
    """-1, num_experts, large and (int64) values that wrap to a valid int32 are skipped."""
    ids = routed_ids(129, 8, 64, dtype)
    flat = ids.view(-1)
    flat[::5] = -1
    flat[1::7] = 64
    flat[2::11] = -(2**31) if dtype == torch.int32 else 2**32 + 3
    check(ids, 64, 16)
    check(torch.full((7, 8), -1, dtype=dtype, device="cuda"), 64, 16)  # nothing routed: total 0


@requires_cuda
@pytest.mark.parametrize("num_experts", [1, 3, 1024, 4096, 8192])
@pytest.mark.parametrize("block_size", [1, 16, 256, 1024])
def test_moe_align_expert_counts_and_block_sizes(num_experts, block_size):
    """Few and many experts (past 48 KiB of shared memory from 1024 on), any power-of-two block."""
    num_tokens, topk = 4096, min(8, num_experts)
    check(routed_ids(num_tokens, topk, num_experts, seed=num_experts), num_experts, block_size)


@requires_cuda
@pytest.mark.parametrize("num_experts", [1, 64, 256])
def test_moe_align_skewed(num_experts):
    """Every token to one expert, and a 90 % hot expert: long segments, many equal ids per warp step."""
    check(torch.full((4096, 8), num_experts - 1, dtype=torch.int32, device="cuda"), num_experts, 64)
    ids = routed_ids(4096, 1, num_experts)
    ids[torch.rand(ids.shape, device="cuda") < 0.9] = 0
    check(ids, num_experts, 16)


@requires_cuda
def test_moe_align_many_tokens():
    """131072 ids: several register tiles per warp."""
    check(routed_ids(16384, 8, 256), 256, 64)
    check(routed_ids(3000, 64, 1024), 1024, 128, pad=False)


@requires_cuda
def test_moe_align_views_and_tight_buffers():
    """A strided topk_ids (a column slice) and buffers of exactly the worst case."""
    wide = routed_ids(129, 11, 256)
    ids = wide[:, 2:10]
    numel = ids.numel()
    tight = Outputs(numel, 256, 64, sorted_len=max_num_tokens_padded(numel, 256, 64))
    check(ids, 256, 64, out=tight)
    ids3 = routed_ids(12, 8, 64).view(3, 4, 8)
    check(ids3, 64, 32)
    # one column of [num_tokens, 8]: it flattens to a strided view, which is copied first
    check(routed_ids(129, 8, 256)[:, 3:4], 256, 64)


@requires_cuda
@pytest.mark.parametrize("pad", [False, True])
def test_moe_align_empty(pad):
    """0 tokens: no kernel; num_tokens_post_pad = 0, cumsum 0, padding value 0 with pad."""
    out = Outputs(0, 64, 16).call(torch.empty(0, 8, dtype=torch.int32, device="cuda"), 64, 16, pad)
    sorted_ids, expert_ids, total, cumsum = out.host()
    assert total[0] == 0 and (cumsum[:65] == 0).all() and cumsum[65] == POISON
    assert (sorted_ids == (0 if pad else POISON)).all() and (expert_ids == POISON).all()


@requires_cuda
def test_moe_align_deterministic_graph_compile():
    num_experts, block_size = 256, 64
    ids = routed_ids(4096, 8, num_experts)
    first = [t.copy() for t in check(ids, num_experts, block_size)]
    second = check(ids, num_experts, block_size)
    assert all(np.array_equal(a, b) for a, b in zip(first, second))

    static_ids = torch.zeros_like(ids)
    out = Outputs(ids.numel(), num_experts, block_size)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.call(static_ids, num_experts, block_size, True)
    for seed in (1, 2):
        fresh = routed_ids(4096, 8, num_experts, seed=seed)
        static_ids.copy_(fresh)
        out.views[1].fill_(POISON)  # blocks past this replay's total keep what was there
        graph.replay()
        torch.cuda.synchronize()
        expected = Outputs(ids.numel(), num_experts, block_size).call(fresh, num_experts, block_size, True)
        assert all(np.array_equal(a, b) for a, b in zip(out.host(), expected.host()))

    large = routed_ids(512, 8, 4096)  # the opt-in shared-memory path, captured
    big_out = Outputs(large.numel(), 4096, 16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        big_out.call(large, 4096, 16, True)
    graph.replay()
    torch.cuda.synchronize()
    expected = Outputs(large.numel(), 4096, 16).call(large, 4096, 16, True)
    assert all(np.array_equal(a, b) for a, b in zip(big_out.host(), expected.host()))

    torch._dynamo.reset()

    def f(topk_ids):
        n = topk_ids.numel()
        sorted_len = n + num_experts * (block_size - 1)
        sorted_ids = torch.empty(sorted_len, dtype=torch.int32, device=topk_ids.device)
        expert_ids = torch.empty(-(-sorted_len // block_size), dtype=torch.int32, device=topk_ids.device)
        total = torch.empty(1, dtype=torch.int32, device=topk_ids.device)
        cumsum = torch.empty(num_experts + 1, dtype=torch.int32, device=topk_ids.device)
        moe_align_block_size(topk_ids, num_experts, block_size, sorted_ids, expert_ids, total, cumsum, True)
        return sorted_ids, expert_ids, total

    got = torch.compile(f, fullgraph=True)(ids)
    assert np.array_equal(got[0].cpu().numpy(), first[0][: got[0].numel()])
    assert int(got[2][0]) == int(first[2][0])


@requires_two_gpus
def test_moe_align_second_gpu():
    with torch.cuda.device(1):
        ids = routed_ids(64, 8, 256).to("cuda:1")
    sorted_len = ids.numel() + 256 * 63
    bufs = [torch.empty(n, dtype=torch.int32, device="cuda:1") for n in (sorted_len, sorted_len // 64 + 1, 1, 257)]
    moe_align_block_size(ids, 256, 64, *bufs, True)
    expected = Outputs(ids.numel(), 256, 64).call(ids.to("cuda:0"), 256, 64, True).host()
    assert np.array_equal(bufs[0].cpu().numpy(), expected[0]) and int(bufs[2][0]) == int(expected[2][0])


@requires_cuda
def test_moe_align_check_indices(monkeypatch):
    monkeypatch.setenv("SGLANG_JIT_CHECK_INDICES", "1")
    ids = routed_ids(4, 8, 64)
    ids[:, 0] = -1  # skipped, allowed
    check(ids, 64, 16)
    ids[2, 3] = 64
    with pytest.raises(
        IndexError,
        match=r"^moe_align_block_size: topk_ids value: expected entries in \[0, 64\) "
        r"\(num_experts\) or -1 \(skipped\), got 64 at position \(2, 3\)$",
    ):
        check(ids, 64, 16)


# ---- errors (raised before any launch) ----
def test_moe_align_cpu_input():
    with pytest.raises(RuntimeError, match=r"^moe_align_block_size: topk_ids device: expected a CUDA device, got cpu$"):
        moe_align_block_size(
            torch.zeros(2, 2, dtype=torch.int32), 4, 16, torch.empty(0), torch.empty(0), torch.empty(0), torch.empty(0)
        )


@requires_cuda
def test_moe_align_bad_arguments():
    ids = routed_ids(4, 2, 8)
    out = Outputs(ids.numel(), 8, 16)
    sorted_ids, expert_ids, total, cumsum = out.views

    def call(*, topk_ids=ids, num_experts=8, block_size=16, s=sorted_ids, e=expert_ids, t=total, c=cumsum, pad=False):
        moe_align_block_size(topk_ids, num_experts, block_size, s, e, t, c, pad)

    def i32(n):
        return torch.empty(n, dtype=torch.int32, device="cuda")

    op = "^moe_align_block_size: "
    aliased = i32(128)  # an output whose first elements are the ids themselves
    cases = [
        (RuntimeError, op + r"topk_ids dtype: expected one of int32, int64, got float32$", dict(topk_ids=ids.float())),
        (TypeError, op + r"num_experts type: expected an int, got float$", dict(num_experts=8.0)),
        (TypeError, op + r"num_experts type: expected an int, got bool$", dict(num_experts=True)),
        (ValueError, op + r"num_experts value: expected >= 1 and <= 8192, got 0$", dict(num_experts=0)),
        (ValueError, op + r"num_experts value: expected >= 1 and <= 8192, got 8193$", dict(num_experts=8193)),
        (ValueError, op + r"block_size value: expected a power of two in \[1, 1024\], got 48$", dict(block_size=48)),
        (ValueError, op + r"block_size value: expected >= 1 and <= 1024, got 2048$", dict(block_size=2048)),
        (TypeError, op + r"pad_sorted_token_ids type: expected a bool, got int$", dict(pad=1)),
        (
            RuntimeError,
            op + r"sorted_token_ids size: expected at least 128 \(numel \+ min\(numel, num_experts\) \* "
            r"\(block_size - 1\), the worst case\), got 127$",
            dict(s=i32(127)),
        ),
        (
            RuntimeError,
            op + r"expert_ids size: expected at least 8 \(max_num_tokens_padded // block_size, the worst "
            r"case\), got 7$",
            dict(e=i32(7)),
        ),
        (RuntimeError, op + r"cumsum_buffer size: expected at least 9 \(num_experts \+ 1\), got 8$", dict(c=i32(8))),
        (RuntimeError, op + r"num_tokens_post_pad shape: expected \(1,\), got \(2,\)$", dict(t=i32(2))),
        (RuntimeError, op + r"sorted_token_ids dtype: expected int32, got int64$", dict(s=sorted_ids.long())),
        (RuntimeError, op + r"expert_ids layout: expected contiguous", dict(e=i32(20)[::2])),
        (
            RuntimeError,
            op + r"cumsum_buffer shape: expected \[num_experts_plus_1\], got \(3, 3\)$",
            dict(c=i32(9).view(3, 3)),
        ),
        (
            RuntimeError,
            op + r"num_tokens_post_pad device: expected a CUDA device, got cpu$",
            dict(t=torch.empty(1, dtype=torch.int32)),
        ),
        (
            RuntimeError,
            op + r"expert_ids overlaps sorted_token_ids: expected disjoint memory",
            dict(e=sorted_ids[:8]),
        ),
        (
            RuntimeError,
            op + r"sorted_token_ids overlaps topk_ids: expected disjoint memory",
            dict(s=aliased, topk_ids=aliased[:8].view(4, 2)),
        ),
    ]
    for error, pattern, kwargs in cases:
        with pytest.raises(error, match=pattern):
            call(**kwargs)
    assert (out.host()[0] == POISON).all(), "a refused call writes nothing"


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))


@requires_cuda
@pytest.mark.parametrize(
    "num_tokens,topk,num_experts,block_size",
    [
        (1, 8, 257, 64),
        (64, 8, 257, 64),
        (4096, 8, 257, 64),
        (129, 6, 64, 16),
        (1000, 1, 160, 256),
        (3000, 64, 1024, 128),  # 192k ids: 64 CTAs of 3072 (several steps per warp)
        (140000, 8, 257, 32),  # 1.12M ids: 544 ids per warp, two register tiles
        (7, 8, 4096, 32),  # > 1024 experts: the default kernel runs
    ],
)
@pytest.mark.parametrize("pad", [True, False])
def test_moe_align_kernel_sizes(num_tokens, topk, num_experts, block_size, pad):
    """Both sides of the kernel choice (below 4096 ids the one-launch kernel, from there the count +
    multi-CTA scatter, past 1024 experts one CTA), with skipped ids in several CTAs' chunks: every
    output (padding and untouched slots included) against the reference."""
    ids = routed_ids(num_tokens, topk, 256 if num_experts == 257 else num_experts)
    if num_tokens >= 64:
        ids.view(-1)[::97] = -1
    check(ids, num_experts, block_size, pad)


# ---- decode sizes (below 4096 ids: one launch of up to 8 CTAs with PDL, stores split over them) ----
def check_sized(topk_ids, num_experts, block_size, pad=True, out_len=None):
    """check() with sorted_token_ids of ``out_len`` slots (default: sglang's sizing)."""
    out = Outputs(topk_ids.numel(), num_experts, block_size, sorted_len=out_len)
    return check(topk_ids, num_experts, block_size, pad, out=out)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("pad", [False, True])
def test_moe_align_decode_dtypes_skips_and_padding(dtype, pad):
    """Both id dtypes, with and without the padding fill, with skipped ids (-1, num_experts, values
    that wrap) and with nothing routed (total 0)."""
    ids = routed_ids(129, 8, 64, dtype)
    check_sized(ids, 64, 64, pad)
    flat = ids.view(-1)
    flat[::5] = -1
    flat[1::7] = 64
    flat[2::11] = -(2**31) if dtype == torch.int32 else 2**32 + 3
    check_sized(ids, 64, 16, pad)
    check_sized(torch.full((7, 8), -1, dtype=dtype, device="cuda"), 64, 16, pad)


@requires_cuda
@pytest.mark.parametrize("num_experts", [1, 3, 257, 1024, 1025, 8192])
@pytest.mark.parametrize("block_size", [1, 16, 256, 1024])
@pytest.mark.parametrize("num_tokens", [1, 64, 384, 4096])
def test_moe_align_decode_experts_blocks_sizes(num_experts, block_size, num_tokens):
    """Few and many experts (1024: the opt-in shared memory; > 1024: the one-CTA kernel runs), any
    block, 1 to 16 sorting warps, one to several register tiles per warp."""
    topk = min(8, num_experts)
    ids = routed_ids(num_tokens, topk, num_experts, seed=num_experts + num_tokens)
    check_sized(ids, num_experts, block_size)


@requires_cuda
@pytest.mark.parametrize("num_experts", [1, 64, 257])
def test_moe_align_decode_skewed_and_tight(num_experts):
    """Every id to one expert, a 90 % hot expert (many equal ids per warp step), buffers of exactly
    the worst case (no slot past it: the early tail fill is empty) and a strided view."""
    check_sized(torch.full((64, 8), num_experts - 1, dtype=torch.int32, device="cuda"), num_experts, 64)
    ids = routed_ids(384, 1, num_experts)
    ids[torch.rand(ids.shape, device="cuda") < 0.9] = 0
    check_sized(ids, num_experts, 16)
    wide = routed_ids(129, 11, 256)
    view = wide[:, 2:10]
    check_sized(view, 257, 64, out_len=max_num_tokens_padded(view.numel(), 257, 64))


@requires_cuda
def test_moe_align_decode_graph_after_producer():
    """In a CUDA graph, behind the kernel that writes its ids (PDL: the ids are read only after the
    wait) and twice back to back into the same buffers (the second call's stores come after the
    first's): every replay equals the default on fresh ids."""
    num_experts, block_size = 257, 64
    source = routed_ids(64, 8, 256)
    static_ids = torch.zeros_like(source)
    out = Outputs(source.numel(), num_experts, block_size)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_ids.copy_(source.flip(0))
        out.call(static_ids, num_experts, block_size, True)
        static_ids.copy_(source)  # the producer of the second call
        out.call(static_ids, num_experts, block_size, True)
    for seed in (1, 2, 3):
        source.copy_(routed_ids(64, 8, 256, seed=seed))
        out.views[1].fill_(POISON)  # blocks past this replay's total keep what was there
        graph.replay()
        torch.cuda.synchronize()
        expected = Outputs(source.numel(), num_experts, block_size).call(source, num_experts, block_size, True)
        assert all(np.array_equal(a, b) for a, b in zip(out.host(), expected.host()))
