"""Fixture: calls only in nested scopes or via attributes -> no registration."""
import sglang.test.ci.ci_register as ci
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

ci.register_cuda_ci(est_time=30, suite="stage-b-kernel-unit-1-gpu-large")


def helper():
    register_cuda_ci(est_time=30, suite="stage-b-kernel-unit-1-gpu-large")


class Holder:
    register_cpu_ci(est_time=1, suite="stage-a-kernel-cpu")


if __name__ == "__main__":
    register_cpu_ci(est_time=1, suite="stage-a-kernel-cpu")
