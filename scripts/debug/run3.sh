python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD/python:/tmp/site PYTHONUNBUFFERED=1 SGLANG_JIT_CACHE_DIR=/tmp/c
timeout 120 python3 scripts/debug/pdl_floor.py 2>&1 | grep -v Warn | tee $OUT/floor.log
timeout 400 python3 scripts/debug/variants.py "$@" 2>&1 | grep -v Warn | tee $OUT/variants.log
