"""PyTorch's prefill replayed as a CUDA graph: the device's time of one call without the host's
enqueue (which an idle-stream event pair includes, and which a busy stream hides only while the
enqueue is shorter than the busy kernel). Medians of 20 replays after 5, CUDA events around each.
Usage: python3 torch_graph_prefill.py [--json out.json]"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right


def graph_ms(fn, reps=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    # (B, H, Lq, Lkv, D, causal); causal bottom-right aligned where Lq < Lkv (as lockstep's), the
    # FLOPs counted as lockstep-bench counts them.
    for B, H, S, Skv, D, causal in ((1, 6, 1500, 1500, 64, False), (4, 32, 4096, 4096, 128, False),
                                    (4, 32, 4096, 4096, 128, True), (16, 16, 1024, 1024, 64, True),
                                    (1, 6, 1500, 1500, 64, True), (1, 32, 512, 8192, 128, True)):
        pairs = S * Skv if not causal else S * S / 2 if S == Skv else S * (Skv - S) + S * (S + 1) / 2
        flops = 4 * B * H * pairs * D
        shape = f"B={B} H={H} L={S}" + (f" Lkv={Skv}" if Skv != S else "") + f" D={D}" + (" causal" if causal else "")
        q16 = torch.randn(B, H, S, D, device="cuda", dtype=torch.half)
        k16 = torch.randn(B, H, Skv, D, device="cuda", dtype=torch.half)
        v16 = torch.randn_like(k16)
        q32, k32, v32 = q16.float(), k16.float(), v16.float()
        qb, kb, vb = q16.bfloat16(), k16.bfloat16(), v16.bfloat16()
        kw = dict(is_causal=True) if causal and S == Skv else dict(attn_mask=causal_lower_right(S, Skv)) if causal else {}
        cases = (("fp16", "flash", SDPBackend.FLASH_ATTENTION,
                  lambda: F.scaled_dot_product_attention(q16, k16, v16, **kw)),
                 ("fp16", "cudnn", SDPBackend.CUDNN_ATTENTION,
                  lambda: F.scaled_dot_product_attention(q16, k16, v16, **kw)),
                 ("bf16", "flash", SDPBackend.FLASH_ATTENTION,
                  lambda: F.scaled_dot_product_attention(qb, kb, vb, **kw)),
                 ("bf16", "cudnn", SDPBackend.CUDNN_ATTENTION,
                  lambda: F.scaled_dot_product_attention(qb, kb, vb, **kw)),
                 ("fp32 in/out", "flash", SDPBackend.FLASH_ATTENTION,
                  lambda: F.scaled_dot_product_attention(q32.half(), k32.half(), v32.half(), **kw).float()),
                 ("fp32", "efficient", SDPBackend.EFFICIENT_ATTENTION,
                  lambda: F.scaled_dot_product_attention(q32, k32, v32, **kw)))
        for dtype, name, be, fn in cases:
            try:
                with sdpa_kernel(be):
                    ms = graph_ms(fn)
                rows.append(dict(op="prefill graph", dtype=dtype, backend=name, shape=shape, median_ms=ms,
                                 TFLOPs=flops / ms / 1e9))
            except Exception as e:  # noqa: BLE001
                rows.append(dict(op="prefill graph", dtype=dtype, backend=name, shape=shape, error=str(e)[:120]))
        del q16, k16, v16, q32, k32, v32, qb, kb, vb
        torch.cuda.empty_cache()
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    for r in rows:
        print(f"| {r['op']} | {r['dtype']} {r['backend']} | {r['shape']} | {r.get('median_ms', float('nan')):.4f} ms | "
              f"{r.get('TFLOPs', 0):.1f} TFLOP/s | {r.get('error', '')}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(torch=torch.__version__, device=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
