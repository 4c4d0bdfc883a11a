"""Fixture: est_time is a name, not a literal."""
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

EST = 30
register_cuda_ci(est_time=EST, suite="stage-b-kernel-unit-1-gpu-large")
