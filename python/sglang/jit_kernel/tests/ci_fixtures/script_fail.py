"""Fixture for runner tests: exits 3."""
import sys

from sglang.test.ci.ci_register import register_cpu_ci  # noqa: F401

register_cpu_ci(est_time=1, suite="stage-a-kernel-cpu")

if __name__ == "__main__":
    print("failing on purpose")
    sys.exit(3)
