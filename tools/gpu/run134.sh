#!/usr/bin/env bash
# Run 134 (twenty-sixth session): the split-key TensorCore kernel's shape at whisper-tiny -- two
# ranges on one-warpgroup blocks (the default: 288 blocks of 64 rows) against two-warpgroup blocks
# (LOCKSTEP_FUSED_TC_WGMMA_WG=2: 144 blocks of 128 rows, and 216 / 288 with 3 / 4 ranges), and
# Exact's ranges (4, 5, 8 against the default 6); two rounds each, FA2's graph replays between.
# Staging: bash tools/gpu/stage.sh && cp tools/gpu/run119_common.sh tools/gpu/run134.sh tools/gpu/check_descriptors.py .gpu/
# Run (device tool, carry [".gpu"]): bash .gpu/run134.sh
BUDGET=${BUDGET:-300}
source "$(pwd)/.gpu/run119_common.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee -a $sm
check_descriptors_or_stop
cfgs="default wg2s2 wg2s3 wg2s4 ex4 ex5 ex8"
for round in 1 2; do
  for c in $cfgs; do
    unset LOCKSTEP_FUSED_TC_WGMMA_WG LOCKSTEP_FUSED_TC_SPLITS LOCKSTEP_FUSED_EXACT_SPLITS
    case $c in
      wg2s*) export LOCKSTEP_FUSED_TC_WGMMA_WG=2 LOCKSTEP_FUSED_TC_SPLITS=${c#wg2s} ;;
      ex*) export LOCKSTEP_FUSED_EXACT_SPLITS=${c#ex} ;;
    esac
    step 30 "round $round $c" f-$c-$round.log $G/lockstep-bench --device cuda:0 --filter attention_fused --json $OUT/f-$c-$round.json
  done
  unset LOCKSTEP_FUSED_TC_WGMMA_WG LOCKSTEP_FUSED_TC_SPLITS LOCKSTEP_FUSED_EXACT_SPLITS
  PYTHONUNBUFFERED=1 step 40 "FA2 graph $round" graph-$round.log python3 $G/torch_graph_prefill.py --json $OUT/graph-$round.json
  grep -E "fp16 flash.*L=1500|efficient.*L=1500" $OUT/graph-$round.log | tee -a $sm
done
python3 - <<'P' | tee -a $sm
import json, glob, os, collections
out = os.environ['OUT']
rows = collections.defaultdict(list)
for f in sorted(glob.glob(out + '/f-*.json')):
    c = os.path.basename(f)[:-5].split('-')[1]
    for dev in json.load(open(f))['devices']:
        for r in dev['results']:
            if 'L=1500' not in r['shape']: continue
            rows[(r['name'][16:], r['shape'], c)].append(round(r.get('busy_stream_ms', 0), 4))
for k in sorted(rows): print(*k, 'busy ms:', rows[k])
P
echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm
(cd $OUT && tar czf results.tgz --exclude=results.tgz * && find . -maxdepth 1 -type f ! -name results.tgz ! -name summary.txt -delete)
