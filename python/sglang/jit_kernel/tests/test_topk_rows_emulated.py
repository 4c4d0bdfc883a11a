"""The lookahead kernel of topk_rows.cuh (the default) against the register-winner kernel, and the
specialised lookahead kernels (top-8 with the options fixed at compile time, the default where one
matches, SGLANG_MOE_TOPK_SPECIALISED=0 deselects them; and DeepSeek-V3's grouping, the default too,
SGLANG_MOE_TOPK_GROUPED_SPECIALISED=0 deselects it; all 52 fp32 instantiations reached, and the
launcher's choice of kernel checked, the switches' included) against the generic one,
bit for bit, with no GPU: the kernels and their launcher compiled for the host by the C++ compiler against
topk_rows_emulation/warp_emulation.h (one warp as 32 coroutines switched at every warp collective),
over softmax / sigmoid / grouped routing, bias, softcap, renormalize, topk 1..32, aligned and
misaligned strided rows and edge rows (NaN, +-inf, ties, -0, exp underflow). It checks the
selection logic and the order of the fp32 operations; the device's expf, tanhf and contractions are
the GPU tests' part (test_*_lookahead_variant_bit_exact, test_*_specialised_bit_exact)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from tvm_ffi import libinfo

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=60, suite="stage-a-kernel-cpu")

HERE = Path(__file__).resolve().parent
TOPK_ROWS = HERE.parent / "csrc" / "moe" / "topk_rows.cuh"
EMULATION = HERE / "topk_rows_emulation"
CXX = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")


def kernels_block(source: str) -> str:
    """The first ``namespace moe_routing { ... }`` of topk_rows.cuh: the kernels and launchers (the
    second block, unwrap_topk_rows, needs the tensor headers and is not compiled here)."""
    begin = source.index("namespace moe_routing {")
    end = source.index("}  // namespace moe_routing", begin) + len("}  // namespace moe_routing")
    return source[begin:end] + "\n"


@pytest.mark.skipif(CXX is None, reason="needs a C++ compiler (c++, g++ or $CXX)")
def test_lookahead_matches_default_bit_for_bit_emulated(tmp_path):
    (tmp_path / "topk_rows_kernels.inc").write_text(kernels_block(TOPK_ROWS.read_text()))
    binary = tmp_path / "lookahead_check"
    subprocess.run(
        [
            CXX,
            "-std=c++20",
            "-O1",
            f"-I{tmp_path}",
            f"-I{EMULATION}",
            f"-I{libinfo.find_dlpack_include_path()}",
            str(EMULATION / "lookahead_check.cpp"),
            "-o",
            str(binary),
        ],
        check=True,
    )
    result = subprocess.run([str(binary), "12"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and result.stdout.endswith(" 0 mismatches\n"), result.stdout[-4000:]
