# Short device check after a register-budget change: build, test_norm, then quick timings.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD/python:/tmp/site PYTHONUNBUFFERED=1 SGLANG_JIT_CACHE_DIR=/tmp/c
T=python/sglang/jit_kernel/tests
python3 -m sglang.jit_kernel build --all -j 16 > $OUT/build.log 2>&1; tail -1 $OUT/build.log
timeout 150 python3 -m pytest -q -x -p no:cacheprovider $T/test_norm.py > $OUT/tests.log 2>&1; tail -1 $OUT/tests.log
timeout 60 python3 scripts/debug/norm_quick.py 2>&1 | grep -v Warn
