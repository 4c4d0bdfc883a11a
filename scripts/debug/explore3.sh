# Session 4 call 4: HEAD (trigger after wait, tree sum) vs qknorm 128-thread groups and the fused
# add storing its residual after the reduction; test_norm at HEAD.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD/python:/tmp/site PYTHONUNBUFFERED=1 SGLANG_JIT_CACHE_DIR=/tmp/c
T=python/sglang/jit_kernel/tests
(python3 -m sglang.jit_kernel build --all -j 8 > $OUT/build.log 2>&1; echo "build rc=$?" >> $OUT/build.log) &
timeout 400 python3 scripts/debug/variants.py base: qk128:-DNORM_GROUP_THREADS=128 fls:-DNORM_FUSED_LATE_STORE=1 > $OUT/variants.log 2>&1
echo "variants rc=$?"
wait; tail -1 $OUT/build.log
timeout 200 python3 -m pytest -q -x -p no:cacheprovider $T/test_norm.py > $OUT/tests.log 2>&1; tail -1 $OUT/tests.log
grep -v Warn $OUT/variants.log
