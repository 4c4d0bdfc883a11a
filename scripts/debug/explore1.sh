# Session 4 exploration call: occupancy / persistence variants, warm load, eager host costs.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD/python:/tmp/site PYTHONUNBUFFERED=1 SGLANG_JIT_CACHE_DIR=/tmp/c
(python3 -m sglang.jit_kernel build --all -j 6 > $OUT/build.log 2>&1; echo "build rc=$?" >> $OUT/build.log) &
NP="-DNORM_NO_PERSIST=1,-DNORM_RMS_ONE_CTA=1"
timeout 420 python3 scripts/debug/variants.py base: np5:$NP np6:$NP,-DNORM_MINB_MID=6,-DNORM_MINB_BIG=4,-DNORM_MINB_FUSED=5 \
  np8:$NP,-DNORM_MINB_MID=8,-DNORM_MINB_BIG=4,-DNORM_MINB_FUSED=6 np8l:$NP,-DNORM_MINB_MID=8,-DNORM_MINB_BIG=4,-DNORM_MINB_FUSED=6,-DNORM_LATE_WEIGHT=1 \
  --sweep=np6 --sweep=np8 > $OUT/variants.log 2>&1
echo "variants rc=$?"
wait
tail -2 $OUT/build.log
timeout 60 python3 scripts/debug/eager_alloc.py > $OUT/eager.log 2>&1
timeout 100 python3 scripts/debug/warm_load.py 3 > $OUT/warm.log 2>&1
grep -v Warn $OUT/variants.log; cat $OUT/eager.log $OUT/warm.log | grep -v Warn
