"""Does TVM-FFI hand launchers torch's current stream of the tensor's device? (needs 1-2 GPUs)"""
from pathlib import Path

import torch

from sglang.jit_kernel.utils import load_jit

m = load_jit("env_stream_probe", cuda_files=[str(Path(__file__).with_name("env_stream.cuh"))],
             cuda_wrappers=[("env_stream", "env_stream")])
torch.cuda.set_device(0)
for dev in range(torch.cuda.device_count()):
    t = torch.empty(4, device=f"cuda:{dev}")
    print(f"cuda:{dev} (current 0): ffi {m.env_stream(t):#x} torch {torch.cuda.current_stream(dev).cuda_stream:#x}")
    s = torch.cuda.Stream(device=dev)
    with torch.cuda.stream(s):
        print(f"cuda:{dev} side stream: ffi {m.env_stream(t):#x} torch {torch.cuda.current_stream(dev).cuda_stream:#x} side {s.cuda_stream:#x}")
