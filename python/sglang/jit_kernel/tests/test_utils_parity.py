"""The helpers of ``sglang.jit_kernel.utils`` that the original sglang package has too: ``CPP_DTYPE_MAP``,
``get_jit_cuda_arch`` / ``override_jit_cuda_arch`` and ``is_hip_runtime``. Runs anywhere: no GPU and no
nvcc (the toolkit lookup is faked where a spec is made)."""

from __future__ import annotations

import contextvars
import sys
import threading
from pathlib import Path

import pytest
import torch

from sglang.jit_kernel import _build, utils
from sglang.jit_kernel.utils import (
    CPP_DTYPE_MAP,
    CUDAArch,
    get_jit_cuda_arch,
    get_jit_cuda_archs,
    is_hip_runtime,
    make_cpp_args,
    override_jit_cuda_arch,
)
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="stage-a-kernel-cpu")


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No visible GPU, no SGLANG_JIT_CUDA_ARCH, and a toolkit lookup that needs no nvcc."""
    monkeypatch.delenv("SGLANG_JIT_CUDA_ARCH", raising=False)
    monkeypatch.setattr(_build, "_memo", {"device_archs": (), "cuda_home": tmp_path / "cuda"})


def test_public_names_are_exported_and_documented():
    for name in (
        "CPP_DTYPE_MAP",
        "CUDAArch",
        "get_jit_cuda_arch",
        "get_jit_cuda_archs",
        "override_jit_cuda_arch",
        "is_hip_runtime",
        "register_dependency",
    ):
        assert name in utils.__all__ and hasattr(utils, name), name
    for fn in (get_jit_cuda_arch, get_jit_cuda_archs, override_jit_cuda_arch, utils.register_dependency):
        assert "Raises\n    ------" in fn.__doc__, fn.__name__


def test_cpp_dtype_map_is_the_table_behind_make_cpp_args(monkeypatch):
    assert CPP_DTYPE_MAP[torch.float16] == "fp16_t"
    assert CPP_DTYPE_MAP[torch.bfloat16] == "bf16_t"
    assert CPP_DTYPE_MAP[torch.float32] == "fp32_t"
    assert CPP_DTYPE_MAP[torch.float8_e4m3fn] == "fp8_e4m3_t"
    assert all(make_cpp_args(dtype) == (alias,) for dtype, alias in CPP_DTYPE_MAP.items())
    assert not hasattr(utils, "_DTYPE_TO_CPP")  # one source
    monkeypatch.setitem(CPP_DTYPE_MAP, torch.complex64, "complex64_t")
    assert make_cpp_args(torch.complex64) == ("complex64_t",)
    monkeypatch.delitem(CPP_DTYPE_MAP, torch.complex64)
    with pytest.raises(TypeError, match="no C\\+\\+ type for torch.complex64"):
        make_cpp_args(torch.complex64)


def test_cuda_arch_reads_like_the_flags():
    arch = CUDAArch(9, 0, "a")
    assert (arch.major, arch.minor, arch.suffix) == (9, 0, "a")
    assert str(arch) == "9.0a" and str(CUDAArch(8, 6)) == "8.6"
    assert CUDAArch(9, 0) >= (9, 0) > CUDAArch(8, 9)


def test_get_jit_cuda_arch_follows_the_environment(no_gpu, monkeypatch):
    with pytest.raises(RuntimeError, match="set SGLANG_JIT_CUDA_ARCH"):
        get_jit_cuda_arch()
    monkeypatch.setenv("SGLANG_JIT_CUDA_ARCH", "9.0a, 8.0")
    assert get_jit_cuda_archs() == (CUDAArch(8, 0, ""), CUDAArch(9, 0, "a"))
    assert get_jit_cuda_arch() == CUDAArch(8, 0, "")  # the lowest: SGL_CUDA_ARCH=800
    monkeypatch.setenv("SGLANG_JIT_CUDA_ARCH", "9.x")
    with pytest.raises(ValueError, match="invalid CUDA architecture '9.x'"):
        get_jit_cuda_arch()


def test_get_jit_cuda_arch_follows_the_visible_gpus(no_gpu, monkeypatch):
    monkeypatch.setitem(_build._memo, "device_archs", ("8.0", "9.0"))
    assert get_jit_cuda_archs() == (CUDAArch(8, 0), CUDAArch(9, 0))


def test_override_targets_load_jit_inside_the_block_and_restores(no_gpu, monkeypatch, tmp_path):
    monkeypatch.setenv("SGLANG_JIT_CUDA_ARCH", "8.0")
    with override_jit_cuda_arch(9, 0, "a") as arch:
        assert arch == CUDAArch(9, 0, "a") == get_jit_cuda_arch()
        with override_jit_cuda_arch(10, 0):  # nests: the innermost wins
            assert get_jit_cuda_archs() == (CUDAArch(10, 0),)
        assert get_jit_cuda_arch() == CUDAArch(9, 0, "a")
        assert _build.resolve_cuda_archs("8.6") == ("8.6",)  # an explicit cuda_archs= still wins
        source = tmp_path / "k.cuh"
        source.write_text("int k() { return 0; }\n")
        spec = _build.make_spec("k", [], [str(source)], [], [("k", "k")], [], [], [], [], None)
        assert spec.archs == ("9.0a",)
        assert "-gencode=arch=compute_90a,code=sm_90a" in spec.cuda_cflags and "-DSGL_CUDA_ARCH=900" in spec.cuda_cflags
    assert get_jit_cuda_arch() == CUDAArch(8, 0)
    with pytest.raises(KeyError):
        with override_jit_cuda_arch(9, 0):
            raise KeyError("inside")
    assert get_jit_cuda_arch() == CUDAArch(8, 0)  # restored after an exception too


def test_override_holds_in_its_own_thread_only(no_gpu):
    seen: dict[str, tuple[CUDAArch, ...] | str] = {}

    def probe(label: str) -> None:
        try:
            seen[label] = get_jit_cuda_archs()
        except RuntimeError:
            seen[label] = "no target"

    with override_jit_cuda_arch(9, 0):
        other = threading.Thread(target=probe, args=("thread",))
        other.start()
        other.join()
        carried = threading.Thread(target=contextvars.copy_context().run, args=(probe, "copied context"))
        carried.start()
        carried.join()
        probe("inside")
    assert seen == {"thread": "no target", "copied context": (CUDAArch(9, 0),), "inside": (CUDAArch(9, 0),)}


@pytest.mark.parametrize(
    "args, message",
    [
        ((9, 0, "b"), "suffix value: expected .., .a. or .f., got .b."),
        ((9, 10), "minor value: expected an int in 0..9, got 10"),
        ((-1, 0), "major value: expected an int in 0..N, got -1"),
        ((9.0, 0), "major value: expected an int in 0..N, got 9.0"),
    ],
)
def test_override_rejects_bad_architectures(args, message):
    with pytest.raises(ValueError, match=message):
        with override_jit_cuda_arch(*args):
            pass


def test_is_hip_runtime(monkeypatch):
    assert is_hip_runtime() is bool(torch.version.hip)
    monkeypatch.setattr(torch.version, "hip", "6.2.41133")
    assert is_hip_runtime() is True
    monkeypatch.setattr(torch.version, "hip", None)
    assert is_hip_runtime() is False


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v", "-s"]))
