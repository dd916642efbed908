#!/usr/bin/env bash
# Run 143 (twenty-eighth session): the benchmark tables with PyTorch in the same call -- the fused
# benchmarks in three rounds, each followed by PyTorch's prefill as CUDA graph replays (FA2 fp16,
# cuDNN, fp32 efficient), and the decode benchmarks in two rounds with PyTorch's decode peers.
# Staging: as run142.sh, plus tools/gpu/run143.sh. Run: bash .gpu/run143.sh
BUDGET=${BUDGET:-400}
source "$(pwd)/.gpu/run119_common.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee -a $sm
for round in 1 2 3; do
  step 30 "fused round $round" f-$round.log $G/lockstep-bench --device cuda:0 --filter attention_fused --json $OUT/f-$round.json
  PYTHONUNBUFFERED=1 step 40 "PyTorch graph replays $round" graph-$round.log python3 $G/torch_graph_prefill.py --json $OUT/graph-$round.json
done
for round in 1 2; do
  step 30 "decode round $round" v-$round.log $G/lockstep-bench --device cuda:0 --filter '^decode$|^flash_decoding$' --json $OUT/v-$round.json
done
PYTHONUNBUFFERED=1 step 60 "PyTorch decode" torch.log python3 $G/torch_peers.py --json $OUT/peers.json
grep -E "^\| decode" $OUT/torch.log | tee -a $sm
python3 - <<'P' | tee -a $sm
import json, glob, os, collections
out = os.environ['OUT']
rows = collections.defaultdict(list)
for f in sorted(glob.glob(out + '/f-*.json')) + sorted(glob.glob(out + '/v-*.json')):
    for dev in json.load(open(f))['devices']:
        if '/v-' in f: print('ceilings', {k: v for k, v in dev['ceilings'].items() if 'GBps' in k})
        for r in dev['results']:
            rows[(r['name'][-20:], r['shape'][:50])].append((round(r.get('busy_stream_ms', r.get('median_ms', 0)), 4),
                                                            round(r.get('frac_read_ceiling', 0), 4), round(r.get('host_us_per_call', 0), 2)))
for f in sorted(glob.glob(out + '/graph-*.json')):
    for r in json.load(open(f))['rows']:
        rows[('peer ' + r['dtype'] + ' ' + r['backend'], r['shape'][:50])].append(round(r.get('median_ms', 0), 4))
for k in sorted(rows, key=lambda k: (k[1], k[0])): print(*k, 'ms (busy, frac read, host us):', rows[k])
P
echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm
(cd $OUT && tar czf results.tgz --exclude=results.tgz * && find . -maxdepth 1 -type f ! -name results.tgz ! -name summary.txt -delete)
