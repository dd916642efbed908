#!/usr/bin/env bash
# Run 138 (twenty-seventh session): the defaults after run 137 -- head_dim 64 TensorCore with one
# warpgroup per block at every grid, and no TensorCore split for batch_invariant = false. The
# unit tests (FusedWgmmaDeferredGivesTheSameBytes now checks which kernel a small grid launches by
# default), every fused property at 1000 cases, parity, memcheck over the fused tests, racecheck
# over the wgmma and split tests, the fused benchmarks in three rounds with FA2's and PyTorch's
# graph replays after each; on an H200 only, the decode properties at 2000 cases with what is left.
# Staging: CUOBJDUMP=... bash tools/gpu/stage.sh && cp tools/gpu/run119_common.sh tools/gpu/run138.sh tools/gpu/check_descriptors.py .gpu/
# Run (device tool, carry [".gpu"]): bash .gpu/run138.sh
BUDGET=${BUDGET:-570}
source "$(pwd)/.gpu/run119_common.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee -a $sm
check_descriptors_or_stop
step 60 "unit tests" tests.log $G/lockstep_tests
grep -E '^\[  (PASSED|FAILED) |FAILED|Failure' $OUT/tests.log | head -12 | tee -a $sm
grep -E 'FusedWgmmaDeferred|SplitKeys' $OUT/tests.log | grep -E 'OK|FAILED|SKIP' | tee -a $sm
for round in 1 2 3; do
  step 30 "fused round $round" f-$round.log $G/lockstep-bench --device cuda:0 --filter attention_fused --json $OUT/f-$round.json
  PYTHONUNBUFFERED=1 step 40 "PyTorch graph replays $round" graph-$round.log python3 $G/torch_graph_prefill.py --json $OUT/graph-$round.json
done
python3 - <<'P' | tee -a $sm
import json, glob, os, collections
out = os.environ['OUT']
rows = collections.defaultdict(list)
for f in sorted(glob.glob(out + '/f-*.json')):
    for dev in json.load(open(f))['devices']:
        for r in dev['results']:
            rows[(r['name'][16:], r['shape'][:50])].append(round(r.get('busy_stream_ms', 0), 4))
for f in sorted(glob.glob(out + '/graph-*.json')):
    for r in json.load(open(f))['rows']:
        rows[('peer ' + r['dtype'] + ' ' + r['backend'], r['shape'][:50])].append(round(r.get('median_ms', 0), 4))
for k in sorted(rows, key=lambda k: (k[1], k[0])): print(*k, 'ms:', rows[k])
P
RC_PARAMS="max_success=1000" step 150 "fused properties 1000" props_fused.log $G/lockstep_proptests --gtest_filter='*Fused*'
grep -E "^\[ +(OK|FAILED)|Falsifiable|PASSED" $OUT/props_fused.log | tee -a $sm
step 15 "parity" parity.log $G/lockstep parity --cases 3
tail -1 $OUT/parity.log | tee -a $sm
step 40 "memcheck fused tests" memcheck.log compute-sanitizer --tool memcheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*Fused*cuda*'
grep -E 'ERROR SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/memcheck.log | tail -3 | tee -a $sm
LOCKSTEP_TEST_SPLIT_SHAPES=1 step 60 "racecheck wgmma and split tests" racecheck.log compute-sanitizer --tool racecheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*FusedWgmma*cuda*:*SplitKeys*cuda*'
grep -E 'RACECHECK SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/racecheck.log | tail -3 | tee -a $sm
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  RC_PARAMS="max_success=2000" step 200 "decode properties 2000" props_decode.log $G/lockstep_proptests --gtest_filter='Decode.FlashDecoding:Decode.BatchInvariance:Attention.IncrementalDecode'
  grep -E "^\[ +(OK|FAILED)|Falsifiable|PASSED" $OUT/props_decode.log | tee -a $sm
fi
echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm
(cd $OUT && tar czf results.tgz --exclude=results.tgz * && find . -maxdepth 1 -type f ! -name results.tgz ! -name summary.txt -delete)
