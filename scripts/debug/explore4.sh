# Session 4 call 5: fused add loading the weight after the residual add (fewer live registers), caps 4/5/6 CTAs.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD/python:/tmp/site PYTHONUNBUFFERED=1 SGLANG_JIT_CACHE_DIR=/tmp/c
timeout 400 python3 scripts/debug/variants.py base: wa4:-DNORM_FUSED_W_AFTER_ADD=1 wa5:-DNORM_FUSED_W_AFTER_ADD=1,-DNORM_MINB_FUSED=5 \
  wa6:-DNORM_FUSED_W_AFTER_ADD=1,-DNORM_MINB_FUSED=6 > $OUT/variants.log 2>&1
echo "variants rc=$?"
grep -v Warn $OUT/variants.log | grep -v "^qknorm\|^rmsnorm"
