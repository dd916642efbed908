#!/usr/bin/env python3
"""Turns the JSON of one benchmark call into the entries of bench/results/<card>.json.

Usage: results.py --bench B.json [B.json ...] [--peers P.json ...] --commit C
                  [--date YYYY-MM-DD] [--command CMD] [--merge-dir DIR] --out DIR

--bench: lockstep-bench --json files of one device, one per round (the figure is the median
over the rounds; ratio_range is the lowest and highest round). --peers: bench/peers JSON of the
same call (torch_peers.py, torch_graph_prefill.py). --merge-dir: a folder of results files
(bench/results): the card's file there is read and every entry this call measured again is
replaced, the others are kept. Writes DIR/<card>.json and prints its path. The schema is
bench/results/README.md's.
"""
import argparse
import datetime
import json
import os
import re
import statistics
import sys

# The performance targets: the goal a ratio (or a figure) is held to, per device kind.
# goal: {"ratio_min": x} (ratio >= x) or {"figure_max": x} (figure <= x); None: reported only.
GOALS = {
    "decode_read": {"cuda": {"ratio_min": 0.90}, "cpu": {"ratio_min": 0.80}},
    "decode_vs_cudnn_fp16": {"cuda": {"ratio_min": 1.0}},
    "decode_vs_torch_fp32": {"cuda": None},
    "decode_host_graph": {"cuda": {"figure_max": 1.0}},
    "decode_formats_read": {"cuda": {"ratio_min": 0.93}, "cpu": {"ratio_min": 0.80}},
    "decode_bf16_vs_torch": {"cuda": {"ratio_min": 1.0}},
    "decode_fp8_vs_bf16": {"cuda": {"figure_max": 0.6}},
    "decode_host_eager": {"cuda": None},
    "prefill_tc_vs_fa2": {"cuda": {"ratio_min": 1.0}},
    "prefill_tc_vs_cudnn": {"cuda": None},
    "prefill_exact_fma": {"cuda": {"ratio_min": 0.65}, "cpu": {"ratio_min": 0.50}},
    "prefill_exact_vs_torch_fp32": {"cuda": None},
    "softmax": {"cuda": {"ratio_min": 0.85}, "cpu": {"ratio_min": 0.70}},
    "layout": {"cuda": {"ratio_min": 0.85}},
}
ORDER = list(GOALS)
LAYOUT = ("scale", "interleaved_to_batched", "batched_to_interleaved", "transpose")
LONG_DECODE_BYTES = 64 << 20  # "long contexts": K and V of at least 64 MiB per call


def card_of(name):
    """The card's name without lockstep's suffix, and the results file's stem."""
    if name.startswith("lockstep simulated GPU on "):
        simd = re.search(r"\d+ threads?, ([A-Za-z0-9]+)\)$", name)
        return "CPU device on " + name[len("lockstep simulated GPU on "):], \
            "cpu-" + (simd.group(1).lower() if simd else "unknown")
    card = re.sub(r" \(sm_\d+.*\)$", "", name)
    m = re.search(r"\b([A-Z]\d{2,4}[A-Z]?)\b", card.replace("NVIDIA ", ""))
    return card, (m.group(1).lower() if m else re.sub(r"[^a-z0-9]+", "-", card.lower()).strip("-"))


def load(paths):
    out = []
    for p in paths:
        with open(p) as f:
            out.append(json.load(f))
    return out


def median(xs):
    return statistics.median(xs) if xs else None


class Call:
    """The results of one device over the rounds of one call, and the peers of the same call."""

    def __init__(self, bench, peers):
        self.rounds = []  # per round: {(name, shape): result}, ceilings
        self.device = self.name = None
        for b in bench:
            for d in b["devices"]:
                if self.device is None:
                    self.device, self.name = d["device"], d["name"]
                if d["device"] != self.device:
                    continue
                self.rounds.append(({(r["name"], r["shape"]): r for r in d.get("results", [])},
                                    d.get("ceilings", {})))
        self.cuda = (self.device or "").startswith("cuda")
        # Peer rows: per (kind, dtype, backend, shape) the figure of each peer file. Graph
        # replays (torch_graph_prefill.py) are the device's time; torch_peers.py's prefill rows
        # are idle-stream times, its decode rows busy-stream ones.
        self.peers = {}
        for p in peers:
            for r in p.get("rows", []):
                if "median_ms" not in r:
                    continue
                kind = "graph" if r["op"] == "prefill graph" else r["op"]
                self.peers.setdefault((kind, r["dtype"], r["backend"], r["shape"]), []).append(r)

    def keys(self):
        seen = []
        for results, _ in self.rounds:
            for k in results:
                if k not in seen:
                    seen.append(k)
        return seen

    def series(self, key, field):
        return [r[field] for results, _ in self.rounds
                for r in [results.get(key)] if r is not None and r.get(field) is not None]

    def ceiling(self, field):
        return median([c[field] for _, c in self.rounds if c.get(field)])


def entry(target, call, name, shape, figure, unit, against, ratios, time_ms, timing, meta, figures=()):
    """One entry; ratios (or, without a ratio, figures) per round give the range."""
    spread = ratios if ratios else figures
    e = {"target": target, "benchmark": name, "shape": shape,
         "figure": round(figure, 4), "unit": unit, "against": against,
         "ratio": round(median(ratios), 4) if ratios else None,
         "range": [round(min(spread), 4), round(max(spread), 4)] if len(spread) > 1 else None,
         "goal": GOALS[target].get("cuda" if call.cuda else "cpu"),
         "time_ms": round(time_ms, 5), "timing": timing, "rounds": len(call.rounds)}
    e.update(meta)
    return e


def peer(call, kind, dtype, backend, shape):
    rows = call.peers.get((kind, dtype, backend, shape), [])
    return [r["median_ms"] for r in rows]


def entries(call, meta):
    out = []
    cmd_bench, cmd_peers = meta.pop("command_bench"), meta.pop("command_peers")
    for key in call.keys():
        name, shape = key
        ms = call.series(key, "median_ms")
        if not ms:
            continue
        t = median(ms)
        first = next(r[key] for r, _ in call.rounds if key in r)
        m_bench = dict(meta, command=cmd_bench)
        m_peers = dict(meta, command=cmd_peers)
        if name in ("incremental_attention", "flash_decoding") and first.get("bytes", 0) >= LONG_DECODE_BYTES:
            gbps = median(call.series(key, "GBps"))
            paired = call.series(key, "paired_read_fraction")
            if paired:
                against = {"name": "native read of the same K and V, paired",
                           "figure": None, "unit": "GB/s"}
                out.append(entry("decode_read", call, name, shape, gbps, "GB/s", against, paired,
                                 t, "median of the calls", m_bench))
            elif call.series(key, "frac_read_ceiling"):
                against = {"name": "read ceiling",
                           "figure": round(call.ceiling("read_GBps"), 1), "unit": "GB/s"}
                out.append(entry("decode_read", call, name, shape, gbps, "GB/s", against,
                                 call.series(key, "frac_read_ceiling"), t,
                                 "device time, stream kept busy", m_bench))
            if call.cuda:
                fp32 = peer(call, "decode", "fp32", "matmul-softmax-matmul (grouped)", shape)
                if fp32:
                    against = {"name": "PyTorch fp32 decode",
                               "figure": round(median(fp32), 5), "unit": "ms"}
                    out.append(entry("decode_vs_torch_fp32", call, name, shape, t, "ms", against,
                                     [median(fp32) / x for x in ms], t,
                                     "device time, stream kept busy, both", m_peers))
                cudnn = [r["GBps"] for r in call.peers.get(("decode", "fp16", "cudnn", shape), [])]
                if cudnn:
                    against = {"name": "PyTorch cuDNN fp16 decode",
                               "figure": round(median(cudnn), 1), "unit": "GB/s"}
                    out.append(entry("decode_vs_cudnn_fp16", call, name, shape, gbps, "GB/s", against,
                                     [g / median(cudnn) for g in call.series(key, "GBps")], t,
                                     "device time, stream kept busy, both", m_peers))
            host = call.series(key, "host_us_per_call")
            if call.cuda and host and name == "flash_decoding":
                out.append(entry("decode_host_eager", call, name, shape, median(host), "us per call", None,
                                 [], t, "host time per eager call, launches included", m_bench, host))
        elif name == "flash_decoding_formats" and first.get("bytes", 0) >= LONG_DECODE_BYTES // 4:
            # Note [decode formats]: shape "B=... L=... ACT/CACHE"; the peers' shape is the prefix.
            base, _, formats = shape.rpartition(" ")
            cache = formats.split("/")[-1]
            gbps = median(call.series(key, "GBps"))
            paired = call.series(key, "paired_read_fraction")
            if cache in ("bfloat16", "half"):
                if paired:
                    against = {"name": "native read of the same K and V, paired", "figure": None, "unit": "GB/s"}
                    out.append(entry("decode_formats_read", call, name, shape, gbps, "GB/s", against, paired,
                                     t, "median of the calls", m_bench))
                elif call.series(key, "frac_read_ceiling"):
                    against = {"name": "read ceiling", "figure": round(call.ceiling("read_GBps"), 1), "unit": "GB/s"}
                    out.append(entry("decode_formats_read", call, name, shape, gbps, "GB/s", against,
                                     call.series(key, "frac_read_ceiling"), t, "device time, stream kept busy",
                                     m_bench))
                if call.cuda and cache == "bfloat16":
                    best, label = None, None
                    for backend in ("cudnn", "flash", "efficient"):
                        p = peer(call, "decode", "bf16", backend, base)
                        if p and (best is None or median(p) < median(best)):
                            best, label = p, backend
                    if best:
                        against = {"name": f"PyTorch's fastest bf16 SDPA decode ({label})",
                                   "figure": round(median(best), 5), "unit": "ms"}
                        out.append(entry("decode_bf16_vs_torch", call, name, shape, t, "ms", against,
                                         [median(best) / x for x in ms], t, "device time, stream kept busy, both",
                                         m_peers))
            elif cache.startswith("fp8") and call.cuda:
                twin = (name, base + " " + formats.split("/")[0] + "/bfloat16")
                bf = call.series(twin, "median_ms")
                if bf:
                    against = {"name": "lockstep with a bfloat16 cache", "figure": round(median(bf), 5), "unit": "ms"}
                    out.append(entry("decode_fp8_vs_bf16", call, name, shape, t / median(bf), "x the bf16 time",
                                     against, [], t, "device time, stream kept busy, both", m_bench,
                                     [x / median(bf) for x in ms]))
        elif name == "flash_decoding_graph_step":
            host = call.series(key, "host_us_per_attention_call")
            if host:
                out.append(entry("decode_host_graph", call, name, shape, median(host), "us per attention call",
                                 None, [], t, "host time of a graph replay / layers", m_bench, host))
        elif name in ("attention_fused_tensor_core", "attention_fused_tensor_core_formats") and call.cuda:
            pshape, dtype = shape, "fp16"  # the peers' shape: 16-bit inputs' rows carry a format suffix
            if name.endswith("_formats"):
                fmt = next((f for f in ("half", "bfloat16") if shape.endswith(" " + f)), None)
                if fmt is None:
                    continue
                pshape, dtype = shape[:-len(" " + fmt)], "fp16" if fmt == "half" else "bf16"
            graph_fa2 = peer(call, "graph", dtype, "flash", pshape)
            busy = call.series(key, "busy_stream_ms")
            for target, backend in (("prefill_tc_vs_fa2", "flash"), ("prefill_tc_vs_cudnn", "cudnn")):
                if graph_fa2 and busy:
                    p, mine, timing = peer(call, "graph", dtype, backend, pshape), busy, \
                        "device time (stream kept busy) against CUDA-graph replays"
                else:
                    p, mine, timing = peer(call, "prefill", dtype, backend, pshape), ms, \
                        "idle stream, host enqueue included, both"
                if not p:
                    continue
                label = "FA2" if backend == "flash" else "cuDNN"
                against = {"name": f"PyTorch {label} {dtype}", "figure": round(median(p), 5),
                           "unit": "ms"}
                pair = len(p) == len(mine)
                ratios = [(p[i] if pair else median(p)) / x for i, x in enumerate(mine)]
                out.append(entry(target, call, name, shape, median(mine), "ms", against, ratios,
                                 median(mine), timing, m_peers))
        elif name in ("attention_fused_exact", "attention_fused_exact_formats") and "batch_invariant=false" not in shape:
            scale, unit = (1e3, "TFLOP/s") if call.cuda else (1.0, "GFLOP/s")
            rate = median(call.series(key, "GFLOPs")) / scale
            against = {"name": "fma ceiling", "figure": round(call.ceiling("fma_GFLOPs") / scale, 2),
                       "unit": unit}
            out.append(entry("prefill_exact_fma", call, name, shape, rate, unit, against,
                             call.series(key, "frac_fma_ceiling"), t,
                             "idle stream" if call.cuda else "median of the calls", m_bench))
            if call.cuda and name == "attention_fused_exact":
                busy = call.series(key, "busy_stream_ms")
                p = peer(call, "graph", "fp32", "efficient", shape)
                mine, timing = busy, "device time (stream kept busy) against CUDA-graph replays"
                if not (p and busy):
                    p, mine, timing = peer(call, "prefill", "fp32", "efficient", shape), ms, \
                        "idle stream, host enqueue included, both"
                if p:
                    pair = len(p) == len(mine)
                    against = {"name": "PyTorch fp32 efficient",
                               "figure": round(median(p), 5), "unit": "ms"}
                    out.append(entry("prefill_exact_vs_torch_fp32", call, name, shape, median(mine), "ms",
                                     against, [(p[i] if pair else median(p)) / x for i, x in enumerate(mine)],
                                     median(mine), timing, m_peers))
        elif name == "softmax_rows" or (name in LAYOUT and call.cuda):
            target = "softmax" if name == "softmax_rows" else "layout"
            field, ceil, label = ("frac_copy_ceiling", "copy_GBps", "copy ceiling") \
                if call.cuda else ("frac_read_ceiling", "read_GBps", "read ceiling")
            against = {"name": label, "figure": round(call.ceiling(ceil), 1), "unit": "GB/s"}
            out.append(entry(target, call, name, shape, median(call.series(key, "GBps")), "GB/s", against,
                             call.series(key, field), t, "median of the calls", m_bench))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", nargs="+", action="extend", required=True)
    ap.add_argument("--peers", nargs="+", action="extend", default=[])
    ap.add_argument("--commit", required=True)
    ap.add_argument("--date", default=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"))
    ap.add_argument("--command", default=None, help="the command that measured the lockstep figures")
    ap.add_argument("--merge-dir", default=None)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    call = Call(load(a.bench), load(a.peers))
    if call.device is None:
        sys.exit("results.py: no device in " + " ".join(a.bench))
    card, stem = card_of(call.name)
    if call.cuda:
        cmd_bench = a.command or "tools/gpu/verify.sh bench"
        cmd_peers = (a.command or "tools/gpu/verify.sh bench") + " peers"
    else:
        cmd_bench = cmd_peers = a.command or "lockstep-bench --device cpu"
    meta = {"card": card, "commit": a.commit, "date": a.date,
            "command_bench": cmd_bench, "command_peers": cmd_peers}
    new = entries(call, meta)
    old = []
    if a.merge_dir and os.path.exists(os.path.join(a.merge_dir, stem + ".json")):
        with open(os.path.join(a.merge_dir, stem + ".json")) as f:
            old = json.load(f)["entries"]
    key = lambda e: (e["target"], e["benchmark"], e["shape"])
    fresh = {key(e) for e in new}
    merged = [e for e in old if key(e) not in fresh] + new
    natural = lambda text: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]
    merged.sort(key=lambda e: (ORDER.index(e["target"]), e["benchmark"], natural(e["shape"])))
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, stem + ".json")
    text = json.dumps({"card": card, "entries": merged}, indent=1)
    text = re.sub(r"\[\s+([-\d.e]+),\s+([-\d.e]+)\s+\]", r"[\1, \2]", text)  # ranges on one line
    with open(path, "w") as f:
        f.write(text + "\n")
    print(path)


if __name__ == "__main__":
    main()
