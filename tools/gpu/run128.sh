#!/usr/bin/env bash
# Run 128 (twenty-fifth session): on an H200 only -- the decode properties at 2000 cases (CUDA ==
# CPU, batch invariance, incremental decode) for the
# decode kernels of runs 124-127 (last run at 2000 cases on an H200 in run 119, before 25bf08d's
# status word and the shorter host path), the unit tests, and the fused benchmarks twice beside
# PyTorch's prefill (FA2 also on fp32 inputs rounded in the call, as lockstep is given), also as
# CUDA graph replays, and lockstep's busy-stream figures (run 129: the device's time alone).
# Staging: bash tools/gpu/stage.sh && cp tools/gpu/run119_common.sh tools/gpu/run128.sh tools/gpu/check_descriptors.py .gpu/
# Run (device tool, kind nvidia-h200, carry [".gpu"]): bash .gpu/run128.sh
BUDGET=${BUDGET:-420}
source "$(pwd)/.gpu/run119_common.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee -a $sm
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200: stopping" | tee -a $sm; exit 4; }
check_descriptors_or_stop
step 60 "unit tests" tests.log $G/lockstep_tests
grep -E '^\[  (PASSED|FAILED) |FAILED|Failure' $OUT/tests.log | head -12 | tee -a $sm
PYTHONUNBUFFERED=1 step 60 "PyTorch prefill" torch.log python3 $G/torch_peers.py --prefill --json $OUT/peers.json
grep -E "^\| prefill" $OUT/torch.log | tee -a $sm
PYTHONUNBUFFERED=1 step 40 "PyTorch prefill as graph replays" graph.log python3 $G/torch_graph_prefill.py --json $OUT/graph.json
grep -E "^\| prefill graph" $OUT/graph.log | tee -a $sm
for round in 1 2; do
  step 40 "round $round" f-$round.log $G/lockstep-bench --device cuda:0 --filter attention_fused --json $OUT/f-$round.json
  python3 -c "
import json
for d in json.load(open('$OUT/f-$round.json'))['devices']:
    for r in d['results']: print(r['name'], r['shape'], 'idle', round(r['median_ms'], 4), 'busy', round(r.get('busy_stream_ms', 0), 4))" | tee -a $sm
done
RC_PARAMS="max_success=2000" step 240 "decode properties 2000" props_decode.log $G/lockstep_proptests --gtest_filter='Decode.FlashDecoding:Decode.BatchInvariance:Attention.IncrementalDecode'
grep -E "^\[ +(OK|FAILED)|Falsifiable|PASSED" $OUT/props_decode.log | tee -a $sm
echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm
(cd $OUT && tar czf results.tgz --exclude=results.tgz * && find . -maxdepth 1 -type f ! -name results.tgz ! -name summary.txt -delete)
