python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD/python:/tmp/site PYTHONUNBUFFERED=1 SGLANG_JIT_CACHE_DIR=/tmp/c
python3 scripts/debug/decode_probe.py "$1" > $OUT/warm.log 2>&1
timeout 200 ncu --clock-control none --cache-control none -k regex:"norm_rows|floor" --launch-skip 3 --metrics gpu__time_duration.sum,sm__cycles_active.max,smsp__inst_executed.sum,smsp__cycles_active.max --section SourceCounters --section WarpStateStats --warp-sampling-interval 0 -o $OUT/dec python3 scripts/debug/decode_probe.py "$1" > $OUT/ncu.log 2>&1
ncu -i $OUT/dec.ncu-rep --page details --csv 2>/dev/null | grep -E "gpu__time_duration|sm__cycles_active|inst_executed|Duration|Stall|Warp Cycles" | cut -c1-250 | head -60
ncu -i $OUT/dec.ncu-rep --page source --csv --print-source sass --kernel-name regex:norm_rows --launch-count 1 > $OUT/sass.csv 2>&1; head -c 600 $OUT/sass.csv; wc -l $OUT/sass.csv
