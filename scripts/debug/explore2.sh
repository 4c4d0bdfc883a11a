# Session 4 call 2: decode variants (early PDL trigger, smem second-level sum) on the one-CTA-per-group
# launch policy, the decode floor probes, and test_norm at HEAD.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD/python:/tmp/site PYTHONUNBUFFERED=1 SGLANG_JIT_CACHE_DIR=/tmp/c
T=python/sglang/jit_kernel/tests

timeout 400 python3 scripts/debug/variants.py base: wt:-DNORM_EARLY_TRIGGER=2 tree:-DNORM_SMEM_SUM=2 wttree:-DNORM_EARLY_TRIGGER=2,-DNORM_SMEM_SUM=2 \
  --sweep=wttree > $OUT/variants.log 2>&1
echo "variants rc=$?"


timeout 60 python3 scripts/debug/pdl_floor.py > $OUT/floor.log 2>&1

grep -v Warn $OUT/variants.log; grep -v Warn $OUT/floor.log
