#!/usr/bin/env bash
# Run 140 (twenty-seventh session): Note [packing blocks] with the blocks packing N kv heads ahead
# (LOCKSTEP_FUSED_TC_PACK_AHEAD; run 139 found the packing blocks' kernel at 16x16x1024x64 causal
# 192-196 us against 139 us for the attention alone on packed tiles: is the rest the wait for the
# next kv head's packing?). The unit tests (the packing test now packs one and two kv heads
# ahead), memcheck and racecheck over the packing test, the fused properties at 300 cases with
# N = 4 forced, then the fused benchmarks in three rounds alternating N = 1, 2, 4, 8.
# Staging: CUOBJDUMP=... bash tools/gpu/stage.sh && cp tools/gpu/run119_common.sh tools/gpu/run140.sh tools/gpu/check_descriptors.py .gpu/
# Run (device tool, carry [".gpu"]): bash .gpu/run140.sh
BUDGET=${BUDGET:-420}
source "$(pwd)/.gpu/run119_common.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee -a $sm
check_descriptors_or_stop
step 60 "unit tests" tests.log $G/lockstep_tests
grep -E '^\[  (PASSED|FAILED) |FAILED|Failure' $OUT/tests.log | head -12 | tee -a $sm
grep -E 'FusedWgmmaPacking' $OUT/tests.log | grep -E 'OK|FAILED|SKIP' | tee -a $sm
step 40 "memcheck packing test" memcheck.log compute-sanitizer --tool memcheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*FusedWgmmaPacking*cuda*'
grep -E 'ERROR SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/memcheck.log | tail -2 | tee -a $sm
step 60 "racecheck packing test" racecheck.log compute-sanitizer --tool racecheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*FusedWgmmaPacking*cuda*'
grep -E 'RACECHECK SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/racecheck.log | tail -2 | tee -a $sm
LOCKSTEP_FUSED_TC_PACK_AHEAD=4 RC_PARAMS="max_success=300" step 60 "fused TensorCore properties 300, ahead 4" props.log $G/lockstep_proptests --gtest_filter='*FusedTensorCore:*FusedCausal*'
grep -E "^\[ +(OK|FAILED)|Falsifiable|PASSED" $OUT/props.log | tee -a $sm
for round in 1 2 3; do
  for n in 1 2 4 8; do
    LOCKSTEP_FUSED_TC_PACK_AHEAD=$n step 30 "round $round ahead $n" f-a$n-$round.log $G/lockstep-bench --device cuda:0 --filter attention_fused --json $OUT/f-a$n-$round.json
  done
done
python3 - <<'P' | tee -a $sm
import json, glob, os, collections
out = os.environ['OUT']
rows = collections.defaultdict(list)
for f in sorted(glob.glob(out + '/f-*.json')):
    cfg = os.path.basename(f)[:-5].split('-')[1]
    for dev in json.load(open(f))['devices']:
        for r in dev['results']:
            if 'tensor' in r['name']: rows[(r['shape'][:50], cfg)].append(round(r.get('busy_stream_ms', 0), 4))
for k in sorted(rows): print(*k, 'busy ms:', rows[k])
P
PYTHONUNBUFFERED=1 step 40 "FA2 graph replays" graph.log python3 $G/torch_graph_prefill.py --json $OUT/graph.json
grep -E "^\| prefill graph \| fp16 flash" $OUT/graph.log | tee -a $sm
echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm
(cd $OUT && tar czf results.tgz --exclude=results.tgz * && find . -maxdepth 1 -type f ! -name results.tgz ! -name summary.txt -delete)
