"""Fixture: est_time given positionally and by keyword."""
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cuda_ci(30, est_time=30, suite="stage-b-kernel-unit-1-gpu-large")
