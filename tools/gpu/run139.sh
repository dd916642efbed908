#!/usr/bin/env bash
# Run 139 (twenty-seventh session): where the TensorCore call's time goes -- Nsight Compute's
# duration of each kernel launch (gpu__time_duration; no other counters, --clock-control none) over
# the fused benchmarks, with the packing blocks (the default) and with LOCKSTEP_FUSED_TC_PACK=0 (a
# packing launch over all of K and V, then the attention kernel alone on fp16 tiles), grouped by
# kernel and grid, medians in us; FA2's graph replays in the same call for the comparison.
# Staging: CUOBJDUMP=... bash tools/gpu/stage.sh && cp tools/gpu/run119_common.sh tools/gpu/run139.sh tools/gpu/check_descriptors.py .gpu/
# Run (device tool, carry [".gpu"]): bash .gpu/run139.sh
BUDGET=${BUDGET:-400}
source "$(pwd)/.gpu/run119_common.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee -a $sm
for pack in default 0; do
  unset LOCKSTEP_FUSED_TC_PACK
  [ $pack = 0 ] && export LOCKSTEP_FUSED_TC_PACK=0
  step 150 "ncu, packing $pack" ncu-$pack.log ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    --log-file $OUT/ncu-$pack.csv $G/lockstep-bench --device cuda:0 --filter attention_fused --reps 3
  unset LOCKSTEP_FUSED_TC_PACK
  python3 - $OUT/ncu-$pack.csv <<'P' | tee -a $sm
import csv, sys, statistics, collections
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))]
groups = collections.OrderedDict()
for r in rows:
    if r.get('Metric Name') != 'gpu__time_duration.sum': continue
    name = r['Kernel Name']
    for k in ('lockstep::kernels::', 'lockstep::'):
        name = name.replace(k, '')
    key = (name[:160], r['Grid Size'], r['Block Size'])
    v = float(r['Metric Value'].replace(',', ''))
    unit = r['Metric Unit']
    us = v / 1000 if unit in ('nsecond', 'ns') else v * 1000 if unit in ('msecond', 'ms') else v
    groups.setdefault(key, []).append(us)
for (n, g, b), v in groups.items():
    if 'Exact' in n or 'Ceil' in n or 'Fma' in n or 'Read' in n or 'Copy' in n: continue
    print(f"{n} grid {g} block {b}: {len(v)} launches, median {statistics.median(v):.1f} us")
P
done
PYTHONUNBUFFERED=1 step 40 "FA2 graph replays" graph.log python3 $G/torch_graph_prefill.py --json $OUT/graph.json
grep -E "^\| prefill graph \| fp16 flash" $OUT/graph.log | tee -a $sm
echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm
(cd $OUT && tar czf results.tgz --exclude=results.tgz * && find . -maxdepth 1 -type f ! -name results.tgz ! -name summary.txt -delete)
