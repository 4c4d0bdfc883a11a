"""Fixture: est_time missing."""
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cuda_ci(suite="stage-b-kernel-unit-1-gpu-large")
