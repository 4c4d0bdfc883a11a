#!/usr/bin/env bash
# One device session: build, tests, main job, benchmarks, tutorial acceptance; logs under $OUT.
# Usage (on the GPU machine, from the repo root, with the tvm-ffi wheel in .whl/):
#   [TEST_FILES="a.py b.py"] [BENCH_FILES=...] bash scripts/gpu_run.sh [stages...]
#   stages: build tests check bench tutorial cache (default: all)
set -uo pipefail
OUT="${OUT:-/tmp/gpu_out}"; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="$PWD/python:/tmp/site"
else
  export PYTHONPATH="$PWD/python"
fi
export PYTHONUNBUFFERED=1 SGLANG_JIT_CACHE_DIR="${SGLANG_JIT_CACHE_DIR:-/tmp/sgl_jit_cache}"
stages="${*:-build tests check bench tutorial cache}"
nvidia-smi -L
status=0
run() { local name=$1; shift; echo "===== $name: $*"; local t0=$SECONDS; "$@" 2>&1 | tee "$OUT/$name.log"; local rc=${PIPESTATUS[0]}; echo "===== $name rc=$rc $((SECONDS - t0)) s"; [ "$rc" = 0 ] || status=1; }
T=python/sglang/jit_kernel/tests
B=python/sglang/jit_kernel/benchmark
for s in $stages; do case $s in
  build) run build python3 -m sglang.jit_kernel build --all -j 16 ;;
  tests) run tests python3 -m pytest -q -rs -p no:cacheprovider ${TEST_FILES:-$T} ;;
  check) run check python3 -m sglang.jit_kernel check ;;
  bench) for f in ${BENCH_FILES:-$B/bench_*.py}; do [ "$(basename $f)" = bench_jit_cache.py ] || run "$(basename $f .py)" python3 $f; done ;;
  cache) [ -f $B/bench_jit_cache.py ] && run bench_jit_cache python3 $B/bench_jit_cache.py ;;
  tutorial) run tutorial bash test/tutorial_acceptance.sh /tmp/tut ;;
  *) echo "unknown stage $s"; status=1 ;;
esac; done
exit $status
