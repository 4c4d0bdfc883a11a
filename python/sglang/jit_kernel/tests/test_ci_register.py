"""Tests for the static CI registry reader (no GPU needed)."""

import sys
from pathlib import Path

import pytest

_PYTHON_DIR = Path(__file__).resolve().parents[3]
try:
    import sglang.jit_kernel.ci_register  # noqa: F401
except ImportError:  # running from a checkout without installing the package
    sys.path.insert(0, str(_PYTHON_DIR))

from sglang.jit_kernel.ci_register import (  # noqa: E402
    BACKENDS,
    SUITES,
    CIRegistration,
    collect_registrations,
    is_nightly_suite,
    known_suites,
    register_amd_ci,
    register_cpu_ci,
    register_cuda_ci,
)

register_cpu_ci(est_time=5, suite="stage-a-kernel-cpu")

FIXTURES = Path(__file__).resolve().parent / "ci_fixtures"


# (fixture file, substrings the error message must contain)
ERROR_CASES = [
    ("err_no_registration.py", ["No CI registry found in"]),
    ("err_starred.py", ["starred"]),
    ("err_double_star.py", ["**kwargs"]),
    ("err_unknown_arg.py", ["unknown argument 'gpus'"]),
    ("err_duplicate_arg.py", ["'est_time' given more than once"]),
    ("err_duplicate_keyword.py", ["'nightly' given more than once"]),
    ("err_too_many_positional.py", ["too many positional arguments"]),
    ("err_missing_est_time.py", ["missing required argument 'est_time'"]),
    ("err_missing_suite.py", ["missing required argument 'suite'"]),
    ("err_non_literal_est_time.py", ["'est_time' must be a literal", "EST"]),
    ("err_bool_est_time.py", ["est_time must be an int or float", "bool"]),
    ("err_str_est_time.py", ["est_time must be an int or float", "str"]),
    ("err_non_literal_suite.py", ["'suite' must be a literal"]),
    ("err_int_suite.py", ["suite must be a str", "int"]),
    ("err_int_nightly.py", ["nightly must be a bool", "int"]),
    ("err_int_disabled.py", ["disabled must be a str", "int"]),
]


@pytest.mark.parametrize("name,needles", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_fixture_errors(name, needles):
    path = FIXTURES / name
    with pytest.raises(ValueError) as info:
        collect_registrations(path)
    msg = str(info.value)
    assert str(path) in msg, msg
    for needle in needles:
        assert needle in msg, msg


def test_no_registration_message_is_exact():
    path = FIXTURES / "err_no_registration.py"
    with pytest.raises(ValueError, match="No CI registry found in"):
        collect_registrations(path)
    try:
        collect_registrations(path)
    except ValueError as e:
        assert f"No CI registry found in {path}" in str(e)


def test_every_error_fixture_is_covered():
    on_disk = {p.name for p in FIXTURES.glob("err_*.py")}
    assert on_disk == {name for name, _ in ERROR_CASES}


def test_fixtures_are_never_discovered():
    for p in FIXTURES.iterdir():
        assert not p.name.startswith(("test_", "bench_")), p


def test_valid_multi_registration():
    path = FIXTURES / "ok_multi.py"
    regs = collect_registrations(path)
    f = str(path)
    assert regs == [
        CIRegistration("cuda", 30.0, "stage-b-kernel-unit-1-gpu-large", False, None, f),
        CIRegistration("cuda", 120.5, "nightly-kernel-1-gpu", True, None, f),
        CIRegistration("amd", 45.0, "stage-b-kernel-unit-1-gpu-large", False, "flaky on MI300", f),
        CIRegistration("cpu", 2.0, "stage-a-kernel-cpu", False, None, f),
    ]
    assert all(isinstance(r.est_time, float) for r in regs)


def test_source_argument_and_filename(tmp_path):
    src = 'register_cuda_ci(6, "stage-b-kernel-benchmark-1-gpu-large")\n'
    (reg,) = collect_registrations("bench_fake.py", source=src)
    assert reg.filename == "bench_fake.py"
    assert reg.suite == "stage-b-kernel-benchmark-1-gpu-large"
    assert reg.est_time == 6.0 and reg.nightly is False and reg.disabled is None


def test_never_imports_the_file(tmp_path):
    path = tmp_path / "test_boom.py"
    path.write_text("raise RuntimeError('imported!')\nregister_cpu_ci(est_time=1, suite=\"stage-a-kernel-cpu\")\n")
    (reg,) = collect_registrations(path)
    assert reg.backend == "cpu"


def test_syntax_error_is_value_error(tmp_path):
    path = tmp_path / "test_broken.py"
    path.write_text("def oops(:\n")
    with pytest.raises(ValueError, match="cannot parse"):
        collect_registrations(path)


def test_duplicate_registration_rejected(tmp_path):
    path = tmp_path / "test_twice.py"
    path.write_text(
        'register_cpu_ci(est_time=1, suite="stage-a-kernel-cpu")\n'
        'register_cpu_ci(est_time=2, suite="stage-a-kernel-cpu")\n'
    )
    with pytest.raises(ValueError, match="again"):
        collect_registrations(path)


@pytest.mark.parametrize("value", ["0", "-1", "float('nan')", "1e999"])
def test_est_time_must_be_positive_finite(tmp_path, value):
    path = tmp_path / "test_est.py"
    path.write_text(f'register_cpu_ci(est_time={value}, suite="stage-a-kernel-cpu")\n')
    with pytest.raises(ValueError, match="est_time"):
        collect_registrations(path)


def test_empty_disabled_reason_rejected(tmp_path):
    path = tmp_path / "test_dis.py"
    path.write_text('register_cpu_ci(1, "stage-a-kernel-cpu", disabled="")\n')
    with pytest.raises(ValueError, match="disabled"):
        collect_registrations(path)


def test_runtime_calls_are_noops():
    assert register_cuda_ci(est_time=30, suite="stage-b-kernel-unit-1-gpu-large") is None
    assert register_amd_ci(1, "x", True, "reason") is None
    assert register_cpu_ci(est_time=1.5, suite="stage-a-kernel-cpu") is None


def test_suites_defined_per_backend():
    assert set(BACKENDS) >= {"cuda", "amd", "cpu"}
    assert known_suites("cuda", nightly=False) == [
        "stage-b-kernel-benchmark-1-gpu-large",
        "stage-b-kernel-unit-1-gpu-large",
    ]
    assert known_suites("cuda", nightly=True) == ["nightly-kernel-1-gpu"]
    assert SUITES["amd"] == SUITES["cuda"]
    assert known_suites("cpu") == ["stage-a-kernel-cpu"]
    assert is_nightly_suite("cuda", "nightly-kernel-1-gpu") is True
    with pytest.raises(ValueError, match="known suites"):
        is_nightly_suite("cpu", "nope")
    with pytest.raises(ValueError, match="Unknown backend"):
        known_suites("tpu")


def test_this_file_is_registered():
    (reg,) = collect_registrations(__file__)
    assert (reg.backend, reg.suite, reg.nightly) == ("cpu", "stage-a-kernel-cpu", False)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))
