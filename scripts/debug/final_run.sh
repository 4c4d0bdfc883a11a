# One verification call on the device: tests of the touched ops, attack, check, tutorial, bench_norm.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD/python:/tmp/site PYTHONUNBUFFERED=1 SGLANG_JIT_CACHE_DIR=/tmp/c
T=python/sglang/jit_kernel/tests
python3 -m sglang.jit_kernel build --all -j 16 > $OUT/build.log 2>&1; tail -1 $OUT/build.log
timeout 240 python3 -m pytest -q -rs -p no:cacheprovider $T/test_norm.py $T/test_scale.py $T/test_add_constant.py > $OUT/tests.log 2>&1; tail -3 $OUT/tests.log
timeout 60 python3 scripts/attack_inputs.py -j 8 > $OUT/attack.log 2>&1; grep -A5 "FAILED cases" $OUT/attack.log; tail -1 $OUT/attack.log
timeout 60 python3 -m sglang.jit_kernel check > $OUT/check.log 2>&1; cat $OUT/check.log
timeout 90 bash test/tutorial_acceptance.sh /tmp/tut > $OUT/tutorial.log 2>&1; echo "tutorial rc=$?"; tail -4 $OUT/tutorial.log
timeout 220 python3 python/sglang/jit_kernel/benchmark/bench_norm.py > $OUT/bench_norm.log 2>&1; echo "bench_norm rc=$?"; cat $OUT/bench_norm.log | grep -v Warn
