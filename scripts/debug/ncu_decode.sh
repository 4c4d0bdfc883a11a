python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD/python:/tmp/site PYTHONUNBUFFERED=1 SGLANG_JIT_CACHE_DIR=/tmp/c
python3 -m sglang.jit_kernel build rmsnorm scale -j 16 > $OUT/build.log 2>&1
timeout 200 ncu --clock-control none --cache-control none --section WarpStateStats --section SchedulerStats --section LaunchStats --metrics gpu__time_duration.sum,smsp__inst_executed.sum,sm__cycles_active.max python3 scripts/debug/kernel_probe.py --decode > $OUT/ncu_decode.txt 2>&1
grep -E "norm_rows_kernel|scale_kernel|vectorized_elementwise|gpu__time_duration|inst_executed|cycles_active|Stall|Warp Cycles Per|Registers|Block Size|Grid Size" $OUT/ncu_decode.txt | head -150
