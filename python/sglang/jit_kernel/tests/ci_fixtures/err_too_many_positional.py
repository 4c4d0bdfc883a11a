"""Fixture: five positional arguments."""
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cuda_ci(30, "stage-b-kernel-unit-1-gpu-large", False, None, "extra")
