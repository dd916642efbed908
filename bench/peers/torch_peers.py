#!/usr/bin/env python3
"""PyTorch figures measured side by side with lockstep-bench on the same GPU, in the same call.

Decode (one query token per sequence against its KV cache) in fp32 as PyTorch does it (there is
no fp32 GQA SDPA kernel: matmul-softmax-matmul, grouped so that K and V are read once), and fp16
and bf16 flash / cuDNN / efficient SDPA with K and V read once for reference; multi-head attention with the math backend in fp32; prefill
with the flash (FA2), cuDNN and efficient backends. Median of CUDA-event timings after warm-up.
"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def median_ms(fn, warmup=5, reps=20, busy=False):
    """busy: keep the stream busy (torch.cuda._sleep, about 40 us) when the start event is
    recorded, so that the host's enqueue of fn is not timed (as lockstep-bench's busy_ms)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if busy:
            torch.cuda._sleep(80000)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def decode(rows, B, H, Hkv, D, L):
    g = H // Hkv
    dev = "cuda"
    q = torch.randn(B, Hkv, g, D, device=dev)
    k = torch.randn(B, Hkv, L, D, device=dev)
    v = torch.randn(B, Hkv, L, D, device=dev)
    scale = D ** -0.5

    def naive():
        s = torch.matmul(q, k.transpose(-1, -2)) * scale
        return torch.matmul(torch.softmax(s, dim=-1), v)

    nbytes = (2 * B * Hkv * L * D + 2 * B * H * D) * 4
    ms = median_ms(naive, busy=True)
    rows.append(dict(op="decode", dtype="fp32", backend="matmul-softmax-matmul (grouped)",
                     shape=f"B={B} H={H} Hkv={Hkv} D={D} L={L}", median_ms=ms,
                     GBps=nbytes / ms / 1e6, idle_stream_ms=median_ms(naive)))
    # fp16 and bf16 SDPA with K and V read once: each kv head's g query heads are g rows of one
    # query against that head's K and V ([B, Hkv, g, D] x [B, Hkv, L, D]), as a GQA decode kernel
    # reads them. (Repeating K and V per query head would read g times the bytes.)
    shape = f"B={B} H={H} Hkv={Hkv} D={D} L={L}"
    nbytes16 = (2 * B * Hkv * L * D + 2 * B * H * D) * 2
    for dtype, tdtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        qh, kh, vh = q.to(tdtype), k.to(tdtype), v.to(tdtype)
        for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                         ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
            try:
                with sdpa_kernel(be):
                    fn = lambda: F.scaled_dot_product_attention(qh, kh, vh)
                    ms = median_ms(fn, busy=True)
                    idle = median_ms(fn)
                rows.append(dict(op="decode", dtype=dtype, backend=name, shape=shape, median_ms=ms,
                                 GBps=nbytes16 / ms / 1e6, idle_stream_ms=idle, kv_read_once=True))
            except Exception as e:  # noqa: BLE001
                rows.append(dict(op="decode", dtype=dtype, backend=name, shape=shape, error=str(e)[:120]))
        del qh, kh, vh
    del q, k, v
    torch.cuda.empty_cache()


def mha_math(rows, B, S, H, D, causal=False):
    q = torch.randn(B, H, S, D, device="cuda")
    k = torch.randn(B, H, S, D, device="cuda")
    v = torch.randn(B, H, S, D, device="cuda")
    flops = 4 * B * H * S * S * D / (2 if causal else 1)
    for name, be in (("math", SDPBackend.MATH), ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        with sdpa_kernel(be):
            ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
        rows.append(dict(op="multihead", dtype="fp32", backend=name,
                         shape=f"B={B} S={S} H={H} D={D}" + (" causal" if causal else ""),
                         median_ms=ms, TFLOPs=flops / ms / 1e9))
    del q, k, v
    torch.cuda.empty_cache()


def prefill(rows, B, H, S, D, causal):
    """median_ms: an idle stream when the start event is recorded, so the host's enqueue is timed
    (as lockstep-bench's attention_fused figures, which include lockstep's own enqueue);
    busy_ms: the stream kept busy, the device's time alone."""
    flops = 4 * B * H * S * S * D / (2 if causal else 1)
    shape = f"B={B} H={H} L={S} D={D}" + (" causal" if causal else "")
    q16 = torch.randn(B, H, S, D, device="cuda", dtype=torch.half)
    k16, v16 = torch.randn_like(q16), torch.randn_like(q16)
    q32, k32, v32 = q16.float(), k16.float(), v16.float()

    def timed(dtype, name, be, fn):
        try:
            with sdpa_kernel(be):
                ms, busy = median_ms(fn), median_ms(fn, busy=True)
            rows.append(dict(op="prefill", dtype=dtype, backend=name, shape=shape, median_ms=ms,
                             TFLOPs=flops / ms / 1e9, busy_ms=busy))
        except Exception as e:  # noqa: BLE001
            rows.append(dict(op="prefill", dtype=dtype, backend=name, shape=shape, error=str(e)[:120]))

    for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        timed("fp16", name, be, lambda: F.scaled_dot_product_attention(q16, k16, v16, is_causal=causal))
    # FA2 given what lockstep is given: fp32 Q, K, V rounded to fp16 in the timed call, an fp32
    # output (lockstep's TensorCore call rounds K and V itself and writes fp32). Five calls from
    # Python: at small shapes the idle-stream figure is mostly their enqueue (busy_ms is not).
    timed("fp32 in/out", "flash", SDPBackend.FLASH_ATTENTION,
          lambda: F.scaled_dot_product_attention(q32.half(), k32.half(), v32.half(), is_causal=causal).float())
    timed("fp32", "efficient", SDPBackend.EFFICIENT_ATTENTION,
          lambda: F.scaled_dot_product_attention(q32, k32, v32, is_causal=causal))
    del q16, k16, v16, q32, k32, v32
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--prefill", action="store_true")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rows = []
    for shp in ((1, 6, 6, 64, 448), (1, 32, 8, 128, 32768), (32, 32, 8, 128, 4096),
                (128, 32, 8, 128, 2048), (32, 32, 32, 128, 2048)):
        decode(rows, *shp)
    mha_math(rows, 1, 1500, 6, 64)
    mha_math(rows, 4, 1024, 32, 128)
    if args.prefill:
        for shp in ((1, 6, 1500, 64, False), (4, 32, 4096, 128, False), (4, 32, 4096, 128, True),
                    (16, 16, 1024, 64, True)):
            prefill(rows, *shp)
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    for r in rows:
        fig = r.get("GBps") and f"{r['GBps']:.1f} GB/s" or (r.get("TFLOPs") and f"{r['TFLOPs']:.1f} TFLOP/s") or r.get("error", "")
        print(f"| {r['op']} | {r['dtype']} {r['backend']} | {r['shape']} | {r.get('median_ms', float('nan')):.4f} ms | {fig} |"
              + (f" idle stream {r['idle_stream_ms']:.4f} ms |" if 'idle_stream_ms' in r else "")
              + (f" busy stream {r['busy_ms']:.4f} ms |" if 'busy_ms' in r else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(torch=torch.__version__, device=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
