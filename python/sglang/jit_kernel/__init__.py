"""SGLang's JIT kernel system: lightweight CUDA kernels compiled on first use, called through TVM-FFI.

Ops live in their own modules (``sglang.jit_kernel.scale``, ``.add_constant``, ``.norm``); the
JIT layer is ``sglang.jit_kernel.utils`` (``load_jit``, ``cache_once``, ``make_cpp_args``).
"""

__version__ = "0.1.0"
