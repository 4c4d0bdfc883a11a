"""fp64 torch references of the MoE routing ops, written from the ops' definitions (not from the
kernels), and the comparison their tests share. Imported by tests/test_moe_*.py."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

# Key agreement between a kernel's fp32 scores and the fp64 reference: a few fp32 ulps of the
# largest key, plus the error of a softmax denominator summed over <= 4096 terms.
KEY_RTOL, KEY_ATOL = 2e-5, 2e-7
# Weights: fp32 exp / sigmoid / division against fp64, relative.
WEIGHT_RTOL, WEIGHT_ATOL = 2e-5, 1e-8


def grid_logits(num_tokens: int, num_experts: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Logits k / 64 for integer k in [-256, 256): exact in every float dtype, distinct values at least
    1/64 apart (probabilities > 1.5 % apart, so the choice is unambiguous in fp32), equal values
    frequent (ties exercised)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    k = torch.randint(-256, 256, (num_tokens, num_experts), generator=g)
    return (k.double() / 64).to(dtype).cuda()


def edge_rows(num_tokens: int, num_experts: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """randn logits [num_tokens >= 8, num_experts] whose first 8 rows are the cases where a different
    order of the same fp32 operations shows: NaN logits, a row of only NaN (read as -inf), +inf and
    -inf logits, a row of equal logits (all ties), +0 / -0 ties, a spread whose exp(x - max) runs
    down through the subnormals to 0, a row of only -inf and logits of magnitude ~1e4 (inf in fp16)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(num_tokens, num_experts, generator=g)
    x[0, ::3] = float("nan")
    x[1] = float("nan")
    x[2, 1 % num_experts] = float("inf")
    x[2, 5 % num_experts] = float("-inf")
    x[3] = 0.5
    x[4, ::2] = -0.0
    x[4, 1::2] = 0.0
    x[5] = torch.linspace(-120.0, 0.0, num_experts)
    x[6] = float("-inf")
    x[7] = x[7] * 1e4
    return x.to(dtype).cuda()


def assert_same_bits(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Two (weights, ids) results agree bit for bit: the same ids, NaN weights at the same places and
    the same fp32 bits everywhere else (-0 and +0 differ)."""
    assert torch.equal(a[1], b[1]), "ids differ"
    nan = torch.isnan(a[0])
    assert torch.equal(nan, torch.isnan(b[0])), "NaN weights at different places"
    bits_a = a[0].masked_fill(nan, 0.0).contiguous().view(torch.int32)
    bits_b = b[0].masked_fill(nan, 0.0).contiguous().view(torch.int32)
    assert torch.equal(bits_a, bits_b), f"weights differ in {int((bits_a != bits_b).sum())} places"


def select_topk(keys: torch.Tensor, k: int) -> torch.Tensor:
    """Indices [T, k] of the k largest keys per row in decreasing order, ties to the lower index, NaN
    below every number (NaNs among themselves by index)."""
    nan = torch.isnan(keys)
    order = torch.sort(torch.where(nan, float("-inf"), keys), dim=-1, descending=True, stable=True).indices
    order = torch.gather(
        order, -1, torch.sort(torch.gather(nan, -1, order).to(torch.int8), dim=-1, stable=True).indices
    )
    return order[:, :k]


def read_logits(gating: torch.Tensor) -> torch.Tensor:
    """The ops' reading of the logits: fp64, NaN as -inf."""
    x = gating.double()
    return torch.where(torch.isnan(x), float("-inf"), x)


def softmax_reference(gating, k, renormalize=False, softcap=0.0, bias=None):
    """(keys, weights_at_ids, ids) of topk_softmax in fp64: keys = probabilities [T, E]."""
    x = read_logits(gating)
    if softcap > 0:
        x = softcap * torch.tanh(x / softcap)
    if bias is not None:
        x = x + bias.double()
    p = torch.softmax(x, dim=-1)
    ids = select_topk(p, k)
    return p, p, ids


def sigmoid_reference(gating, k, renormalize=False, bias=None):
    """(keys, weights_all, ids) of topk_sigmoid in fp64: weights_all = sigmoid [T, E], keys = it + bias."""
    p = torch.sigmoid(read_logits(gating))
    keys = p + bias.double() if bias is not None else p
    return keys, p, select_topk(keys, k)


def finish_weights(weights_all: torch.Tensor, ids: torch.Tensor, renormalize: bool, eps: float, scale: float = 1.0):
    """The written weights for the chosen ids: gathered, divided by (sum + eps) with renormalize, scaled."""
    w = torch.gather(weights_all, -1, ids.long())
    if renormalize:
        w = w / (w.sum(dim=-1, keepdim=True) + eps)
    return w * scale


def assert_routing_matches(
    weights, ids, keys, weights_all, ref_ids, renormalize, eps, scale=1.0, max_near_tie_rows=None
):
    """The kernel's (weights, ids) against the reference.

    Rows where the ids differ from the reference's must be near ties: the kernel's i-th choice has
    a reference key within tolerance of the i-th largest key (an fp32 rounding may order two keys
    that differ in the last bits either way). Weights are compared at the kernel's ids.
    """
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    ids64 = ids.long().cpu()
    keys, weights_all, ref_ids = keys.cpu(), weights_all.cpu(), ref_ids.cpu()
    num_experts = keys.shape[1]
    assert bool(((ids64 >= 0) & (ids64 < num_experts)).all()), "an id outside [0, num_experts)"
    differ = (ids64 != ref_ids).any(dim=-1)
    if bool(differ.any()):
        rows = differ.nonzero()[:, 0]
        picked = torch.gather(keys[rows], -1, ids64[rows])
        best = torch.gather(keys[rows], -1, ref_ids[rows])
        torch.testing.assert_close(
            picked,
            best,
            rtol=KEY_RTOL,
            atol=KEY_ATOL,
            equal_nan=True,
            msg=lambda m: f"ids differ beyond a near tie in rows {rows.tolist()[:8]}: {m}",
        )
        sorted_ids = ids64[rows].sort(dim=-1).values
        assert bool((sorted_ids[:, 1:] != sorted_ids[:, :-1]).all()), "an expert chosen twice"
        limit = max_near_tie_rows if max_near_tie_rows is not None else max(2, keys.shape[0] // 50)
        assert rows.numel() <= limit, f"{rows.numel()} rows differ from the reference (near ties?)"
    expected = finish_weights(weights_all, ids64, renormalize, eps, scale)
    torch.testing.assert_close(weights.double().cpu(), expected, rtol=WEIGHT_RTOL, atol=WEIGHT_ATOL, equal_nan=True)


def _grouped_scores(scores, bias, num_groups):
    """(p, s, group_scores) in fp64: sigmoids, biased scores (NaN as -inf), group top-2 sums."""
    p = torch.sigmoid(read_logits(scores))
    s = p + bias.double() if bias is not None else p
    s = torch.where(torch.isnan(s), float("-inf"), s)
    t, e = s.shape
    g = e // num_groups
    group_scores = s.view(t, num_groups, g).topk(min(2, g), dim=-1).values.sum(dim=-1)
    return p, s, group_scores


def grouped_reference(scores, bias, num_groups, topk_group, topk):
    """(keys, weights_all, ids, ambiguous) of grouped_topk in fp64: keys = sigmoid + bias with the
    experts of dropped groups at -inf; ``ambiguous`` marks rows whose kept groups are a near tie
    (the topk_group-th and next group scores within tolerance), where fp32 may keep either."""
    p, s, group_scores = _grouped_scores(scores, bias, num_groups)
    t, e = s.shape
    g = e // num_groups
    kept = select_topk(group_scores, topk_group)
    ordered = torch.sort(group_scores, dim=-1, descending=True).values
    if topk_group < num_groups:
        gap = ordered[:, topk_group - 1] - ordered[:, topk_group]
        ambiguous = (gap.abs() <= KEY_ATOL + KEY_RTOL * ordered[:, topk_group - 1].abs()) & (gap != 0)
    else:
        ambiguous = torch.zeros(t, dtype=torch.bool, device=s.device)
    mask = torch.zeros(t, num_groups, dtype=torch.bool, device=s.device).scatter_(1, kept, True)
    keys = torch.where(mask.repeat_interleave(g, dim=1), s, float("-inf"))
    return keys, p, select_topk(keys, topk), ambiguous


def resolve_grouped_ambiguity(scores, bias, num_groups, topk_group, topk, ids, keys, ref_ids, ambiguous):
    """(keys, ref_ids) with every ``ambiguous`` row re-derived from the kept-group set the kernel's
    ``ids`` agree with: the groups clearly above the topk_group-th group score, plus any choice
    among the groups within tolerance of it (each a valid fp32 outcome). A row no such set explains
    keeps the plain reference (and so fails assert_routing_matches unless it is a near tie)."""
    keys, ref_ids = keys.clone().cpu(), ref_ids.clone().cpu()
    _, s, group_scores = _grouped_scores(scores.cpu(), bias.cpu() if bias is not None else None, num_groups)
    g = s.shape[1] // num_groups
    ids64 = ids.long().cpu()
    for r in ambiguous.cpu().nonzero()[:, 0].tolist():
        row = group_scores[r]
        boundary = row.sort(descending=True).values[topk_group - 1]
        tol = KEY_ATOL + KEY_RTOL * boundary.abs()
        certain = (row > boundary + tol).nonzero()[:, 0].tolist()
        near = ((row - boundary).abs() <= tol).nonzero()[:, 0].tolist()
        best = None
        for combo in itertools.combinations(near, topk_group - len(certain)):
            mask = torch.zeros(num_groups, dtype=torch.bool)
            mask[certain + list(combo)] = True
            row_keys = torch.where(mask.repeat_interleave(g), s[r], float("-inf"))
            row_ids = select_topk(row_keys[None], topk)[0]
            overlap = len(set(row_ids.tolist()) & set(ids64[r].tolist()))
            if best is None or overlap > best[0]:
                best = (overlap, row_keys, row_ids)
        if best is not None:
            keys[r], ref_ids[r] = best[1], best[2]
    return keys, ref_ids


def assert_batch_invariant(run: Callable, rows: torch.Tensor, batch: int, **kwargs) -> None:
    """``run(gating, **kwargs) -> (weights, ids)`` gives every row of ``rows`` the same bits alone
    (a few rows: the lookahead kernels) as inside a batch of ``batch`` rows (the shape's large-batch
    kernel: the sorted kernels from 2048 rows, the several-rows kernel for fp32 rows of 128 experts
    from 4096), the rows of ``rows`` at its start and end."""
    n = rows.shape[0]
    filler = torch.randn(batch - 2 * n, rows.shape[1], device=rows.device).to(rows.dtype)
    big = run(torch.cat([rows, filler, rows]), **kwargs)
    small = run(rows, **kwargs)
    assert_same_bits(small, (big[0][:n], big[1][:n]))
    assert_same_bits(small, (big[0][-n:], big[1][-n:]))
