#!/usr/bin/env python3
"""Prints the fused kernels' launches from an Nsight Compute CSV (ncu --metrics
gpu__time_duration.sum --csv --log-file F) in launch order: kernel, grid, duration in us
(the Exact, fill and ceiling kernels left out). Used by run 139 (docs/gpu-results.md)."""
import csv, sys, statistics
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))]
seq=[]
for r in rows:
    if r.get('Metric Name') != 'gpu__time_duration.sum': continue
    n=r['Kernel Name'].replace('void ','').replace('(Params)','')
    if any(k in n for k in ('Exact','Fill','Ceil','Fma','Read','Copy','Delay','Spin')): continue
    v=float(r['Metric Value'].replace(',',''))
    u=r['Metric Unit']; us = v/1000 if u.startswith('n') else v*1000 if u.startswith('m') else v
    seq.append((n, r['Grid Size'], us))
print(len(seq))
for s in seq: print(s[0][:60].ljust(60), s[1].ljust(16), round(s[2],1))
