#!/usr/bin/env bash
# Run 125 (twenty-fourth session): the H200 figures of 6ae436f in under two minutes, for a session
# with little device time left: attention_fused and flash_decoding twice, PyTorch's prefill at the
# same shapes, a summary of (median ms, % of the read ceiling, host us per call) per round.
# Run (device tool, carry [".gpu"]): bash .gpu/run125.sh
BUDGET=${BUDGET:-110}
source "$(pwd)/.gpu/run119_common.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee -a $sm
for round in 1 2; do
  step 25 "round $round" b-$round.log $G/lockstep-bench --device cuda:0 --filter 'attention_fused|^flash_decoding$' --json $OUT/b-$round.json
done
python3 - <<'P' | tee -a $sm
import json, glob, os, collections
rows = collections.defaultdict(list)
for f in sorted(glob.glob(os.environ['OUT'] + '/b-*.json')):
    for dev in json.load(open(f))['devices']:
        for r in dev['results']:
            rows[(r['name'], r['shape'][:44])].append((round(r['median_ms'], 4), round(100 * r.get('frac_read_ceiling', 0), 1),
                                                       round(r.get('GFLOPs', 0) / 1000, 1), round(r.get('host_us_per_call', 0), 1)))
for k in sorted(rows): print(*k, rows[k])
P
PYTHONUNBUFFERED=1 step 45 "PyTorch prefill" torch.log python3 $G/torch_peers.py --prefill --json $OUT/peers.json
grep -E "^\| prefill" $OUT/torch.log | tee -a $sm
echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm
