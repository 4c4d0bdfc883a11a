# qknorm CTAs interleaved between q and k when the grid runs in waves: timings and test_norm at HEAD.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD/python:/tmp/site PYTHONUNBUFFERED=1 SGLANG_JIT_CACHE_DIR=/tmp/c
(python3 -m sglang.jit_kernel build --all -j 8 > $OUT/build.log 2>&1; echo "build rc=$?" >> $OUT/build.log) &
timeout 150 python3 scripts/debug/variants.py inter: > $OUT/variants.log 2>&1; echo "variants rc=$?"
wait; tail -1 $OUT/build.log
timeout 60 python3 -m pytest -q -x -p no:cacheprovider python/sglang/jit_kernel/tests/test_norm.py > $OUT/tests.log 2>&1; tail -1 $OUT/tests.log
timeout 40 python3 scripts/attack_inputs.py -j 8 > $OUT/attack.log 2>&1; tail -1 $OUT/attack.log
grep -v Warn $OUT/variants.log | grep -v "^fused\|^op "
