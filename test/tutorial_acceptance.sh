#!/usr/bin/env bash
# Acceptance test of the framework: the tutorial's four files, verbatim (test/tutorial_verbatim/, cut
# from the tutorial's code blocks), written at the tutorial's paths into a copy of this repository;
# then the tutorial's own commands. Needs a GPU (and triton for the benchmark).
# Usage: bash test/tutorial_acceptance.sh [workdir]
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-$(mktemp -d)}/repo"
rm -rf "$work" && mkdir -p "$work"
(cd "$repo" && tar --exclude=.venv --exclude=.git --exclude=.whl -cf - .) | (cd "$work" && tar -xf -)
src="$repo/test/tutorial_verbatim"
jk="$work/python/sglang/jit_kernel"
cp "$src/scale.cuh" "$jk/csrc/elementwise/scale.cuh"
cp "$src/scale.py" "$jk/scale.py"
cp "$src/test_scale.py" "$jk/tests/test_scale.py"
cp "$src/bench_scale.py" "$jk/benchmark/bench_scale.py"
export PYTHONPATH="$work/python${PYTHONPATH:+:$PYTHONPATH}"
echo "== tutorial step 4: run_suite (stage-b-kernel-unit-1-gpu-large) lists and runs test_scale.py"
(cd "$work/test" && python3 run_suite.py --hw cuda --suite stage-b-kernel-unit-1-gpu-large --list | grep test_scale.py)
(cd "$jk/tests" && python3 test_scale.py -q)
echo "== tutorial step 5: bench_scale.py prints its table"
python3 "$jk/benchmark/bench_scale.py"
echo "TUTORIAL ACCEPTANCE PASSED"
