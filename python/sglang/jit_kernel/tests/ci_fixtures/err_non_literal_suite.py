"""Fixture: suite is an f-string."""
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

KIND = "unit"
register_cuda_ci(est_time=30, suite=f"stage-b-kernel-{KIND}-1-gpu-large")
