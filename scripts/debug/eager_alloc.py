"""Where the eager rmsnorm call's host time goes (device): FFI call cost, torch.empty_like, and
allocating the output in C++ through TVM-FFI's environment allocator (torch's DLPack allocator)."""
import torch
import tvm_ffi
import tvm_ffi.cpp

import sglang.jit_kernel.norm as N
from sglang.jit_kernel.benchmark.utils import eager_wall_us

print("torch", torch.__version__, "tvm_ffi", tvm_ffi.__version__, "exchange api:",
      hasattr(torch.Tensor, "__dlpack_c_exchange_api__"), flush=True)
src = r'''
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
tvm::ffi::Tensor alloc_like(tvm::ffi::TensorView x) {
  return tvm::ffi::Tensor::FromEnvAlloc(TVMFFIEnvTensorAlloc, x.shape(), x.dtype(), x.device());
}
void noop2(tvm::ffi::TensorView o, tvm::ffi::TensorView x) {}
void noop7(tvm::ffi::TensorView o, tvm::ffi::TensorView x, tvm::ffi::TensorView w, double eps, double off, bool c, int64_t p) {}
'''
m = tvm_ffi.cpp.load_inline("ea", cpp_sources=src, functions=["alloc_like", "noop2", "noop7"])
x = torch.randn(1, 4096, dtype=torch.bfloat16, device="cuda")
w = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
o = torch.empty_like(x)
y = m.alloc_like(x)
print(type(y), y.shape, y.dtype, y.device, flush=True)
CALLS = 10000
cases = [
    ("empty_like", lambda: torch.empty_like(x)),
    ("torch.empty(shape)", lambda: torch.empty((1, 4096), dtype=torch.bfloat16, device=x.device)),
    ("ffi alloc_like", lambda: m.alloc_like(x)),
    ("ffi noop2", lambda: m.noop2(o, x)),
    ("ffi noop7", lambda: m.noop7(o, x, w, 1e-6, 0.0, False, -1)),
    ("rmsnorm out=", lambda: N.rmsnorm(x, w, out=o)),
    ("rmsnorm alloc", lambda: N.rmsnorm(x, w)),
    ("module rmsnorm direct", lambda: N._RMSNORM_FNS[torch.bfloat16](o, x, w, 1e-6, 0.0, False, -1)),
    ("F.rms_norm", lambda: torch.nn.functional.rms_norm(x, (4096,), w, 1e-6)),
]
for rep in range(2):
    for name, f in cases:
        print(f"rep{rep} {name:<24} {eager_wall_us(f, calls=CALLS, warmup=300):7.2f} us", flush=True)
