"""rmsnorm on cuda:1: which of (PDL on/off) x (current device 0/1) x (op) faults? One subprocess per case."""
import subprocess
import sys

CASE = r'''
import sys, torch
from sglang.jit_kernel.norm import rmsnorm, fused_inplace_qknorm
current, pdl, op = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3]
torch.cuda.set_device(current)
x = torch.randn(129, 4096, device="cuda:1").to(torch.bfloat16)
w = (torch.rand(4096, device="cuda:1") + 0.5).to(torch.bfloat16)
ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(torch.bfloat16)
torch.cuda.synchronize(1)
if op == "rmsnorm":
    out = rmsnorm(x, w, enable_pdl=pdl)
else:
    out = x.view(129, 32, 128).clone(); k = out[:, :8].clone()
    fused_inplace_qknorm(out, k, w[:128].contiguous(), w[:128].contiguous())
    ref = None
torch.cuda.synchronize(1)
err = "n/a" if ref is None else f"{(out.float() - ref.float()).abs().max().item():.3g}"
print("OK max err", err)
'''

if len(sys.argv) == 4:  # one case inline (for compute-sanitizer)
    exec(CASE)
    sys.exit(0)
for op in ("rmsnorm", "qknorm"):
    for current in (0, 1):
        for pdl in ("0", "1"):
            p = subprocess.run([sys.executable, "-c", CASE, str(current), pdl, op], capture_output=True, text=True, timeout=120)
            last = (p.stdout.strip().splitlines() or [""])[-1] if p.returncode == 0 else (p.stderr.strip().splitlines() or ["?"])[-1]
            print(f"op={op} current=cuda:{current} pdl={pdl}: rc={p.returncode} {last[:160]}", flush=True)
