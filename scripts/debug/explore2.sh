# Session 4 call 2: decode variants (early PDL trigger, smem second-level sum) on the one-CTA-per-group
# launch policy, the decode floor probes, and test_norm at HEAD.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD/python:/tmp/site PYTHONUNBUFFERED=1 SGLANG_JIT_CACHE_DIR=/tmp/c
T=python/sglang/jit_kernel/tests
(python3 -m sglang.jit_kernel build --all -j 8 > $OUT/build.log 2>&1; echo "build rc=$?" >> $OUT/build.log) &
timeout 400 python3 scripts/debug/variants.py base: et:-DNORM_EARLY_TRIGGER=1 ss:-DNORM_SMEM_SUM=1 etss:-DNORM_EARLY_TRIGGER=1,-DNORM_SMEM_SUM=1 \
  --sweep=etss > $OUT/variants.log 2>&1
echo "variants rc=$?"
wait
tail -2 $OUT/build.log
timeout 60 python3 scripts/debug/pdl_floor.py > $OUT/floor.log 2>&1
timeout 200 python3 -m pytest -q -x -p no:cacheprovider $T/test_norm.py > $OUT/tests.log 2>&1; tail -3 $OUT/tests.log
grep -v Warn $OUT/variants.log; grep -v Warn $OUT/floor.log
