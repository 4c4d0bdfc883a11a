"""Quick timings of the norm ops at the issue's sizes with the package's own build (automatic
geometry, cold L2 / decode hot): the table of variants.py without building a variant."""

import sys

sys.path.insert(0, "scripts/debug")
import variants  # noqa: E402

from sglang.jit_kernel.benchmark.utils import copy_roof_gbps, format_rows  # noqa: E402


def main():
    roof = copy_roof_gbps()
    print(format_rows(variants.measure(None, sweep=False), roof))


if __name__ == "__main__":
    main()
