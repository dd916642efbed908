#!/usr/bin/env bash
# Run 129 (twenty-fifth session): lockstep's fused attention and PyTorch's prefill on one machine,
# each timed twice -- with an idle stream when the start event is recorded (the host's enqueue
# included, as both have been reported so far) and with the stream kept busy (the device's time
# alone) -- after a review found that FA2 on fp32 inputs (five Python calls) at whisper-tiny was
# mostly host time in run 127's idle-stream figure.
# Staging: build-cuda's lockstep-bench and bench/peers/torch_peers.py into .gpu/ (stage.sh does both).
# Run (device tool, carry [".gpu"]): bash .gpu/run129.sh
BUDGET=${BUDGET:-150}
source "$(pwd)/.gpu/run119_common.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee -a $sm
step 40 "lockstep 1" f-1.log $G/lockstep-bench --device cuda:0 --filter attention_fused --json $OUT/f-1.json
PYTHONUNBUFFERED=1 step 60 "PyTorch prefill" torch.log python3 $G/torch_peers.py --prefill --json $OUT/peers.json
step 40 "lockstep 2" f-2.log $G/lockstep-bench --device cuda:0 --filter attention_fused --json $OUT/f-2.json
python3 - <<'P' | tee -a $sm
import json, glob, os
out = os.environ['OUT']
for f in sorted(glob.glob(out + '/f-*.json')):
    for dev in json.load(open(f))['devices']:
        for r in dev['results']:
            if 'tensor' in r['name']:
                print(os.path.basename(f), r['shape'], 'idle', round(r['median_ms'], 4), 'busy', round(r.get('busy_stream_ms', 0), 4))
for r in json.load(open(out + '/peers.json'))['rows']:
    if r['op'] == 'prefill':
        print('torch', r['dtype'], r['backend'], r['shape'], 'idle', round(r.get('median_ms', 0), 4), 'busy', round(r.get('busy_ms', 0), 4))
P
echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm
