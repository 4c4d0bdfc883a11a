"""Packaging: the distribution installs beside sglang without touching sglang's files (no GPU needed).

Hermetic: wheels are built from a copy of this checkout with the running interpreter's setuptools
(``--no-build-isolation``) and installed with ``--no-index --no-deps`` into throwaway venvs, so
nothing is downloaded. A stand-in ``sglang`` wheel owns the paths real sglang owns and this package
must not (``sglang/__init__.py`` with content, ``sglang/test/ci/ci_register.py``...). Each scenario
installs ours beside it (both orders; wheel and editable installs), checks every stand-in file's
hash, what ``import sglang`` / ``sglang.jit_kernel.scale`` / the tutorial's ``register_cuda_ci``
resolve to, then uninstalls ours and checks again. ``test_beside_real_sglang`` repeats it with the
real ``sglang==0.5.23`` wheel, nightly only (``SGLANG_JIT_KERNEL_RUN_FULL_TESTS=1``) and only where
the package index is reachable.
"""

import base64
import csv
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]
try:
    import sglang.jit_kernel.ci_register  # noqa: F401
except ImportError:  # running from a checkout without installing the package
    sys.path.insert(0, str(REPO / "python"))

from sglang.jit_kernel.ci_register import register_cpu_ci  # noqa: E402

register_cpu_ci(est_time=30, suite="stage-a-kernel-cpu")

DIST = "sglang_jit_kernel"
COMPAT = "sglang_jit_kernel_compat"
# What sglang 0.5.23's wheel RECORD lists among the paths this checkout has under python/sglang/.
SGLANG_OWNED = (
    "sglang/__init__.py",
    "sglang/test/__init__.py",
    "sglang/test/ci/__init__.py",
    "sglang/test/ci/ci_register.py",
)
REAL_SGLANG = "sglang==0.5.23"
UNIT = "stage-b-kernel-unit-1-gpu-large"


def _missing_build_tools() -> str | None:
    try:
        import setuptools
    except ImportError:
        return "setuptools is not installed in this interpreter (the wheels are built without downloading it)"
    major = int(setuptools.__version__.split(".")[0])
    if major < 64:
        return f"setuptools {setuptools.__version__} < 64 (PEP 660 editable builds)"
    if major < 70 and importlib.util.find_spec("wheel") is None:
        return f"setuptools {setuptools.__version__} needs the wheel package for bdist_wheel"
    return None


pytestmark = pytest.mark.skipif(_missing_build_tools() is not None, reason=str(_missing_build_tools()))


# ---------------------------------------------------------------------------
# Helpers.
# ---------------------------------------------------------------------------
def _run(*cmd, cwd=None, env=None) -> str:
    full_env = dict(os.environ, PIP_NO_INDEX="1", PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    full_env.pop("PYTHONPATH", None)
    full_env.update(env or {})
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=full_env, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _sha256(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _record(wheel: Path) -> dict[str, str]:
    """path -> hash of every file a wheel's RECORD lists (RECORD itself has no hash)."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        rows = csv.reader(zf.read(name).decode().splitlines())
    return {path: digest for path, digest, _size in rows}


def _copy_checkout(dst: Path) -> Path:
    """The files a build reads, without build/, egg-info or caches (a stale build/lib leaks into wheels)."""
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist", ".clangd", "*.pyc")
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dst / name)
    shutil.copytree(REPO / "python", dst / "python", ignore=skip)
    (dst / "test").mkdir()
    shutil.copy2(REPO / "test" / "run_suite.py", dst / "test" / "run_suite.py")
    return dst


def _build_with_backend(src: Path, hook: str, out: Path) -> Path:
    """Call a PEP 517/660 hook of setuptools.build_meta in ``src`` (what pip does), return the file."""
    code = f"import sys; from setuptools import build_meta as b; print(b.{hook}(sys.argv[1]))"
    name = _run(sys.executable, "-c", code, out, cwd=src).strip().splitlines()[-1]
    return out / name


def _make_standin_wheel(out: Path) -> Path:
    """A wheel of a distribution named sglang that owns the paths real sglang owns."""
    files = {
        "sglang/__init__.py": '"""Stand-in for the sglang distribution: a package init with content."""\n\nSTANDIN = True\n',
        "sglang/test/__init__.py": '"""Stand-in: sglang.test, with content for the hash check."""\n',
        "sglang/test/ci/__init__.py": '"""CI utilities of the stand-in."""\n',
        "sglang/test/ci/ci_register.py": (
            "STANDIN = True\n\n\n"
            "def register_cuda_ci(est_time, suite=None, nightly=False, disabled=None, *, stage=None, runner_config=None):\n"
            "    return None\n"
        ),
        "sglang/lang/api.py": "def gen():\n    return 'stand-in'\n",
    }
    info = "sglang-0.0.1.dist-info"
    files[f"{info}/METADATA"] = "Metadata-Version: 2.1\nName: sglang\nVersion: 0.0.1\n"
    files[f"{info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: test_packaging\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = [f"{p},{_sha256(t.encode())},{len(t.encode())}" for p, t in files.items()] + [f"{info}/RECORD,,"]
    wheel = out / "sglang-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
        zf.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return wheel


class Venv:
    """A throwaway venv without pip; the running interpreter's pip installs into it (``--python``)."""

    def __init__(self, root: Path):
        _run(sys.executable, "-m", "venv", "--without-pip", root)
        self.python = root / "bin" / "python"
        purelib = _run(self.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip()
        self.site = Path(purelib)

    def pip(self, *args) -> None:
        _run(sys.executable, "-m", "pip", "--python", self.python, *args)

    def install(self, target) -> None:
        self.pip("install", "--no-deps", "--no-index", "--no-build-isolation", "-q", target)

    def uninstall(self, name: str) -> None:
        self.pip("uninstall", "-y", "-q", name)

    def probe(self, exec_sglang_init: bool = True) -> dict:
        """What the imports resolve to, from a fresh interpreter of this venv.

        torch (``sglang.jit_kernel.scale`` imports it) and tvm_ffi come from the running interpreter's
        directories, appended after the venv's own site-packages so that they cannot shadow ``sglang``.
        With ``exec_sglang_init`` off, sglang's package is created from its spec without running its
        ``__init__.py`` (real sglang's init needs its dependencies, which a --no-deps install lacks).
        """
        extra = sorted({str(Path(importlib.util.find_spec(m).origin).parent.parent) for m in ("torch", "tvm_ffi")})
        code = _PROBE.replace("@EXTRA@", repr(extra)).replace("@EXEC@", repr(exec_sglang_init))
        return json.loads(_run(self.python, "-c", code).strip().splitlines()[-1])


_PROBE = r"""
import importlib.util, json, sys
sys.path.extend(@EXTRA@)
out = {}
spec = importlib.util.find_spec("sglang")
out["sglang_origin"] = spec.origin if spec and spec.has_location else None
if @EXEC@:
    import sglang
else:
    sglang = importlib.util.module_from_spec(spec)
    sys.modules["sglang"] = sglang
out["standin"] = getattr(sglang, "STANDIN", None)
try:
    import sglang.jit_kernel.scale as scale_mod
    out["scale"] = scale_mod.__file__ if callable(scale_mod.scale) else None
except ImportError as exc:
    out["scale"] = None
    out["scale_error"] = repr(exc)
from sglang.test.ci.ci_register import register_cuda_ci
register_cuda_ci(est_time=30, suite="stage-b-kernel-unit-1-gpu-large")
out["ci_register"] = sys.modules["sglang.test.ci.ci_register"].__file__
out["ci_register_is_ours"] = register_cuda_ci.__module__ == "sglang.jit_kernel.ci_register"
print(json.dumps(out))
"""


def _assert_hashes(site: Path, record: dict[str, str]) -> None:
    """Every file of the RECORD is installed with its hash (scripts and .dist-info aside)."""
    changed = []
    for path, digest in record.items():
        if not digest or ".dist-info/" in path or path.startswith(".."):
            continue
        file = site / path
        if not file.is_file() or _sha256(file.read_bytes()) != digest:
            changed.append(path)
    assert not changed, f"{len(changed)} sglang file(s) changed or deleted: {changed[:10]}"


def _assert_ours_gone(site: Path) -> None:
    """No file of ours is left (pip may leave the compat tree's emptied parent directories)."""
    if not site.exists():  # a venv without pip: ours was all it held, and pip removed the emptied directory
        return
    tops = [p for p in site.iterdir() if p.name.startswith((DIST, COMPAT, f"__editable__.{DIST}"))]
    left = [p for top in [*tops, site / "sglang" / "jit_kernel"] for p in [top, *top.rglob("*")] if p.is_file()]
    assert not left, f"left after uninstall: {left}"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Our wheel, our editable wheel (pointing into the copy), and the stand-in wheel."""
    root = tmp_path_factory.mktemp("pkg")
    (root / "src").mkdir()
    src = _copy_checkout(root / "src")
    out = root / "dist"
    out.mkdir()
    wheel = _build_with_backend(src, "build_wheel", out)
    editable = _build_with_backend(src, "build_editable", out)
    shutil.rmtree(src / "build", ignore_errors=True)  # the editable build's scratch dir is not what it links
    return {"src": src, "wheel": wheel, "editable": editable, "standin": _make_standin_wheel(out), "root": root}


def _beside(built, venv_dir: Path, ours: Path, sglang_wheel: Path, ours_first: bool, exec_init: bool = True):
    venv = Venv(venv_dir)
    record = _record(sglang_wheel)
    for target in (ours, sglang_wheel) if ours_first else (sglang_wheel, ours):
        venv.install(target)
    _assert_hashes(venv.site, record)
    seen = venv.probe(exec_init)
    assert seen["sglang_origin"] == str(venv.site / "sglang" / "__init__.py"), seen
    if exec_init:
        assert seen["standin"] is True, seen
    ours_root = built["src"] / "python" if ours == built["editable"] else venv.site
    assert seen["scale"] == str(ours_root / "sglang" / "jit_kernel" / "scale.py"), seen
    assert seen["ci_register"] == str(venv.site / "sglang" / "test" / "ci" / "ci_register.py"), seen
    assert not seen["ci_register_is_ours"], seen

    venv.uninstall("sglang-jit-kernel")
    _assert_hashes(venv.site, record)
    _assert_ours_gone(venv.site)
    if exec_init:
        after = _run(
            venv.python, "-c", "import sglang, sglang.test.ci.ci_register as r; print(sglang.STANDIN, r.STANDIN)"
        )
        assert after.split() == ["True", "True"]


# ---------------------------------------------------------------------------
# Beside sglang: a stand-in owning sglang's paths, both install orders, wheel and editable.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("ours_first", [False, True], ids=["sglang-first", "ours-first"])
@pytest.mark.parametrize("kind", ["wheel", "editable"])
def test_beside_sglang_standin(built, tmp_path, kind, ours_first):
    _beside(built, tmp_path / "venv", built[kind], built["standin"], ours_first)


@pytest.mark.parametrize("kind", ["wheel", "editable"])
def test_standalone(built, tmp_path, kind):
    """Without sglang: ``sglang`` is a namespace, the tutorial's import gets our registry, run_suite works."""
    venv = Venv(tmp_path / "venv")
    venv.install(built[kind])
    seen = venv.probe()
    assert seen["sglang_origin"] is None, seen  # a namespace package: no sglang/__init__.py anywhere
    ours_root = built["src"] / "python" if kind == "editable" else venv.site
    assert seen["scale"] == str(ours_root / "sglang" / "jit_kernel" / "scale.py"), seen
    compat = built["src"] / "python" if kind == "editable" else venv.site / COMPAT
    assert seen["ci_register"] == str(compat / "sglang" / "test" / "ci" / "ci_register.py"), seen
    assert seen["ci_register_is_ours"], seen
    listed = _run(venv.python, built["src"] / "test" / "run_suite.py", "--hw", "cuda", "--suite", UNIT, "--list")
    assert "test_scale.py" in listed
    venv.uninstall("sglang-jit-kernel")
    _assert_ours_gone(venv.site)


# ---------------------------------------------------------------------------
# What the wheel and the sdist contain.
# ---------------------------------------------------------------------------
def _expected_wheel_files(src: Path) -> set[str]:
    jk = src / "python" / "sglang" / "jit_kernel"
    files = {p for p in jk.rglob("*.py") if "__pycache__" not in p.parts}
    files |= {p for p in (jk / "include" / "sgl_kernel").iterdir() if p.is_file()}
    files |= set((jk / "csrc").rglob("*.cuh"))
    # C++ files the shipped tests and probes compile by path.
    files |= {p for suffix in ("cuh", "cu", "cc", "h") for p in (jk / "tests").rglob(f"*.{suffix}")}
    files |= set((jk / "benchmark").glob("*.cuh"))
    expected = {p.relative_to(src / "python").as_posix() for p in files}
    expected |= {f"{COMPAT}.pth", f"{COMPAT}/sglang/test/ci/ci_register.py"}
    info = f"{DIST}-0.1.0.dist-info"
    return expected | {f"{info}/{n}" for n in ("METADATA", "WHEEL", "RECORD", "top_level.txt")}


def test_wheel_and_sdist_contents(built, tmp_path):
    src, wheel = built["src"], built["wheel"]
    record = _record(wheel)
    assert set(record) == _expected_wheel_files(src)
    assert not [p for p in record if p.startswith("sglang/") and not p.startswith("sglang/jit_kernel/")]
    assert not set(SGLANG_OWNED) & set(record)
    with zipfile.ZipFile(wheel) as zf:
        assert zf.read(f"{COMPAT}.pth").decode() == f"{COMPAT}\n"
        bad = [p for p, digest in record.items() if digest and _sha256(zf.read(p)) != digest]
    assert not bad, f"RECORD hashes do not match: {bad}"

    sdist = _build_with_backend(src, "build_sdist", tmp_path)
    with tarfile.open(sdist) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
        files = {m.name.split("/", 1)[1] for m in tf.getmembers() if m.isfile() and "/" in m.name}
        tf.extractall(tmp_path, filter="data") if sys.version_info >= (3, 12) else tf.extractall(tmp_path)  # noqa: S202
    for needed in ("setup.py", "pyproject.toml", "README.md", "PKG-INFO", "python/sglang/test/ci/ci_register.py"):
        assert needed in names, needed
    assert "python/sglang/__init__.py" not in names
    # Nothing else: the package's own tree, the compat module's source, the project files and
    # setuptools' metadata.
    top = {"setup.py", "setup.cfg", "pyproject.toml", "README.md", "PKG-INFO"}
    allowed = ("python/sglang/jit_kernel/", "sglang_jit_kernel.egg-info/")
    stray = sorted(
        n for n in files if n not in top and not n.startswith(allowed) and n != "python/sglang/test/ci/ci_register.py"
    )
    assert not stray, f"sdist files outside the package: {stray}"
    # The sdist is complete: a wheel built from it lists the same files as one built from the tree.
    unpacked = tmp_path / sdist.name.removesuffix(".tar.gz")
    out = tmp_path / "from_sdist"
    out.mkdir()
    assert set(_record(_build_with_backend(unpacked, "build_wheel", out))) == set(record)


# ---------------------------------------------------------------------------
# The real sglang 0.5.23 wheel (nightly, network).
# ---------------------------------------------------------------------------
@pytest.mark.skipif(
    os.environ.get("SGLANG_JIT_KERNEL_RUN_FULL_TESTS", "").lower() not in ("1", "true", "yes", "on"),
    reason="downloads the real sglang wheel (about 40 MB): nightly only, SGLANG_JIT_KERNEL_RUN_FULL_TESTS=1",
)
@pytest.mark.parametrize("ours_first", [False, True], ids=["sglang-first", "ours-first"])
def test_beside_real_sglang(built, tmp_path, ours_first):
    cache = built["root"] / "real"
    if not any(cache.glob("sglang-*.whl")):
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", REAL_SGLANG, "-d", cache]
        env = {k: v for k, v in os.environ.items() if k != "PIP_NO_INDEX"}
        try:
            proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, env=env)
        except subprocess.TimeoutExpired:
            pytest.skip(f"the package index did not answer in 300 s ({REAL_SGLANG})")
        if proc.returncode != 0:
            pytest.skip(f"the package index is not reachable: pip download {REAL_SGLANG} failed: {proc.stderr[-300:]}")
    real = next(cache.glob("sglang-*.whl"))
    assert set(SGLANG_OWNED) <= set(_record(real)), "sglang's RECORD changed: update SGLANG_OWNED"
    assert not [p for p in _record(real) if p.startswith("sglang/jit_kernel/")]
    # sglang's __init__ needs its dependencies (not installed, --no-deps): probe its package unexecuted.
    _beside(built, tmp_path / "venv", built["wheel"], real, ours_first, exec_init=False)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v", "-s"]))
