"""``load_jit(..., extra_dependencies=[...], header_only=...)``: header-only C++ dependencies found from
installed Python packages, and listed files compiled as their own translation units.

The registry cases run anywhere (a stand-in package in tmp_path; the toolchain fingerprint is faked, so
no nvcc is needed); the compile cases need nvcc, not a GPU, and target sm_90. The FlashInfer/CUTLASS
case needs ``flashinfer-python`` installed and skips, saying so, otherwise.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from sglang.jit_kernel import _build, _dependencies
from sglang.jit_kernel.testing import requires_nvcc
from sglang.jit_kernel.utils import load_jit, register_dependency
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="stage-a-kernel-cpu")

KERNEL_H = """\
#include <cstdint>
#include <fakedep/value.h>
int64_t fake_value() { return FAKEDEP_VALUE; }
"""


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A private copy of the dependency registry and an empty per-process resolution memo."""
    monkeypatch.setattr(_dependencies, "_registry", dict(_dependencies._registry))
    monkeypatch.setattr(_dependencies, "_resolved", {})


@pytest.fixture
def fake_toolchain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registry) -> None:
    """Keys without nvcc: the toolkit lookup and the toolchain fingerprint come from the memo."""
    monkeypatch.setattr(
        _build, "_memo", {"cuda_home": tmp_path / "cuda", "toolchain": {"cuda_home": "fake", "tvm_ffi": "fake"}}
    )
    monkeypatch.setenv("SGLANG_JIT_CUDA_ARCH", "9.0")


def make_package(site: Path, name: str, version: str, value: int) -> Path:
    """An importable package ``name`` under ``site`` with ``include/<name>/value.h``, an unused header
    beside it, and distribution metadata of ``version``; returns its include directory."""
    package = site / name
    (package / "include" / name).mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "include" / name / "value.h").write_text(f"#define FAKEDEP_VALUE {value}\n")
    (package / "include" / name / "unused.h").write_text("#define FAKEDEP_UNUSED 0\n")
    set_version(site, name, version)
    return package / "include"


def set_version(site: Path, name: str, version: str) -> None:
    for old in site.glob(f"{name}-*.dist-info"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


@pytest.fixture
def fakedep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registry) -> Path:
    """``fakedep`` 1.0, importable and registered like a real package would be; returns its site dir."""
    site = tmp_path / "site"
    make_package(site, "fakedep", "1.0", 1)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()

    def include_paths() -> list[Path]:
        spec = importlib.util.find_spec("fakedep")
        if spec is None:
            raise ModuleNotFoundError("fakedep is not installed: pip install fakedep", name="fakedep")
        return [Path(spec.submodule_search_locations[0]) / "include"]

    register_dependency("fakedep", include_paths, version=lambda: importlib.metadata.version("fakedep"))
    return site


def spec_with(source: Path, **kwargs) -> _build.BuildSpec:
    return _build.make_spec(
        "fake_value",
        cpp_files=[str(source)],
        cuda_files=[],
        cpp_wrappers=[("fake_value", "fake_value")],
        cuda_wrappers=[],
        extra_cflags=[],
        extra_cuda_cflags=[],
        extra_ldflags=[],
        extra_include_paths=[],
        archs=None,
        **kwargs,
    )


@pytest.fixture
def kernel(tmp_path: Path) -> Path:
    source = tmp_path / "src" / "fake_value.h"
    source.parent.mkdir()
    source.write_text(KERNEL_H)
    return source


# ---------------------------------------------------------------------------------------------
# Registry, include paths and the cache key (no compiler)
# ---------------------------------------------------------------------------------------------
def test_include_paths_and_key_follow_headers_and_version(fake_toolchain, fakedep, kernel, tmp_path):
    include = (fakedep / "fakedep" / "include").resolve()
    spec = spec_with(kernel, extra_dependencies=["fakedep"])
    assert str(include) in spec.include_paths
    assert spec.dependency_versions == ["fakedep=1.0"]
    deps = set(spec.dependencies)
    assert include / "fakedep" / "value.h" in deps  # included: its contents are in the key
    assert include / "fakedep" / "unused.h" not in deps  # not included: not read
    key = spec.key()
    assert key != spec_with(kernel).key()  # listing a dependency changes the key

    # An edited header that the build includes gives a new key, also through the warm-path stamp.
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    assert _build.stamped_key(spec_with(kernel, extra_dependencies=["fakedep"]), root) == key
    (include / "fakedep" / "value.h").write_text("#define FAKEDEP_VALUE 2\n")
    edited = spec_with(kernel, extra_dependencies=["fakedep"])
    assert _build.stamped_key(edited, root) == edited.key() != key

    # A header that no build includes does not matter.
    (include / "fakedep" / "unused.h").write_text("#define FAKEDEP_UNUSED 1\n")
    assert spec_with(kernel, extra_dependencies=["fakedep"]).key() == edited.key()

    # A new version (seen by the next process: the resolution is memoised per process).
    set_version(fakedep, "fakedep", "1.1")
    assert spec_with(kernel, extra_dependencies=["fakedep"]).key() == edited.key()
    _dependencies._resolved.clear()
    bumped = spec_with(kernel, extra_dependencies=["fakedep"])
    assert bumped.dependency_versions == ["fakedep=1.1"]
    assert bumped.key() != edited.key() and bumped.digest() != edited.digest()


def test_unknown_name_lists_the_known_ones(fake_toolchain, kernel):
    with pytest.raises(ValueError, match=r"unknown extra dependency 'cutlas'; known: cutlass, flashinfer"):
        load_jit("fake_value", cpp_files=[str(kernel)], extra_dependencies=["cutlas"])


@pytest.mark.parametrize("name", ["flashinfer", "cutlass"])
def test_missing_flashinfer_names_the_package_and_the_install(fake_toolchain, kernel, monkeypatch, name):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "flashinfer" else real(n, *a))
    with pytest.raises(ModuleNotFoundError) as info:
        load_jit("fake_value", cpp_files=[str(kernel)], extra_dependencies=[name])
    message = str(info.value)
    assert f"extra dependency '{name}' is not available" in message
    assert "pip install flashinfer-python" in message


def test_missing_registered_package_and_missing_directory(fake_toolchain, fakedep, kernel, monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(fakedep)])
    importlib.invalidate_caches()
    with pytest.raises(
        ModuleNotFoundError, match=r"extra dependency 'fakedep' is not available: .*pip install fakedep"
    ):
        spec_with(kernel, extra_dependencies=["fakedep"])
    register_dependency("nodir", lambda: [tmp_path / "absent"])
    with pytest.raises(
        FileNotFoundError, match=r"include directory .*absent of extra dependency 'nodir' does not exist"
    ):
        spec_with(kernel, extra_dependencies=["nodir"])


def test_register_dependency_checks_its_arguments(registry):
    with pytest.raises(ValueError, match="name must be"):
        register_dependency("two words", lambda: [])
    with pytest.raises(TypeError, match="include_paths_fn of 'x' must be callable"):
        register_dependency("x", ["/usr/include"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="version of 'x' must be"):
        register_dependency("x", lambda: [], version=1.0)  # type: ignore[arg-type]


def test_builtins_find_the_headers_flashinfer_ships(fake_toolchain, tmp_path, monkeypatch):
    """A stand-in flashinfer with the wheel's layout: the include dirs come from the installed package
    (wherever it is), the version from the package's own build metadata; absent optional dirs
    (csrc, spdlog) are left out."""
    data = tmp_path / "site" / "flashinfer" / "data"
    for sub in ("include/flashinfer", "cutlass/include/cutlass", "cutlass/tools/util/include/cutlass"):
        (data / sub).mkdir(parents=True)
    (data.parent / "__init__.py").write_text("raise ImportError('importing flashinfer is not needed')\n")
    (data.parent / "_build_meta.py").write_text('__version__ = "9.9.9"\n')
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "flashinfer", raising=False)
    importlib.invalidate_caches()
    cutlass, flashinfer = _dependencies.resolve_dependencies(["cutlass", "flashinfer"])
    assert cutlass.include_dirs == (data / "cutlass" / "include", data / "cutlass" / "tools" / "util" / "include")
    assert flashinfer.include_dirs == (data / "include", *cutlass.include_dirs)
    assert cutlass.version == flashinfer.version == "9.9.9"


def test_header_only_false_takes_no_wrappers(fake_toolchain, kernel):
    with pytest.raises(ValueError, match="header_only=False .* give no cuda_wrappers / cpp_wrappers"):
        load_jit("fake_value", cpp_files=[str(kernel)], cpp_wrappers=[("f", "f")], header_only=False)


# ---------------------------------------------------------------------------------------------
# Compiles (nvcc, no GPU)
# ---------------------------------------------------------------------------------------------
CUDA_UNIT = """\
#include <cstdint>
#include <tvm/ffi/function.h>
#include <fakedep/value.h>
__global__ void fill_kernel(int64_t* out) { *out = FAKEDEP_VALUE; }
int64_t cuda_unit_value() { return 10 * FAKEDEP_VALUE; }
TVM_FFI_DLL_EXPORT_TYPED_FUNC(cuda_unit_value, cuda_unit_value);
"""

CPP_UNIT = """\
#include <cstdint>
#include <tvm/ffi/function.h>
#include <fakedep/value.h>
int64_t cpp_unit_value() { return 100 * FAKEDEP_VALUE; }
TVM_FFI_DLL_EXPORT_TYPED_FUNC(cpp_unit_value, cpp_unit_value);
"""


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("SGLANG_JIT_CACHE_DIR", str(root))
    monkeypatch.setenv("SGLANG_JIT_CUDA_ARCH", "9.0")
    monkeypatch.setattr(_build, "_memo", {})
    monkeypatch.setattr(_build, "_loaded", {})
    return root


@requires_nvcc
def test_translation_units_export_their_own_functions(cache_dir, fakedep, tmp_path):
    """header_only=False: a .cuh (nvcc) and a .h (g++) compiled as they are, each exporting its own
    function, no wrappers; the stand-in dependency's header is on the include path of both."""
    cuda_unit, cpp_unit = tmp_path / "cuda_unit.cuh", tmp_path / "cpp_unit.h"
    cuda_unit.write_text(CUDA_UNIT)
    cpp_unit.write_text(CPP_UNIT)
    module = load_jit(
        "units",
        cuda_files=[str(cuda_unit)],
        cpp_files=[str(cpp_unit)],
        extra_dependencies=["fakedep"],
        header_only=False,
    )
    assert (module.cuda_unit_value(), module.cpp_unit_value()) == (10, 100)
    with pytest.raises(AttributeError, match=r"its functions: cpp_unit_value, cuda_unit_value$"):
        module.value  # noqa: B018 (the attribute access is what raises)


def _flashinfer_installed() -> bool:
    try:
        _dependencies.resolve_dependencies(["cutlass", "flashinfer"])
    except (ImportError, FileNotFoundError):
        return False
    return True


FLASHINFER_CUH = """\
#include <cstdint>
#include <cutlass/numeric_types.h>  // For cutlass::half_t, cutlass::bfloat16_t
#include <flashinfer/math.cuh>      // For flashinfer::math::log2e
int64_t cutlass_half_bytes() { return sizeof(cutlass::half_t) + sizeof(cutlass::bfloat16_t); }
double flashinfer_log2e() { return flashinfer::math::log2e_d; }
"""


@requires_nvcc
@pytest.mark.skipif(not _flashinfer_installed(), reason="needs flashinfer-python (pip install flashinfer-python)")
def test_compiles_against_the_installed_flashinfer_and_cutlass(cache_dir, tmp_path):
    source = tmp_path / "flashinfer_probe.cuh"
    source.write_text(FLASHINFER_CUH)
    module = load_jit(
        "flashinfer_probe",
        cuda_files=[str(source)],
        cuda_wrappers=[("cutlass_half_bytes", "cutlass_half_bytes"), ("flashinfer_log2e", "flashinfer_log2e")],
        extra_dependencies=["flashinfer", "cutlass"],
    )
    assert module.cutlass_half_bytes() == 4
    assert module.flashinfer_log2e() == pytest.approx(1.4426950408889634)
    [entry] = [p for p in cache_dir.iterdir() if p.name.startswith("flashinfer_probe-")]
    manifest = (entry / "manifest.json").read_text()
    assert "cutlass/numeric_types.h" in manifest  # the included CUTLASS headers are dependencies of the key


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v", "-s"]))
