# DRAM bytes and time of rmsnorm / fused add [16384, 4096] per variant under ncu (cold caches):
# bash scripts/debug/ncu_dram.sh base: el:-DNORM_LOAD_POLICY=1 (device; variant specs as in variants.py)
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD/python:/tmp/site PYTHONUNBUFFERED=1 SGLANG_JIT_CACHE_DIR=/tmp/c
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
timeout 300 ncu --clock-control none -k regex:"norm_rows|scale" --metrics $M --csv python3 scripts/debug/big_probe.py "$@" > $OUT/ncu_dram.csv 2> $OUT/ncu_dram.err
python3 - <<'PY'
import csv, os, collections
rows = list(csv.reader(open(os.environ["OUT"] + "/ncu_dram.csv")))
hdr = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
h = rows[hdr]; data = rows[hdr + 1:]
iid, ik, im, iv = h.index("ID"), h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value")
by = collections.OrderedDict()
for r in data:
    if len(r) != len(h): continue
    by.setdefault(r[iid], {"k": r[ik][:70]})[r[im]] = r[iv]
for i, d in by.items():
    print(i, d["k"], "ns", d.get("gpu__time_duration.sum"), "rd", d.get("dram__bytes_read.sum"), "wr", d.get("dram__bytes_write.sum"))
PY
grep "^case" $OUT/ncu_dram.csv; tail -3 $OUT/ncu_dram.err
