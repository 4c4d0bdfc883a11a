"""Fixture: **kwargs."""
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

KW = {"est_time": 30, "suite": "stage-b-kernel-unit-1-gpu-large"}
register_cuda_ci(**KW)
