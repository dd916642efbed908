#!/usr/bin/env python3
"""Draws the benchmark results under bench/results/ (bench/results/README.md).

Usage: tools/plot_results.py [--results DIR] [--svg FILE] [--tables]

--svg (default docs/performance.svg): a bar chart of each target's ratio to its ceiling or peer,
a bar per card, the goal marked. --tables: prints the Markdown tables of docs/performance.md
instead. Standard library only.
"""
import argparse
import glob
import json
import os
import re
from xml.sax.saxutils import escape

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Target: (title, the goal in words, how a ratio reads: "%" of a ceiling or "x" a peer).
TARGETS = {
    "decode_read": ("Decode: share of the read ceiling", "at least 90% of the read ceiling at long contexts "
                    "(80% on the CPU device)", "%"),
    "decode_vs_cudnn_fp16": ("Decode: bytes per second against cuDNN's fp16 decode",
                             "faster per byte than PyTorch's cuDNN fp16 decode", "x"),
    "decode_vs_torch_fp32": ("Decode: speed against PyTorch's fp32 decode", "reported", "x"),
    "decode_host_graph": ("Decode: host time per attention call in a captured decode step",
                          "at most 1 us per attention call", None),
    "decode_host_eager": ("Decode: host time per eager call", "reported", None),
    "prefill_tc_vs_fa2": ("Prefill, TensorCore: speed against FlashAttention-2",
                          "at least 1.0x PyTorch's flash backend (FA2) on fp16 inputs", "x"),
    "prefill_tc_vs_cudnn": ("Prefill, TensorCore: speed against cuDNN", "reported", "x"),
    "prefill_exact_fma": ("Prefill, Exact fp32: share of the FFMA ceiling",
                          "at least 65% of the fp32 fma ceiling (50% on the CPU device)", "%"),
    "prefill_exact_vs_torch_fp32": ("Prefill, Exact fp32: speed against PyTorch's fp32 kernel",
                                    "reported (PyTorch's kernel runs on tensor cores)", "x"),
    "decode_formats_read": ("Decode, bf16 and fp16 caches: share of the read ceiling",
                            "at least 93% of the read ceiling (80% of a paired read on the CPU device)", "%"),
    "decode_bf16_vs_torch": ("Decode, bf16 cache: speed against PyTorch's fastest bf16 SDPA decode",
                             "at least 1.0x (K and V read once by the peer)", "x"),
    "decode_fp8_vs_bf16": ("Decode, fp8 e4m3 cache: time against the bf16 cache", "at most 0.6x", None),
    "softmax": ("Softmax: share of the copy ceiling", "at least 85% of the copy ceiling "
                "(70% of the read ceiling on the CPU device)", "%"),
    "layout": ("Layout kernels: share of the copy ceiling", "at least 85% of the copy ceiling", "%"),
}
REPORTED = {"decode_vs_torch_fp32": "decode", "decode_host_eager": "host time of an eager decode call",
            "prefill_tc_vs_cudnn": "prefill, TensorCore", "prefill_exact_vs_torch_fp32": "prefill, Exact"}
PLOTTED = ("decode_read", "prefill_tc_vs_fa2", "prefill_exact_fma", "softmax", "layout")
SHORT = {"flash_decoding": "flash_decoding", "flash_decoding_formats": "flash_decoding", "incremental_attention": "incremental",
         "attention_fused_tensor_core": "", "attention_fused_exact": "", "attention_fused_exact_formats": "", "attention_fused_tensor_core_formats": "", "softmax_rows": "",
         "flash_decoding_graph_step": ""}
COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#b07aa1")


def load(folder):
    cards = []
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        with open(path) as f:
            data = json.load(f)
        cards.append((os.path.basename(path)[:-5], data))
    # GPUs first, then the CPU device.
    cards.sort(key=lambda c: (c[0].startswith("cpu"), c[0]))
    return cards


def label(e):
    prefix = SHORT.get(e["benchmark"], e["benchmark"])
    return (prefix + " " if prefix else "") + e["shape"]


def short_card(stem):
    return stem.upper() if not stem.startswith("cpu") else "CPU, " + stem[4:].upper()


def fmt_num(x, unit):
    if unit == "ms":
        return f"{x:.4g} ms"
    if unit.startswith("us"):
        return f"{x:.2g} us" if x < 1 else f"{x:.3g} us"
    return f"{x:.4g} {unit}"


def fmt_ratio(e, kind):
    r, rng = e["ratio"], e.get("range") or [e["ratio"]] * 2
    f = (lambda x: f"{100 * x:.1f}") if kind == "%" else (lambda x: f"{x:.2f}")
    spread = f" ({f(rng[0])}-{f(rng[1])})" if f(rng[0]) != f(rng[1]) else ""
    return f(r) + ("%" if kind == "%" else "x") + spread


def fmt_figure(e):
    fig = fmt_num(e["figure"], e["unit"])
    if e["unit"] == "GB/s" and e.get("time_ms"):
        fig += f" in {e['time_ms']:.4g} ms"
    if e.get("ratio") is None and e.get("range"):
        g = lambda x: f"{x:.2g}" if x < 1 else f"{x:.3g}"
        fig += f" ({g(e['range'][0])}-{g(e['range'][1])})"
    return fig


def fmt_against(e):
    a = e["against"]
    if not a:
        return ""
    return a["name"] + (" " + fmt_num(a["figure"], a["unit"]) if a.get("figure") is not None else "")


def met(e):
    g = e.get("goal")
    if not g:
        return "reported"
    if "ratio_min" in g:
        return "met" if e["ratio"] >= g["ratio_min"] else "short"
    return "met" if e["figure"] <= g["figure_max"] else "short"


def row(cells):
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def commands(rows):
    by = {}
    for stem, e in rows:
        by.setdefault(e["command"], []).append(short_card(stem))
    return "; ".join(f"`{c}` ({', '.join(dict.fromkeys(cs))})" for c, cs in by.items())


def tables(cards):
    """One table per target that has a goal, then one for the comparisons only reported."""
    out, reported = [], []
    for target, (title, goal, kind) in TARGETS.items():
        rows = [(stem, e) for stem, d in cards for e in d["entries"] if e["target"] == target]
        if not rows:
            continue
        if goal == "reported" or goal.startswith("reported"):
            reported += rows
            continue
        out.append(f"### {title}\n\nGoal: {goal}.\n")
        head = ["shape", "card", "lockstep"] + (["ceiling or peer, same run", "ratio"] if kind else []) + \
               ["status", "measured"]
        out += [row(head), row(["---"] * len(head))]
        for stem, e in rows:
            cells = [label(e), short_card(stem), fmt_figure(e)]
            if kind:
                cells += [fmt_against(e), fmt_ratio(e, kind)]
            out.append(row(cells + [met(e), f"{e['date']}, {e['commit']}"]))
        out.append(f"\nReproduce: {commands(rows)}.\n")
    if reported:
        out.append("### Other comparisons from the same runs\n")
        head = ["comparison", "shape", "card", "lockstep", "peer, same run", "ratio", "measured"]
        out += [row(head), row(["---"] * len(head))]
        for stem, e in reported:
            kind = TARGETS[e["target"]][2]
            out.append(row([REPORTED[e["target"]], label(e), short_card(stem), fmt_figure(e), fmt_against(e),
                            fmt_ratio(e, kind) if kind and e.get("ratio") is not None else "",
                            f"{e['date']}, {e['commit']}"]))
        out.append(f"\nReproduce: {commands(reported)}.\n")
    return "\n".join(out)


def svg(cards):
    stems = [s for s, _ in cards]
    color = {s: COLORS[i % len(COLORS)] for i, s in enumerate(stems)}
    names = {s: d["card"] for s, d in cards}
    label_w, plot_w, bar_h, gap, x_max = 330, 480, 11, 2, 1.4
    x0 = label_w + 10
    sx = lambda r: x0 + plot_w * min(r, x_max) / x_max
    parts, y = [], 20
    parts.append(f'<text x="4" y="{y}" class="h">Ratio to the ceiling or the peer measured in the same run '
                 f'(higher is better; a black mark is the goal)</text>')
    y += 14
    for s in stems:
        parts.append(f'<rect x="{x0}" y="{y}" width="10" height="10" fill="{color[s]}"/>'
                     f'<text x="{x0 + 14}" y="{y + 9}">{escape(names[s])}</text>')
        y += 14
    y += 6
    top = y
    for target in PLOTTED:
        title = TARGETS[target][0]
        rows = {}
        for s, d in cards:
            for e in d["entries"]:
                if e["target"] == target and e.get("ratio") is not None:
                    rows.setdefault(label(e), []).append((s, e))
        if not rows:
            continue
        y += 16
        parts.append(f'<text x="4" y="{y}" class="h">{escape(title)}</text>')
        y += 6
        for name, bars in rows.items():
            h = len(bars) * (bar_h + gap)
            parts.append(f'<text x="{label_w}" y="{y + h / 2 + 4}" text-anchor="end">{escape(name)}</text>')
            for i, (s, e) in enumerate(bars):
                by = y + i * (bar_h + gap)
                r = e["ratio"]
                parts.append(f'<rect x="{x0}" y="{by}" width="{sx(r) - x0:.1f}" height="{bar_h}" fill="{color[s]}">'
                             f'<title>{escape(names[s])}: {r:.3f}</title></rect>')
                if e.get("goal") and "ratio_min" in e["goal"]:
                    gx = sx(e["goal"]["ratio_min"])
                    parts.append(f'<line x1="{gx:.1f}" x2="{gx:.1f}" y1="{by - 1}" y2="{by + bar_h + 1}" class="g"/>')
                parts.append(f'<text x="{sx(r) + 3:.1f}" y="{by + bar_h - 2}" class="v">{r:.2f}</text>')
            y += h + 4
    bottom = y + 4
    grid = []
    for i in range(int(x_max / 0.25) + 1):
        r = i * 0.25
        grid.append(f'<line x1="{sx(r):.1f}" x2="{sx(r):.1f}" y1="{top}" y2="{bottom}" class="{"one" if r == 1 else "grid"}"/>'
                    f'<text x="{sx(r):.1f}" y="{bottom + 14}" text-anchor="middle">{r:g}</text>')
    width, height = x0 + plot_w + 40, bottom + 24
    style = ("text{font:11px sans-serif;fill:#222}.h{font-weight:bold}.v{font-size:9px;fill:#222;paint-order:stroke;stroke:#fff;stroke-width:3px}"
             ".grid{stroke:#ddd}.one{stroke:#888}.g{stroke:#000;stroke-width:2}")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}"><style>{style}</style>'
            f'<rect width="100%" height="100%" fill="#fff"/>' + "".join(grid) + "".join(parts) + "</svg>\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--svg", default=os.path.join(ROOT, "docs", "performance.svg"))
    ap.add_argument("--tables", action="store_true", help="print the Markdown tables instead")
    a = ap.parse_args()
    cards = load(a.results)
    if not cards:
        raise SystemExit(f"plot_results.py: no results in {a.results}")
    if a.tables:
        print(tables(cards), end="")
        return
    with open(a.svg, "w") as f:
        f.write(svg(cards))
    print(a.svg)


if __name__ == "__main__":
    main()
