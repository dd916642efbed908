#!/usr/bin/env python3
"""Which arithmetic PyTorch's fp32 "efficient" SDPA kernel runs on the H200 (issue 6's Exact
target): run it once after warm-up under Nsight Compute (`ncu --metrics
sm__inst_executed_pipe_tensor_op_hmma.sum,sm__sass_thread_inst_executed_op_ffma_pred_on.sum ...
python3 efficient_pipes.py`) and read the kernel's tensor-pipe and FFMA instruction counts.
Also prints the kernel names the profiler sees and the fp32 result's error against float64.
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

torch.backends.cuda.matmul.allow_tf32 = False  # as torch_peers.py: it does not change this kernel
torch.backends.cudnn.allow_tf32 = False
B, H, L, D = 1, 8, 1024, 128
torch.manual_seed(0)
q, k, v = (torch.randn(B, H, L, D, device="cuda") for _ in range(3))
with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
    for _ in range(3):
        out = F.scaled_dot_product_attention(q, k, v)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out = F.scaled_dot_product_attention(q, k, v)
        torch.cuda.synchronize()
names = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
print("kernels:", names)
print("allow_tf32 (matmul):", torch.backends.cuda.matmul.allow_tf32)
ref = torch.softmax((q.double() @ k.double().transpose(-1, -2)) * D ** -0.5, dim=-1) @ v.double()
err = (out.double() - ref).abs().max().item()
print(f"max abs error vs float64: {err:.3e} (fp32 rounding of |out| ~ 1: 6e-8; tf32 alone: ~1e-3)")
