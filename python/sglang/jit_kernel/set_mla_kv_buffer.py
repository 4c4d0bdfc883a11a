"""set_mla_kv_buffer: the MLA KV-cache write, at the original package's module path
``sglang.jit_kernel.set_mla_kv_buffer``.

The op is :func:`sglang.jit_kernel.kvcache.set_mla_kv_buffer` (also exported there, beside the other
KV-cache writes); this module re-exports it, with its support query
:func:`~sglang.jit_kernel.kvcache.can_use_set_mla_kv_buffer`, and registers it for ``build`` and
``check``.
"""

from __future__ import annotations

from sglang.jit_kernel.kvcache import (
    _jit_set_mla_kv_buffer_module,
    _set_mla_kv_buffer_cases,
    can_use_set_mla_kv_buffer,
    set_mla_kv_buffer,
)
from sglang.jit_kernel.registry import register_op

__all__ = ["can_use_set_mla_kv_buffer", "set_mla_kv_buffer"]

register_op(
    "set_mla_kv_buffer", build=_jit_set_mla_kv_buffer_module, variants=[()], check_cases=_set_mla_kv_buffer_cases
)
