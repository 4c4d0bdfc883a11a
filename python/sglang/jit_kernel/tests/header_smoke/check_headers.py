"""Build and check the sgl_kernel header library (include/sgl_kernel).

A script, not a pytest module. It

1. compiles ``smoke.cu`` (every header, every template for fp16/bf16/fp32, and the tutorial's
   Step 1 ``scale.cuh`` verbatim) into a shared library with nvcc for sm_90;
2. compiles ``host_only.cc`` (utils.h + tensor.h) with g++ alone, without CUDA headers;
3. loads both through ``tvm_ffi.load_module`` and checks the exported symbols;
4. checks with ``cuobjdump -sass`` that the tutorial's bf16 scale kernel uses 128-bit loads;
5. calls the host-side checks with CPU torch tensors and asserts each raises ``RuntimeError`` whose
   message names the tensor, what failed, expected vs actual, and a ``file:line``;
6. if a CUDA GPU is present, runs the kernels and checks their results.

Usage: ``python check_headers.py [--out-dir DIR]``. Exits non-zero on the first failure.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
INCLUDE_DIR = HERE.parents[1] / "include"  # python/sglang/jit_kernel/include
CUDA_HOME = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
NVCC_FLAGS = [
    "-std=c++20",
    "-O3",
    "--expt-relaxed-constexpr",
    "-gencode=arch=compute_90,code=sm_90",
    "-DSGL_CUDA_ARCH=900",
]
# file:line suffix appended by host::PanicError
LOCATION_RE = re.compile(r"\[at [^\]]+:\d+\]")


def _run(cmd: list[str]) -> str:
    print("+", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stdout, proc.stderr, sep="\n")
        raise SystemExit(f"command failed with exit code {proc.returncode}")
    return proc.stdout + proc.stderr


def build(out_dir: Path) -> tuple[Path, Path]:
    """Compile smoke.cu (nvcc) and host_only.cc (g++); return the two library paths."""
    import tvm_ffi.libinfo

    tvm_include = tvm_ffi.libinfo.find_include_path()
    tvm_lib_dir = str(Path(tvm_ffi.libinfo.find_libtvm_ffi()).parent)
    nvcc = shutil.which("nvcc") or str(CUDA_HOME / "bin" / "nvcc")
    smoke_so = out_dir / "smoke.so"
    _run(
        [nvcc, *NVCC_FLAGS, "-Xcompiler", "-fPIC", "-shared"]
        + ["-I", str(INCLUDE_DIR), "-I", tvm_include, str(HERE / "smoke.cu"), "-o", str(smoke_so)]
        + [f"-L{tvm_lib_dir}", "-ltvm_ffi", f"-L{CUDA_HOME / 'lib64'}", "-lcudart"]
    )
    host_so = out_dir / "host_only.so"
    _run(
        ["g++", "-std=c++20", "-O2", "-Wall", "-fPIC", "-shared"]
        + ["-I", str(INCLUDE_DIR), "-I", tvm_include, str(HERE / "host_only.cc"), "-o", str(host_so)]
        + [f"-L{tvm_lib_dir}", "-ltvm_ffi"]
    )
    return smoke_so, host_so


def check_sass(smoke_so: Path) -> None:
    """The tutorial's scale_kernel<bf16_t, 8> must load and store with one 128-bit access."""
    cuobjdump = shutil.which("cuobjdump") or str(CUDA_HOME / "bin" / "cuobjdump")
    if not Path(cuobjdump).exists():
        try:
            import triton  # bundles cuobjdump

            cuobjdump = str(Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump")
        except ImportError:
            pass
    if not Path(cuobjdump).exists():
        print("SKIP sass check: cuobjdump not found")
        return
    sass = _run([cuobjdump, "-sass", str(smoke_so)])
    functions = re.split(r"\n\s*Function : ", sass)
    bf16_scale = [
        f for f in functions if f.startswith("_Z") and "scale_kernel" in f.split()[0] and "nv_bfloat16" in f.split()[0]
    ]
    assert len(bf16_scale) == 1, "scale_kernel<bf16_t, 8> not found in SASS"
    body = bf16_scale[0]
    loads = sorted(set(re.findall(r"\bLDG\.[A-Z0-9.]+", body)))
    stores = sorted(set(re.findall(r"\bSTG\.[A-Z0-9.]+", body)))
    print(f"scale_kernel<bf16_t, 8>: loads {loads}, stores {stores}")
    assert any(l.startswith("LDG.E.128") for l in loads), "no LDG.E.128 in the bf16 scale kernel"
    assert any(s.startswith("STG.E.128") for s in stores), "no STG.E.128 in the bf16 scale kernel"


def expect_error(fn: Callable[[], object], *needles: str) -> str:
    """Call fn, require a RuntimeError containing every needle and a file:line; return the message."""
    try:
        fn()
    except RuntimeError as err:
        message = str(err)
    else:
        raise AssertionError(f"expected RuntimeError containing {needles}")
    missing = [n for n in needles if n not in message]
    assert not missing, f"message {message!r} lacks {missing}"
    assert LOCATION_RE.search(message), f"message {message!r} has no [at file:line]"
    print(f"  ok RuntimeError: {message}")
    return message


def check_host(smoke, host_only) -> None:
    import torch

    for name in [
        "scale_fp16",
        "scale_bf16",
        "scale_fp32",
        "smoke_fp16",
        "smoke_bf16",
        "smoke_fp32",
        "match_2d",
        "match_pair",
        "match_cuda",
        "match_strided",
        "match_contiguous",
        "raise_error",
        "utils_probe",
    ]:
        assert callable(getattr(smoke, name)), name
    print("smoke.so exports all symbols")

    bf16 = torch.zeros(8, 4096, dtype=torch.bfloat16)
    smoke.match_2d(bf16)
    smoke.match_2d(torch.zeros(0, 4096, dtype=torch.float16))
    expect_error(
        lambda: smoke.match_2d(torch.zeros(8, 4095, dtype=torch.bfloat16)),
        "src: dim 1 (hidden_size) expected 4096, got 4095",
        "smoke.cu:",
    )
    expect_error(
        lambda: smoke.match_2d(torch.zeros(8, 4096, dtype=torch.float32)),
        "src: dtype expected one of [bfloat16, float16], got float32",
    )
    expect_error(lambda: smoke.match_2d(torch.zeros(2, 8, 4096, dtype=torch.bfloat16)), "src: ndim expected 2, got 3")
    expect_error(
        lambda: smoke.match_2d(torch.zeros(4096, 8, dtype=torch.bfloat16).t()),
        "src: expected contiguous strides",
        "got strides [1, 8]",
    )

    smoke.match_pair(torch.zeros(3, 5), torch.zeros(3, 5))
    expect_error(
        lambda: smoke.match_pair(torch.zeros(3, 5), torch.zeros(3, 6)),
        "tensor #1: dim 1 (hidden_size) expected 5, got 6",
    )
    expect_error(
        lambda: smoke.match_pair(torch.zeros(3, 5), torch.zeros(3, 5, dtype=torch.bfloat16)),
        "tensor #1: dtype expected float32, got bfloat16",
    )
    expect_error(
        lambda: smoke.match_pair(torch.zeros(3, 5, dtype=torch.float16), torch.zeros(3, 5)),
        "tensor #0: dtype expected one of [float32, bfloat16], got float16",
    )

    expect_error(lambda: smoke.match_cuda(torch.zeros(4)), "x: device expected cuda, got cpu:0")

    wide = torch.zeros(4, 24)
    assert smoke.match_strided(wide[:, 8:16]) == 24
    expect_error(lambda: smoke.match_strided(torch.zeros(4, 16)[:, ::2]), "x: stride 1 expected 1, got 2")
    smoke.match_contiguous(torch.zeros(5, 1)[:, :])
    smoke.match_contiguous(torch.zeros(1, 7).expand(1, 7))
    expect_error(lambda: smoke.match_contiguous(wide[:, 8:16]), "x: expected contiguous strides")

    expect_error(lambda: smoke.raise_error(0), "explicit panic with value 0")
    expect_error(lambda: smoke.raise_error(1), "Runtime check failed: runtime check with value 1")
    expect_error(lambda: smoke.raise_error(2), "SymbolicSize 'unbound_size' has no value")
    expect_error(lambda: smoke.raise_error(3), "LaunchKernel: grid has 0 blocks (grid = (0, 1, 1))")
    expect_error(lambda: smoke.raise_error(4), "LaunchKernel: grid has 0 blocks (grid = (1, 0, 1))")
    expect_error(lambda: smoke.raise_error(5), "CUDA error: cudaErrorInvalidValue")
    assert smoke.raise_error(6) == 6
    # ceil(10/4)=3, + 0+1+2+3, + 10 bytes of offsets
    assert smoke.utils_probe(10, 4) == 3 + 6 + 10

    assert host_only.match_host(torch.zeros(3, 4), torch.zeros(3, dtype=torch.int64)) == 12
    expect_error(
        lambda: host_only.match_host(torch.zeros(3, 4, dtype=torch.float64), torch.zeros(3, dtype=torch.int64)),
        "matrix: dtype expected one of [float32, int32], got float64",
        "host_only.cc:",
    )
    expect_error(
        lambda: host_only.match_host(torch.zeros(3, 4), torch.zeros(2, dtype=torch.int64)),
        "row_ids: dim 0 (num_rows) expected 3, got 2",
    )
    print("host-side checks passed")


def check_gpu(smoke) -> None:
    import torch

    if not torch.cuda.is_available():
        print("SKIP GPU checks: no CUDA device")
        return
    torch.manual_seed(0)
    for dtype, suffix in [(torch.float16, "fp16"), (torch.bfloat16, "bf16"), (torch.float32, "fp32")]:
        for n in [1, 7, 129, 4097, 100003]:
            src = torch.randn(n, dtype=dtype, device="cuda")
            dst = torch.full_like(src, float("nan"))
            getattr(smoke, f"scale_{suffix}")(dst, src, 3.0)
            ref = (src.float() * 3.0).to(dtype)
            torch.testing.assert_close(dst, ref, rtol=0, atol=0)

            dst = torch.full_like(src, float("nan"))
            res = torch.zeros(16, device="cuda")
            res[2] = float("-inf")
            getattr(smoke, f"smoke_{suffix}")(dst, src, res)
            torch.cuda.synchronize()
            torch.testing.assert_close(dst, src.abs(), rtol=0, atol=0)
            r = res.cpu().tolist()
            srcf = src.float()
            tol = 1e-5 * n
            assert abs(r[0] - srcf.sum().item()) <= tol, (suffix, n, r[0], srcf.sum().item())
            assert r[1] == srcf.abs().max().item() and r[2] == srcf.max().item(), (suffix, r[1:3])
            assert r[3:6] == [496.0, 376.0, 31.0], r[3:6]
            h = torch.tensor(0.5, dtype=dtype)
            expected = [h.float().exp(), h.float().sqrt(), h.float().rsqrt(), h.float().sin(), h.float().cos()]
            for got, want in zip(r[6:11], expected):
                want = want.to(dtype).float().item()
                assert abs(got - want) <= (2e-2 if dtype != torch.float32 else 1e-6) * abs(want), (suffix, r[6:11])
            assert r[11:16] == [-1.0, 3.0, 2.0, -0.75, 42.0], (suffix, r[11:16])
    empty = torch.empty(0, device="cuda", dtype=torch.bfloat16)
    expect_error(lambda: smoke.scale_bf16(empty, empty, 2.0), "num_elements must be > 0")
    if torch.cuda.device_count() > 1:
        src = torch.randn(1000, device="cuda:1", dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        torch.cuda.set_device(0)
        smoke.scale_bf16(dst, src, 2.0)
        torch.cuda.synchronize(1)
        torch.testing.assert_close(dst, (src.float() * 2).to(torch.bfloat16), rtol=0, atol=0)
        expect_error(
            lambda: smoke.scale_bf16(dst, src.to("cuda:0"), 2.0), "tensor #1: device expected cuda:1, got cuda:0"
        )
        print("cuda:1 launch while cuda:0 is current: ok")
    print("GPU checks passed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=None, help="where to put the built libraries")
    args = parser.parse_args()
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="sgl_header_smoke_"))
    out_dir.mkdir(parents=True, exist_ok=True)

    import tvm_ffi

    smoke_so, host_so = build(out_dir)
    check_sass(smoke_so)
    smoke = tvm_ffi.load_module(str(smoke_so))
    host_only = tvm_ffi.load_module(str(host_so))
    check_host(smoke, host_only)
    check_gpu(smoke)
    print("ALL HEADER CHECKS PASSED")


if __name__ == "__main__":
    sys.exit(main())
