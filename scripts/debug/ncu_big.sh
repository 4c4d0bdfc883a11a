# ncu metrics of the large rmsnorm kernels per variant vs scale at the same bytes (device).
# METRICS=a,b,... replaces the metric list, e.g. DRAM bytes only:
#   METRICS=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum bash scripts/debug/ncu_big.sh base: el:...
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD/python:/tmp/site PYTHONUNBUFFERED=1 SGLANG_JIT_CACHE_DIR=/tmp/c
python3 -c "
import sys; sys.path.insert(0,'scripts/debug'); import variants
from concurrent.futures import ThreadPoolExecutor
with ThreadPoolExecutor(8) as p: list(p.map(variants.build, sys.argv[1:]))
import sglang.jit_kernel.scale as s, torch; s.scale(torch.ones(8, device='cuda'), 2.0)
" "$@" > $OUT/build.log 2>&1
M=${METRICS:-gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__registers_per_thread,lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum,lts__t_sector_op_read_hit_rate.pct,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_drain_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,smsp__inst_executed.sum}
timeout 400 ncu --clock-control none -k regex:"norm_rows|scale" --metrics $M --csv python3 scripts/debug/big_probe.py "$@" > $OUT/ncu.csv 2> $OUT/ncu.err
python3 - <<'PY'
import csv, os, collections
rows = list(csv.reader(open(os.environ["OUT"] + "/ncu.csv")))
hdr = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
h = rows[hdr]; data = rows[hdr + 1:]
iid, ik, im, iv = h.index("ID"), h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value")
by = collections.OrderedDict()
for r in data:
    if len(r) != len(h): continue
    by.setdefault(r[iid], {"k": r[ik][:60]})[r[im]] = r[iv]
short = {"gpu__time_duration.sum": "ns", "dram__bytes_read.sum": "rd", "dram__bytes_write.sum": "wr", "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram%", "sm__warps_active.avg.pct_of_peak_sustained_active": "occ%", "launch__grid_size": "grid", "launch__registers_per_thread": "regs", "lts__t_sector_op_read_hit_rate.pct": "l2hit%", "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio": "lsb", "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio": "bar", "smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio": "lgthr", "smsp__average_warps_issue_stalled_drain_per_issue_active.ratio": "drain", "lts__t_sectors_op_read.sum": "l2rd", "lts__t_sectors_op_write.sum": "l2wr", "smsp__inst_executed.sum": "inst"}
for i, d in by.items():
    print(i, d["k"], " ".join(f"{v}={d[k]}" for k, v in short.items() if k in d))
PY
grep "^case" $OUT/ncu.csv | head -40; tail -3 $OUT/ncu.err
