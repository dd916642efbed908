#!/usr/bin/env python3
"""Prints each CUDA result of lockstep-bench JSON files with a host time: one line per file and
result (the file's name, the benchmark, its shape, the device's median ms, host us per call).
Usage: host_times.py a.json b.json ..."""
import json
import os
import sys

for path in sys.argv[1:]:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        print(f"{path}: unreadable ({e})")
        continue
    rows = [r for d in data.get("devices", []) for r in d.get("results", [])]
    for r in rows:
        if "host_us_per_call" not in r or not str(r.get("device", "")).startswith("cuda"):
            continue
        extra = r.get("host_us_per_attention_call")
        tail = f"  per attention call {extra:.2f}" if extra is not None else ""
        print(f"{os.path.basename(path):10s} {r['name']:28s} {r['shape']:45s} "
              f"{r['median_ms']:.4f} ms  host {r['host_us_per_call']:.2f} us{tail}")
