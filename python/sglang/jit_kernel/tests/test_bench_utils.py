"""Tests for the benchmark helpers' timing policy (no GPU needed: the graph timer is replaced)."""

import pytest

from sglang.jit_kernel.benchmark import utils
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="stage-a-kernel-cpu")


def fake_timer(monkeypatch, pass_ms):
    """Replaces the CUDA-graph timer: each capture returns the next (p50, p20, p80) of ``pass_ms``
    (milliseconds per pass over the input sets) and runs one pass, so calls are counted."""
    results = iter(pass_ms)
    captures = []

    def timer(one_pass, rep_ms):
        one_pass()
        captures.append(rep_ms)
        return next(results)

    monkeypatch.setattr(utils, "_do_bench_cudagraph", timer)
    return captures


def per_call_captures(per_call_us, sets):
    """(p50, p20, p80) per pass in ms for captures whose per-call medians are ``per_call_us``."""
    return [(sets * t / 1000, sets * (t - 0.01) / 1000, sets * (t + 0.01) / 1000) for t in per_call_us]


def test_short_calls_report_the_middle_capture(monkeypatch):
    # Four sets per pass; per-call medians all distinct, the middle one neither first, last, min nor max.
    captures = fake_timer(monkeypatch, per_call_captures([1.05, 0.97, 1.01, 0.99, 1.03], 4))
    calls = []
    median, p80, p20 = utils.bench_rotating(lambda a: calls.append(a), [(i,) for i in range(4)])
    assert len(captures) == utils.SHORT_CALL_CAPTURES
    assert calls == [0, 1, 2, 3] * utils.SHORT_CALL_CAPTURES  # every capture replays every set in order
    assert median == pytest.approx(1.01)
    assert p20 == pytest.approx(1.00) and p80 == pytest.approx(1.02)


def test_long_calls_take_one_capture(monkeypatch):
    captures = fake_timer(monkeypatch, [(0.128, 0.127, 0.129)])  # 64 us per call over two sets
    median, p80, p20 = utils.bench_rotating(lambda a: None, [(0,), (1,)])
    assert len(captures) == 1
    assert (median, p80, p20) == pytest.approx((64.0, 64.5, 63.5))


def test_threshold_is_exclusive(monkeypatch):
    captures = fake_timer(monkeypatch, per_call_captures([utils.SHORT_CALL_US], 2))
    utils.bench_rotating(lambda a: None, [(0,), (1,)])
    assert len(captures) == 1


def test_forced_capture_count(monkeypatch):
    captures = fake_timer(monkeypatch, per_call_captures([1.2, 1.0, 1.1], 2))
    median, _, _ = utils.bench_rotating(lambda a: None, [(0,), (1,)], captures=3)
    assert len(captures) == 3 and median == pytest.approx(1.1)
    captures = fake_timer(monkeypatch, per_call_captures([1.0], 2))
    assert utils.bench_rotating(lambda a: None, [(0,), (1,)], captures=1)[0] == pytest.approx(1.0)
    assert len(captures) == 1
    with pytest.raises(ValueError, match="captures must be >= 1"):
        utils.bench_rotating(lambda a: None, [(0,)], captures=0)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))
