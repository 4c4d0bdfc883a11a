"""Fixture: starred positional arguments."""
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

ARGS = (30, "stage-b-kernel-unit-1-gpu-large")
register_cuda_ci(*ARGS)
