#!/usr/bin/env bash
# Run 137 (twenty-seventh session): (1) the unit tests with FusedExactUnmaskedTilesGiveTheMaskedBytes
# now also over three key ranges; (2) the mma.sync TensorCore kernels' split path on the GPU
# (LOCKSTEP_FUSED_TC_WGMMA=0 with 64- and 128-row blocks: until now byte-compared on the CPU only)
# -- the split unit test, the split property at 300 cases, memcheck and racecheck; (3) whisper-tiny
# by default (batch-invariant, no split) with one-warpgroup blocks (144 blocks instead of 72 of
# two warpgroups; the same bits), under each head_dim 64 schedule, three rounds alternating, FA2
# as graph replays in the same call.
# Staging: CUOBJDUMP=... bash tools/gpu/stage.sh && cp tools/gpu/run119_common.sh tools/gpu/run137.sh tools/gpu/check_descriptors.py .gpu/
# Run (device tool, carry [".gpu"]): bash .gpu/run137.sh
BUDGET=${BUDGET:-560}
source "$(pwd)/.gpu/run119_common.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee -a $sm
check_descriptors_or_stop
step 60 "unit tests" tests.log $G/lockstep_tests
grep -E '^\[  (PASSED|FAILED) |FAILED|Failure' $OUT/tests.log | head -12 | tee -a $sm
grep -E 'FusedExactUnmasked' $OUT/tests.log | grep -E 'OK|FAILED' | tee -a $sm
for rows in 64 128; do
  export LOCKSTEP_FUSED_TC_WGMMA=0 LOCKSTEP_FUSED_TC_ROWS=$rows
  step 40 "mma.sync $rows rows: split unit test" split-$rows.log $G/lockstep_tests --gtest_filter='*FusedTensorCoreSplitKeys*cuda*'
  grep -E '^\[  (PASSED|FAILED) |Failure' $OUT/split-$rows.log | head -3 | tee -a $sm
  RC_PARAMS="max_success=300" step 90 "mma.sync $rows rows: split property 300" props-$rows.log $G/lockstep_proptests --gtest_filter='*FusedTensorCoreSplitKeys*'
  grep -E "^\[ +(OK|FAILED)|Falsifiable" $OUT/props-$rows.log | tee -a $sm
  step 30 "mma.sync $rows rows: memcheck split test" memcheck-$rows.log compute-sanitizer --tool memcheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*FusedTensorCoreSplitKeys*cuda*'
  grep -E 'ERROR SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/memcheck-$rows.log | tail -2 | tee -a $sm
  LOCKSTEP_TEST_SPLIT_SHAPES=1 step 60 "mma.sync $rows rows: racecheck split test, first shape" racecheck-$rows.log compute-sanitizer --tool racecheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*FusedTensorCoreSplitKeys*cuda*'
  grep -E 'RACECHECK SUMMARY|^\[  PASSED|^\[  FAILED' $OUT/racecheck-$rows.log | tail -2 | tee -a $sm
  unset LOCKSTEP_FUSED_TC_WGMMA LOCKSTEP_FUSED_TC_ROWS
done
for round in 1 2 3; do
  for cfg in default wg1 wg1overlap wg1serial; do
    unset LOCKSTEP_FUSED_TC_WGMMA_WG LOCKSTEP_FUSED_TC_WGMMA_SERIAL LOCKSTEP_FUSED_TC_WGMMA_DEFER
    case $cfg in
      wg1) export LOCKSTEP_FUSED_TC_WGMMA_WG=1 ;;
      wg1overlap) export LOCKSTEP_FUSED_TC_WGMMA_WG=1 LOCKSTEP_FUSED_TC_WGMMA_SERIAL=0 ;;
      wg1serial) export LOCKSTEP_FUSED_TC_WGMMA_WG=1 LOCKSTEP_FUSED_TC_WGMMA_DEFER=0 ;;
    esac
    step 30 "round $round $cfg" f-$cfg-$round.log $G/lockstep-bench --device cuda:0 --filter attention_fused --json $OUT/f-$cfg-$round.json
  done
  unset LOCKSTEP_FUSED_TC_WGMMA_WG LOCKSTEP_FUSED_TC_WGMMA_SERIAL LOCKSTEP_FUSED_TC_WGMMA_DEFER
  PYTHONUNBUFFERED=1 step 40 "FA2 graph replays $round" graph-$round.log python3 $G/torch_graph_prefill.py --json $OUT/graph-$round.json
  grep -E "^\| prefill graph \| fp16 flash \| B=1 H=6" $OUT/graph-$round.log | tee -a $sm
done
python3 - <<'P' | tee -a $sm
import json, glob, os, collections
out = os.environ['OUT']
rows = collections.defaultdict(list)
for f in sorted(glob.glob(out + '/f-*.json')):
    cfg = os.path.basename(f)[:-5].split('-')[1]
    for dev in json.load(open(f))['devices']:
        for r in dev['results']:
            rows[(r['shape'][:50], cfg)].append(round(r.get('busy_stream_ms', 0), 4))
for k in sorted(rows): print(*k, 'busy ms:', rows[k])
P
echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm
(cd $OUT && tar czf results.tgz --exclude=results.tgz * && find . -maxdepth 1 -type f ! -name results.tgz ! -name summary.txt -delete)
