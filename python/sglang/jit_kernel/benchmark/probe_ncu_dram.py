"""DRAM bytes, time and stall metrics of the large norm kernels under Nsight Compute, per variant.

    python python/sglang/jit_kernel/benchmark/probe_ncu_dram.py [SPEC ...]
    METRICS=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \\
        python python/sglang/jit_kernel/benchmark/probe_ncu_dram.py base: hinted:-DMY_SWITCH=1

SPEC: a variant of the bf16 norm module as in probe_variants.py (``name[@DIR]:flags``); none means
the package's build. The script builds every module first, then runs itself under
``ncu --clock-control none`` (``--launch``), which launches scale at 2^27 bf16 elements (the same
bytes as the rmsnorm case: a plain elementwise reference) and, per variant, rmsnorm [16384, 4096]
at the automatic geometry, at 256 x 2 with 2 CTAs per SM and at 256 x 2 one CTA per group, and the
fused add at the same size, each after one warm-up launch. It prints the ``case`` lines in
launch order and one line per profiled kernel with the metrics under short names (ns, rd, wr,
dram%, occ%, regs, l2hit%, stall ratios, ...). The kernels' minimum DRAM traffic: rmsnorm reads
128 MiB + the weight and writes 128 MiB (some of it may still be dirty in L2 at kernel end); what
the notes measured with it: docs/perf_notes.md (sessions 3 and 6). Needs ncu (the CUDA toolkit's
``bin/ncu``) and a GPU whose counters the user may read. Not a CI benchmark (no bench_ prefix).
"""

from __future__ import annotations

import collections
import csv
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import torch

DEFAULT_METRICS = {  # metric -> short name in the printed line
    "gpu__time_duration.sum": "ns",
    "dram__bytes_read.sum": "rd",
    "dram__bytes_write.sum": "wr",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram%",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occ%",
    "launch__grid_size": "grid",
    "launch__registers_per_thread": "regs",
    "lts__t_sectors_op_read.sum": "l2rd",
    "lts__t_sectors_op_write.sum": "l2wr",
    "lts__t_sector_op_read_hit_rate.pct": "l2hit%",
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio": "lsb",
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio": "bar",
    "smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio": "lgthr",
    "smsp__average_warps_issue_stalled_drain_per_issue_active.ratio": "drain",
    "smsp__average_warps_issue_stalled_membar_per_issue_active.ratio": "membar",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": "l1ld",
    "smsp__inst_executed.sum": "inst",
}
KERNELS = "regex:norm_rows|rmsnorm_kernel|scale"
#: rmsnorm geometries profiled per variant: (threads per row, vectors per thread, blocks_per_sm);
#: (0, 0, 0) is the automatic choice, bps > 0 a persistent grid, -1 one CTA per group.
GEOMETRIES = [(0, 0, 0), (256, 2, 2), (256, 2, -1)]
NCU_TIMEOUT_S = 400


def _modules(specs: list[str]) -> dict:
    """spec -> bf16 norm module; ``{"package": None}`` (the package's build) when no spec is given."""
    from sglang.jit_kernel.benchmark import probe_variants  # noqa: PLC0415

    if not specs:
        return {"package": None}
    with ThreadPoolExecutor(min(8, len(specs))) as pool:
        return dict(zip(specs, pool.map(probe_variants.build, specs)))


def launch(specs: list[str]) -> None:
    """The profiled process: each case once to warm up, then once to be profiled (one "case" line)."""
    import sglang.jit_kernel.norm as N  # noqa: PLC0415
    from sglang.jit_kernel.benchmark import probe_variants  # noqa: PLC0415
    from sglang.jit_kernel.scale import scale  # noqa: PLC0415

    dtype = torch.bfloat16
    x = torch.randn(16384, 4096, dtype=dtype, device="cuda")
    w = torch.rand(4096, dtype=dtype, device="cuda") + 0.5
    out = torch.empty_like(x)
    r = torch.randn_like(x)
    s = torch.randn(1 << 27, dtype=dtype, device="cuda")
    s_out = torch.empty_like(s)

    def twice(label: str, call) -> None:
        call()
        torch.cuda.synchronize()
        print("case", label, flush=True)
        call()
        torch.cuda.synchronize()

    twice("scale 2^27", lambda: scale(s, 2.0, out=s_out))
    for spec, module in _modules(specs).items():
        module = probe_variants.build("package:") if module is None else module
        probe_variants.use(module)
        if not hasattr(module, "_set_geometry_override"):  # the package's kernels: no hook, the default only
            twice(f"{spec} rmsnorm [16384, 4096]", lambda: N.rmsnorm(x, w, out=out))
        else:
            for geometry in GEOMETRIES:
                module._set_geometry_override(*geometry)
                twice(f"{spec} rmsnorm [16384, 4096] geometry {geometry}", lambda: N.rmsnorm(x, w, out=out))
            module._set_geometry_override(0, 0, 0)
        twice(f"{spec} fused_add_rmsnorm [16384, 4096]", lambda: N.fused_add_rmsnorm(x, r, w))


def _ncu() -> str:
    from sglang.jit_kernel._build import find_cuda_home  # noqa: PLC0415

    found = shutil.which("ncu")
    if found:
        return found
    candidate = find_cuda_home() / "bin" / "ncu"
    if candidate.exists():
        return str(candidate)
    raise SystemExit("probe_ncu_dram.py: ncu not found (PATH, then the CUDA toolkit's bin/)")


def summarize(stdout: str, short: dict[str, str]) -> list[str]:
    """The "case" lines and one line per profiled kernel from ncu's --csv output (rows whose
    field count differs from the header's, e.g. the program's own output, are skipped)."""
    lines = [line for line in stdout.splitlines() if line.startswith("case ")]
    rows = list(csv.reader(stdout.splitlines()))
    header_at = next((i for i, row in enumerate(rows) if row and row[0] == "ID"), None)
    if header_at is None:
        return lines + ["(no ncu metrics in the output)"]
    header = rows[header_at]
    i_id, i_kernel = header.index("ID"), header.index("Kernel Name")
    i_metric, i_value = header.index("Metric Name"), header.index("Metric Value")
    by_id: dict[str, dict[str, str]] = collections.OrderedDict()
    for row in rows[header_at + 1 :]:
        if len(row) == len(header):
            by_id.setdefault(row[i_id], {"kernel": row[i_kernel][:60]})[row[i_metric]] = row[i_value]
    for kid, values in by_id.items():
        fields = " ".join(f"{name}={values[m]}" for m, name in short.items() if m in values)
        lines.append(f"{kid} {values['kernel']} {fields}")
    return lines


def main() -> None:
    from sglang.jit_kernel.benchmark.utils import exit_unless_gpu  # noqa: PLC0415
    from sglang.jit_kernel.scale import _jit_scale_module  # noqa: PLC0415

    exit_unless_gpu("probe_ncu_dram.py")
    specs = [a for a in sys.argv[1:] if not a.startswith("--")]
    _modules(specs)  # compile outside the profiled process
    _jit_scale_module(torch.bfloat16)
    metrics = os.environ.get("METRICS")
    short = {m: DEFAULT_METRICS.get(m, m) for m in metrics.split(",")} if metrics else DEFAULT_METRICS
    command = [
        _ncu(),
        "--clock-control",
        "none",
        "-k",
        KERNELS,
        "--metrics",
        ",".join(short),
        "--csv",
        sys.executable,
        os.path.abspath(__file__),
        "--launch",
        *specs,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=NCU_TIMEOUT_S)
    print("\n".join(summarize(done.stdout, short)), flush=True)
    if done.returncode != 0:
        print(f"ncu exit code {done.returncode}; stderr tail:\n" + "\n".join(done.stderr.splitlines()[-5:]), flush=True)


if __name__ == "__main__":
    if "--launch" in sys.argv:
        launch([a for a in sys.argv[1:] if not a.startswith("--")])
    else:
        main()
