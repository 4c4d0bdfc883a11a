"""Fixture for runner tests: sleeps far longer than the runner's timeout."""
import os
import subprocess
import sys
import time

from sglang.test.ci.ci_register import register_cpu_ci  # noqa: F401

register_cpu_ci(est_time=1, suite="stage-a-kernel-cpu")

if __name__ == "__main__":
    # A grandchild in the same process group must be killed as well.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    pid_file = os.environ.get("CI_FIXTURE_HANG_PID_FILE")
    if pid_file:
        with open(pid_file, "w") as f:
            f.write(str(child.pid))
    print("hanging on purpose", flush=True)
    time.sleep(600)
