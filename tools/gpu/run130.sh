#!/usr/bin/env bash
# Run 130 (twenty-fifth session): the deferred P.V wait (the default) against the serial order
# (LOCKSTEP_FUSED_TC_WGMMA_DEFER=0) at the head_dim 64 grids the benchmark gained (16x16x1024x64
# not causal, 2x16x4096x64 causal) beside the old ones, three rounds alternating, idle and busy
# stream. Staging: build-cuda's lockstep-bench into .gpu/. Run (carry [".gpu"]): bash .gpu/run130.sh
BUDGET=${BUDGET:-150}
source "$(pwd)/.gpu/run119_common.sh"
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $sm
for round in 1 2 3; do
  for knob in default serial; do
    unset LOCKSTEP_FUSED_TC_WGMMA_DEFER
    [ $knob = serial ] && export LOCKSTEP_FUSED_TC_WGMMA_DEFER=0
    step 40 "round $round $knob" f-$knob-$round.log $G/lockstep-bench --device cuda:0 --filter attention_fused --json $OUT/f-$knob-$round.json
  done
done
python3 - <<'P' | tee -a $sm
import json, glob, os, collections
rows = collections.defaultdict(list)
for f in sorted(glob.glob(os.environ['OUT'] + '/f-*.json')):
    knob = os.path.basename(f).split('-')[1]
    for d in json.load(open(f))['devices']:
        for r in d['results']:
            if 'tensor' in r['name']: rows[(r['shape'], knob)].append((round(r['median_ms'], 4), round(r.get('busy_stream_ms', 0), 4)))
for k in sorted(rows): print(*k, rows[k])
P
