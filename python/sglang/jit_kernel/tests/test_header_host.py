"""Host-side header checks that need a C++ compiler but no GPU: TensorMatcher messages and the
aliasing checks of include/sgl_kernel/tensor.h, called with CPU tensors through a g++-built module."""

from pathlib import Path

import pytest
import torch

from sglang.jit_kernel.testing import requires_nvcc
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=40, suite="stage-a-kernel-cpu")

PROBE = Path(__file__).resolve().parent / "header_smoke" / "host_probe.h"

# verify_no_partial_overlap's messages: `<arg> <what>: expected X, got Y` with both byte spans.
PARTIAL = (
    r"^a overlaps b: expected disjoint memory( or the same tensor)?, got a partial overlap "
    r"\(a \[0x[0-9a-f]+, 0x[0-9a-f]+\), b \[0x"
)
SAME = r"^a overlaps b: expected disjoint memory, got the same tensor \(a \[0x[0-9a-f]+, 0x[0-9a-f]+\), b \[0x"


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    from sglang.jit_kernel.utils import load_jit

    names = ["probe_partial_overlap", "probe_partial_overlap_dl", "probe_self_overlap", "probe_match_rows"]
    return load_jit(
        "header_host_probe",
        cpp_files=[str(PROBE)],
        cpp_wrappers=[(n, n) for n in names],
        build_directory=str(tmp_path_factory.mktemp("jit")),
    )


@requires_nvcc
def test_partial_overlap(probe):
    x = torch.zeros(100, dtype=torch.bfloat16)
    probe.probe_partial_overlap(x, x, True)  # in place: the same view
    probe.probe_partial_overlap(x[:50], x[50:], False)  # adjacent halves: disjoint
    probe.probe_partial_overlap(x[:0], x, False)  # empty overlaps nothing
    with pytest.raises(RuntimeError, match=PARTIAL):
        probe.probe_partial_overlap(x[1:], x[:-1], True)
    with pytest.raises(RuntimeError, match=SAME):
        probe.probe_partial_overlap(x, x, False)
    rows = torch.zeros(8, 16, dtype=torch.float32)
    with pytest.raises(RuntimeError, match=PARTIAL):
        probe.probe_partial_overlap(rows[1:], rows[:-1], True)


@requires_nvcc
def test_interleaved_views_are_not_overlap(probe):
    """q and k as views of one fused qkv buffer interleave but share no element."""
    qkv = torch.zeros(4, 48, 128, dtype=torch.bfloat16)
    q, k = qkv[:, :32], qkv[:, 32:40]
    probe.probe_partial_overlap(k, q, False)
    with pytest.raises(RuntimeError, match="the same tensor"):
        probe.probe_partial_overlap(q, q, False)


def _overlap_layouts():
    """(name, a, b, allow_same): pairs of views of one buffer, interleaved, partial, disjoint or the
    same view under other strides of size-1 dims."""
    kv = torch.zeros(6, 2, 64, dtype=torch.bfloat16)  # k and v halves of each slot
    packed = torch.zeros(5, 64 + 8, dtype=torch.uint8)  # q bytes then 8 scale bytes per row
    act = torch.zeros(4, 3 * 32, dtype=torch.bfloat16)  # gate | up | out in each row
    flat = torch.zeros(100, dtype=torch.bfloat16)
    row = torch.zeros(4, 32, dtype=torch.bfloat16)[2:3]
    return [
        ("interleaved halves", kv[:, 1], kv[:, 0], False),
        ("packed q and scales", packed[:, 64:], packed[:, :64], False),
        ("out beside input", act[:, 64:], act[:, :64], False),
        ("same view, size-1 dim strided", torch.as_strided(row, (1, 32), (7, 1)), row, True),
        ("same view, refused", row, row, False),
        ("shifted", flat[1:], flat[:-1], True),
        ("disjoint", flat[:50], flat[50:], False),
        ("interleaved on one element", kv[:, 0, 1:], kv[:, 0, :-1], False),
    ]


@requires_nvcc
@pytest.mark.parametrize("index", range(8))
def test_python_overlap_check_refuses_only_what_the_launcher_refuses(probe, index):
    """The wrappers' checked path (check_no_partial_overlap with dense_only) and the launchers'
    verify_no_partial_overlap: whatever the launcher accepts, the checked path accepts too (a call
    must not fail on its first use, which takes the checked path, and pass later on the fast path);
    where the checked path refuses, the launcher refuses too."""
    from sglang.jit_kernel._validate import check_no_partial_overlap

    name, a, b, allow_same = _overlap_layouts()[index]
    try:
        probe.probe_partial_overlap(a, b, allow_same)
        launcher_ok = True
    except RuntimeError:
        launcher_ok = False
    try:
        check_no_partial_overlap("op", "a", a, b, "b", allow_same=allow_same, dense_only=True)
        python_ok = True
    except RuntimeError:
        python_ok = False
    assert python_ok or not launcher_ok, f"{name}: refused by the checked path, taken by the launcher"


def fused_qkv(num_tokens, num_q_heads, num_kv_heads, head_dim, pad=0, offset=0):
    """q [T, Hq, D] and k [T, Hk, D] as views of one fused bf16 [T, (Hq + 2 Hk) * D + pad] buffer
    at element ``offset``, plus the buffer."""
    width = (num_q_heads + 2 * num_kv_heads) * head_dim + pad
    qkv = torch.zeros(num_tokens * width + offset, dtype=torch.bfloat16)[offset:].view(num_tokens, width)
    q = qkv[:, : num_q_heads * head_dim].view(num_tokens, num_q_heads, head_dim)
    k = qkv[:, num_q_heads * head_dim : (num_q_heads + num_kv_heads) * head_dim]
    k = k.view(num_tokens, num_kv_heads, head_dim)
    return q, k, qkv


@requires_nvcc
@pytest.mark.parametrize("num_tokens", [1, 7])
@pytest.mark.parametrize("num_q_heads,num_kv_heads", [(32, 8), (1, 1), (5, 3)])
@pytest.mark.parametrize("head_dim", [1, 64])
@pytest.mark.parametrize("pad,offset", [(0, 0), (3, 5)])
def test_fused_qkv_views_disjoint_and_shifted_k_found(
    probe, num_tokens, num_q_heads, num_kv_heads, head_dim, pad, offset
):
    """q and k of one fused qkv buffer (any token stride, storage offset) share no element: accepted
    in both orders; k moved one head back into q is found, for one token as for many."""
    q, k, qkv = fused_qkv(num_tokens, num_q_heads, num_kv_heads, head_dim, pad, offset)
    probe.probe_partial_overlap(k, q, False)
    probe.probe_partial_overlap(q, k, False)
    start = (num_q_heads - 1) * head_dim
    shifted = qkv[:, start : start + num_kv_heads * head_dim].view(num_tokens, num_kv_heads, head_dim)
    # with one q head and one k head the shifted k is q itself
    with pytest.raises(
        RuntimeError, match=r"^a overlaps b: expected disjoint memory, got (a partial overlap|the same tensor) \("
    ):
        probe.probe_partial_overlap(shifted, q, False)


@requires_nvcc
@pytest.mark.parametrize("num_tokens,max_tokens", [(1, 1), (9, 9), (5, 8)])
def test_head_major_views_disjoint_and_shifted_k_found(probe, num_tokens, max_tokens):
    """Head-major q, k = buf[heads, :T].transpose(0, 1) (token stride D, head stride max_tokens * D)
    are accepted; k starting one head inside q is found."""
    buf = torch.zeros(8 + 2 * 2, max_tokens, 64, dtype=torch.bfloat16)
    q = buf[:8, :num_tokens].transpose(0, 1)
    k = buf[8:10, :num_tokens].transpose(0, 1)
    probe.probe_partial_overlap(k, q, False)
    probe.probe_partial_overlap(q, k, False)
    with pytest.raises(RuntimeError, match=PARTIAL):
        probe.probe_partial_overlap(buf[7:9, :num_tokens].transpose(0, 1), q, False)


@requires_nvcc
@pytest.mark.parametrize("num_tokens", [1, 5])
def test_head_shared_by_strided_views_found(probe, num_tokens):
    """k = b[:, 3:5] with q = b[:, 0:4] (k's head 0 is q's head 3): once accepted because their first
    elements differ, now found; b[:, 4:6] is disjoint from q."""
    b = torch.zeros(num_tokens, 6, 128, dtype=torch.float32)
    with pytest.raises(RuntimeError, match=PARTIAL):
        probe.probe_partial_overlap(b[:, 3:5], b[:, 0:4], False)
    probe.probe_partial_overlap(b[:, 4:6], b[:, 0:4], False)


@requires_nvcc
def test_single_rows(probe):
    """Views with one row: two pieces of one row, single elements, and one token's row against
    the rows of a strided view (it fits inside one of them)."""
    x = torch.zeros(4, 64, dtype=torch.bfloat16)
    probe.probe_partial_overlap(x[0, 0:16], x[0, 16:32], False)
    with pytest.raises(RuntimeError, match=PARTIAL):
        probe.probe_partial_overlap(x[0, 0:16], x[0, 8:24], False)
    with pytest.raises(RuntimeError, match=PARTIAL):
        probe.probe_partial_overlap(x[0, 3], x[0, 3:4], False)
    probe.probe_partial_overlap(x[0, 3], x[0, 4], False)
    q, k, qkv = fused_qkv(6, 4, 2, 32)
    probe.probe_partial_overlap(qkv[2, : 4 * 32], k, False)
    with pytest.raises(RuntimeError, match=PARTIAL):
        probe.probe_partial_overlap(qkv[2, : 5 * 32], k, False)


@requires_nvcc
def test_undecidable_layouts_rejected(probe):
    """Views sharing one buffer in a layout the exact check does not cover are refused, even when
    disjoint: different row strides, dims that interleave."""
    buf = torch.zeros(256, dtype=torch.bfloat16)
    a = buf.as_strided((4, 8), (32, 1))  # [0, 8), [32, 40), [64, 72), [96, 104)
    b = buf.as_strided((3, 8), (40, 1), 12)  # [12, 20), [52, 60), [92, 100): disjoint from a
    with pytest.raises(
        RuntimeError,
        match=r"^a overlaps b: expected disjoint memory \(or views of one buffer with the same largest stride, the "
        r"token stride\), got byte ranges that share memory in a layout whose disjointness cannot be verified "
        r"\(their row strides differ; a \[0x[0-9a-f]+, 0x[0-9a-f]+\), b \[0x",
    ):
        probe.probe_partial_overlap(a, b, False)
    interleaved = buf.as_strided((3, 2), (2, 3))  # elements 0, 3, 2, 5, 4, 7
    with pytest.raises(RuntimeError, match=r"cannot be verified \(a has dims that interleave; a \[0x"):
        probe.probe_partial_overlap(interleaved, buf[1:2], True)


@requires_nvcc
def test_negative_strides_hand_built(probe):
    """Hand-built DLTensors with flipped dims (negative strides) cover the same elements as the
    unflipped view: columns 0..3 of 4 rows of 8 against columns 4..7, then 2..5."""
    rows_flipped = ([4, 4], [-8, 1], 24)  # rows 3, 2, 1, 0
    cols_flipped = ([4, 4], [8, -1], 3)  # columns 3, 2, 1, 0
    right = ([4, 4], [8, 1], 4)
    middle = ([4, 4], [8, 1], 2)
    for left in (rows_flipped, cols_flipped):
        probe.probe_partial_overlap_dl(*left, *right, False)
        with pytest.raises(RuntimeError, match=PARTIAL):
            probe.probe_partial_overlap_dl(*left, *middle, False)
    probe.probe_partial_overlap_dl(*right, *right, True)


@requires_nvcc
def test_self_overlap(probe):
    probe.probe_self_overlap(torch.zeros(4, 8))
    probe.probe_self_overlap(torch.zeros(1, 8).expand(1, 8))  # size-1 dim: no aliasing
    with pytest.raises(
        RuntimeError,
        match=r"^t strides: expected no dim of size > 1 with stride 0 \(elements at addresses of their own\), got dim 0 of size 4 with stride 0 \(an expanded tensor\)",
    ):
        probe.probe_self_overlap(torch.zeros(1, 8).expand(4, 8))


@requires_nvcc
def test_self_overlap_of_strided_dims(probe):
    """Fused-qkv, head-major, column-strided and transposed views are accepted; heads closer than
    head_dim, or two dims of one stride, are found."""
    q, _, _ = fused_qkv(7, 4, 2, 128, pad=3)
    probe.probe_self_overlap(q)
    probe.probe_self_overlap(torch.zeros(6, 7, 128)[:4].transpose(0, 1))
    probe.probe_self_overlap(torch.zeros(4, 16)[:, ::2])
    probe.probe_self_overlap(torch.zeros(5, 3).t())
    probe.probe_self_overlap(torch.zeros(0, 4).as_strided((0, 4), (1, 1)))  # empty: nothing to share
    overlapping = torch.zeros(7 * 4 * 128).as_strided((7, 4, 128), (4 * 128, 64, 1))
    with pytest.raises(
        RuntimeError,
        match=r"^t strides: expected elements at addresses of their own \(each stride >= the extent of the dims with smaller strides\), got dim 1 stride 64 < extent 128 of the dims",
    ):
        probe.probe_self_overlap(overlapping)
    with pytest.raises(RuntimeError, match=r"dim 1 stride 4 < extent 13"):
        probe.probe_self_overlap(torch.zeros(25).as_strided((4, 4), (4, 4)))


@requires_nvcc
def test_tensor_matcher_messages(probe):
    x, w = torch.zeros(3, 5), torch.zeros(5)
    assert probe.probe_match_rows(x, w) == 15
    with pytest.raises(RuntimeError, match=r"w: dim 0 \(hidden_size\) expected 5, got 4 .*\[at .*host_probe.h:\d+\]"):
        probe.probe_match_rows(x, torch.zeros(4))
    with pytest.raises(RuntimeError, match=r"x: dtype expected .*float32.*, got float64"):
        probe.probe_match_rows(x.double(), w)
    with pytest.raises(RuntimeError, match=r"x: ndim expected 2, got 1"):
        probe.probe_match_rows(w, w)
    with pytest.raises(RuntimeError, match=r"x: expected contiguous strides"):
        probe.probe_match_rows(torch.zeros(5, 3).t(), w)


@requires_nvcc
def test_header_smoke_and_tutorial_kernel_compile_for_sm90(tmp_path, monkeypatch):
    """Every header and template (fp16/bf16/fp32), plus the tutorial's Step 1 scale.cuh verbatim,
    compile for sm_90 through load_jit, and the module loads where it can (no GPU needed)."""
    from sglang.jit_kernel.utils import load_jit

    monkeypatch.setenv("SGLANG_JIT_CUDA_ARCH", "9.0")
    smoke = Path(__file__).resolve().parent / "header_smoke" / "smoke.cu"
    module = load_jit("header_smoke", cuda_files=[str(smoke)], build_directory=str(tmp_path / "jit"))
    assert module is not None


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))
