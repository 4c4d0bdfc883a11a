#!/usr/bin/env bash
# Acceptance test of the framework: the tutorial's four files, verbatim (test/tutorial_verbatim/, cut
# from the tutorial's code blocks), written at the tutorial's paths into a copy of this repository;
# then the tutorial's own commands. Step 5 (the benchmark) needs a GPU and triton: without a visible
# GPU it is skipped with that reason (steps 1-4 still run: the GPU tests skip with theirs).
# Python: $PYTHON if set, else the active venv's python3, else the repository's .venv/bin/python, else
# python3 on PATH (it needs the package's dependencies: pip install -e ".[test,bench]").
# Usage: bash test/tutorial_acceptance.sh [workdir]
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
if [[ -n "${PYTHON:-}" ]]; then
  py="$PYTHON"
elif [[ -n "${VIRTUAL_ENV:-}" ]]; then
  py="$VIRTUAL_ENV/bin/python3"
elif [[ -x "$repo/.venv/bin/python" ]]; then
  py="$repo/.venv/bin/python"
else
  py=python3
fi
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
(cd "$work/test" && "$py" run_suite.py --hw cuda --suite stage-b-kernel-unit-1-gpu-large --list | grep test_scale.py)
(cd "$jk/tests" && "$py" test_scale.py -q)
echo "== tutorial step 5: bench_scale.py prints its table"
if ! "$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "step 5 skipped: no CUDA GPU is visible (the benchmark times kernels on one)"
  echo "TUTORIAL ACCEPTANCE PASSED (steps 1-4; step 5 needs a GPU)"
  exit 0
fi
"$py" "$jk/benchmark/bench_scale.py"
echo "TUTORIAL ACCEPTANCE PASSED"
