"""Host-side header checks that need a C++ compiler but no GPU: TensorMatcher messages and the
aliasing checks of include/sgl_kernel/tensor.h, called with CPU tensors through a g++-built module."""

from pathlib import Path

import pytest
import torch

from sglang.jit_kernel.testing import requires_nvcc
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=40, suite="stage-a-kernel-cpu")

PROBE = Path(__file__).resolve().parent / "header_smoke" / "host_probe.h"


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    from sglang.jit_kernel.utils import load_jit

    names = ["probe_partial_overlap", "probe_self_overlap", "probe_match_rows"]
    return load_jit(
        "header_host_probe",
        cpp_files=[str(PROBE)],
        cpp_wrappers=[(n, n) for n in names],
        build_directory=str(tmp_path_factory.mktemp("jit")),
    )


@requires_nvcc
def test_partial_overlap(probe):
    x = torch.zeros(100, dtype=torch.bfloat16)
    probe.probe_partial_overlap(x, x, True)  # in place: the same view
    probe.probe_partial_overlap(x[:50], x[50:], False)  # adjacent halves: disjoint
    probe.probe_partial_overlap(x[:0], x, False)  # empty overlaps nothing
    with pytest.raises(RuntimeError, match=r"a overlaps b in memory \(partially\)"):
        probe.probe_partial_overlap(x[1:], x[:-1], True)
    with pytest.raises(RuntimeError, match=r"a overlaps b in memory \(the same tensor\); they must be disjoint"):
        probe.probe_partial_overlap(x, x, False)
    rows = torch.zeros(8, 16, dtype=torch.float32)
    with pytest.raises(RuntimeError, match="partially"):
        probe.probe_partial_overlap(rows[1:], rows[:-1], True)


@requires_nvcc
def test_interleaved_views_are_not_overlap(probe):
    """q and k as views of one fused qkv buffer interleave but share no element."""
    qkv = torch.zeros(4, 48, 128, dtype=torch.bfloat16)
    q, k = qkv[:, :32], qkv[:, 32:40]
    probe.probe_partial_overlap(k, q, False)
    with pytest.raises(RuntimeError, match="the same tensor"):
        probe.probe_partial_overlap(q, q, False)


@requires_nvcc
def test_self_overlap(probe):
    probe.probe_self_overlap(torch.zeros(4, 8))
    probe.probe_self_overlap(torch.zeros(1, 8).expand(1, 8))  # size-1 dim: no aliasing
    with pytest.raises(RuntimeError, match=r"t: dim 0 has stride 0 with size 4"):
        probe.probe_self_overlap(torch.zeros(1, 8).expand(4, 8))


@requires_nvcc
def test_tensor_matcher_messages(probe):
    x, w = torch.zeros(3, 5), torch.zeros(5)
    assert probe.probe_match_rows(x, w) == 15
    with pytest.raises(RuntimeError, match=r"w: dim 0 \(hidden_size\) expected 5, got 4 .*\[at .*host_probe.h:\d+\]"):
        probe.probe_match_rows(x, torch.zeros(4))
    with pytest.raises(RuntimeError, match=r"x: dtype expected .*float32.*, got float64"):
        probe.probe_match_rows(x.double(), w)
    with pytest.raises(RuntimeError, match=r"x: ndim expected 2, got 1"):
        probe.probe_match_rows(w, w)
    with pytest.raises(RuntimeError, match=r"x: expected contiguous strides"):
        probe.probe_match_rows(torch.zeros(5, 3).t(), w)


@requires_nvcc
def test_header_smoke_and_tutorial_kernel_compile_for_sm90(tmp_path, monkeypatch):
    """Every header and template (fp16/bf16/fp32), plus the tutorial's Step 1 scale.cuh verbatim,
    compile for sm_90 through load_jit and the module loads (no GPU needed)."""
    from sglang.jit_kernel.utils import load_jit

    monkeypatch.setenv("SGLANG_JIT_CUDA_ARCH", "9.0")
    smoke = Path(__file__).resolve().parent / "header_smoke" / "smoke.cu"
    module = load_jit("header_smoke", cuda_files=[str(smoke)], build_directory=str(tmp_path / "jit"))
    assert module is not None


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v", "-s"]))
