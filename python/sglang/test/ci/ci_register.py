"""``sglang.test.ci.ci_register`` for installs without the ``sglang`` distribution.

The tutorial's tests and benchmarks import ``register_cuda_ci`` from here, SGLang's
path. When sglang is installed its own module answers that import and this file is
never found; without sglang this one re-exports the registry of
:mod:`sglang.jit_kernel.ci_register`: ``register_cuda_ci`` and the other ``register_*_ci``
functions, the suites, and the AST registration rules (module-level calls with literal
``est_time`` and ``suite``), which that module documents (its docstring and
``collect_registrations``). The wheel ships it outside ``sglang/`` (under
``sglang_jit_kernel_compat/``, a ``sys.path`` entry that ``sglang_jit_kernel_compat.pth``
appends after site-packages), so it never takes the path of sglang's file.
"""

from sglang.jit_kernel.ci_register import *  # noqa: F403
from sglang.jit_kernel.ci_register import __all__  # noqa: F401
