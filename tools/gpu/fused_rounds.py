#!/usr/bin/env python3
"""Busy-stream ms per (shape, configuration) of the TensorCore rows in lockstep-bench JSON files
named f-<configuration>-<round>.json (the rounds of a run script that alternates configurations).
Usage: fused_rounds.py <dir>"""
import collections
import glob
import json
import os
import sys

rows = collections.defaultdict(list)
for path in sorted(glob.glob(os.path.join(sys.argv[1], 'f-*.json'))):
    config = os.path.basename(path)[:-5].split('-')[1]
    for device in json.load(open(path))['devices']:
        for r in device['results']:
            if 'tensor' in r['name']:
                rows[(r['shape'][:50], config)].append(round(r.get('busy_stream_ms', 0), 4))
for key in sorted(rows):
    print(*key, 'busy ms:', rows[key])
