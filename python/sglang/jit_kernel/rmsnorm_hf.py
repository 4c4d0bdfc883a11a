"""rmsnorm_hf: RMSNorm in Hugging Face's order (normalise, round to the dtype, then multiply by the
weight), at the original package's module path ``sglang.jit_kernel.rmsnorm_hf``.

The op is :func:`sglang.jit_kernel.norm.rmsnorm_hf` (also exported there): rmsnorm's kernels with the
multiply order as a runtime parameter, so it shares rmsnorm's module (no build of its own). This
module registers it for ``build`` and ``check``.
"""

from __future__ import annotations

import torch

from sglang.jit_kernel.norm import RMSNORM_MODULE, _rows_case, is_supported_rmsnorm_hf_hidden_size, rmsnorm, rmsnorm_hf
from sglang.jit_kernel.registry import CheckCase, register_op

__all__ = ["rmsnorm_hf", "is_supported_rmsnorm_hf_hidden_size"]


def _check_cases() -> list[CheckCase]:
    # Two stages. Rounding x * rstd flips on near-ties wherever rstd differs from torch's in its last
    # bits (another summation order, rsqrtf): some thousand elements of 2^26 here, two ulps off after
    # the weight multiply, past check's one-ulp tolerance (test_norm.py's HF test nudges rstd
    # instead). So the reference takes x * rstd, rounded, from rmsnorm with a unit weight (checked
    # against fp32 by its own rows; the same launch geometry and reduction, hence the same rstd) and
    # multiplies by w in fp32 here.
    def reference(x: torch.Tensor, w: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        return (rmsnorm(x, torch.ones_like(w), 1e-6).float() * w.float()).to(x.dtype)

    return [_rows_case(16384, 4096, lambda x, w, o: rmsnorm_hf(x, w, 1e-6, out=o), reference)]


register_op("rmsnorm_hf", module=RMSNORM_MODULE, check_cases=_check_cases)
