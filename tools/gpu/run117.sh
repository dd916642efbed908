#!/usr/bin/env bash
# Run 117 (prepared in the seventeenth session, when no device was lent; not yet run): verifies
# and measures the one grid of 0c0a485 (Note [one grid]: the ticket before the prior-grid wait;
# the L2 policy in its chunk blocks, whose first tiles are issued by a loop that is not unrolled)
# and a launch's host time on the GPU machine (tools/gpu/launch_cost.cu); and CUDA's exact fused
# attention against the CPU's row-major path (Note [row-major exact]), which no GPU run has yet
# compared (the CPU tests compare it with the lane path, which runs 116 and before compared with
# CUDA). The eighteenth session (no device lent either) added the whole property suite at 300
# cases and parity's new entries (below).
# Staging, on the development machine:
#   bash tools/gpu/stage.sh && mkdir -p .gpu/base && cp <9711eba's liblockstep.so.0> .gpu/base/
#   nvcc -O2 -std=c++17 -arch=sm_90a -cudart static -o .gpu/launch_cost tools/gpu/launch_cost.cu \
#        -L/usr/local/cuda/lib64/stubs -lcuda
#   cp tools/gpu/run117.sh tools/gpu/check_descriptors.py .gpu/
# On the GPU machine (the device tool, carry [".gpu"]): bash .gpu/run117.sh; cat $OUT/summary.txt
# Then: if the one grid passes everything and costs no device time against the two launches,
# set kOneGridOnCuda (attention/src/decode_launch.cpp and tests/test_attention.cpp) and the
# interop test's expectation, and record the figures in docs/gpu-results.md.
export OUT; G=$(pwd)/.gpu
export LD_LIBRARY_PATH=$G
sm=$OUT/summary.txt
echo "commit $(cat $G/COMMIT)" | tee -a $sm
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee -a $sm
lscpu | grep -E "Model name|^CPU\(s\)" | tee -a $sm
which cuobjdump > /dev/null && cuobjdump -sass $G/liblockstep.so.0 | python3 $G/check_descriptors.py | tail -1 | tee -a $sm
timeout 60 $G/launch_cost > $OUT/launch_cost.log 2>&1; echo "launch_cost rc=$?" | tee -a $sm; tee -a $sm < $OUT/launch_cost.log
t0=$(date +%s)
timeout 120 $G/lockstep_tests > $OUT/tests.log 2>&1; echo "unit tests rc=$? in $(( $(date +%s) - t0 )) s: $(grep -E '^\[  (PASSED|FAILED) ' $OUT/tests.log | tr '\n' ' ')" | tee -a $sm
grep -E "FAILED|Failure" $OUT/tests.log | head -8 | tee -a $sm
LOCKSTEP_DECODE_ONE_GRID=1 timeout 120 $G/lockstep_tests --gtest_filter='*Decod*:*Flash*:*KvCache*:*Increm*:CudaInterop*' > $OUT/tests_one.log 2>&1; echo "decode unit tests, one grid rc=$?: $(grep -E '^\[  (PASSED|FAILED) ' $OUT/tests_one.log | tr '\n' ' ')" | tee -a $sm
grep -E "FAILED|Failure" $OUT/tests_one.log | head -8 | tee -a $sm
F='^decode$|^flash_decoding'
for round in 1 2 3; do
  for lib in one two base; do
    if [ $lib = base ]; then lp=$G/base:$G; else lp=$G; fi
    if [ $lib = one ]; then export LOCKSTEP_DECODE_ONE_GRID=1; else unset LOCKSTEP_DECODE_ONE_GRID; fi
    LD_LIBRARY_PATH=$lp timeout 120 $G/lockstep-bench --device cuda:0 --filter "$F" --json $OUT/v-$lib-$round.json > $OUT/v-$lib-$round.log 2>&1
    echo "round $round $lib rc=$?" | tee -a $sm; grep -E "^\| cuda.*(incremental|flash)" $OUT/v-$lib-$round.log | cut -c1-120 | tee -a $sm
  done
done
LOCKSTEP_DECODE_ONE_GRID=1 LD_LIBRARY_PATH=$G/base:$G timeout 120 $G/lockstep-bench --device cuda:0 --filter "$F" --json $OUT/v-baseone.json > $OUT/v-baseone.log 2>&1
echo "base with ONE_GRID=1 (the ticket after the wait, no policy) rc=$?" | tee -a $sm; grep -E "^\| cuda.*(incremental|flash)" $OUT/v-baseone.log | cut -c1-120 | tee -a $sm
unset LOCKSTEP_DECODE_ONE_GRID
python3 - <<'P' | tee -a $sm
import json, glob, os
out = os.environ['OUT']
for f in sorted(glob.glob(out + '/v-*.json')):
    d = json.load(open(f))
    for dev in d['devices']:
        c = dev.get('ceilings', {})
        for r in dev['results']:
            print(os.path.basename(f), r['name'], r['shape'][:40], round(r['median_ms'], 4),
                  'read%%=%.1f' % (100 * r.get('frac_read_ceiling', 0)), 'host=%.2f' % r.get('host_us_per_call', 0),
                  'cold=%.2f' % r.get('host_us_per_call_cold', 0), 'launches=%s' % r.get('launches'),
                  'ceil=%.0f' % c.get('read_GBps', 0))
P
t0=$(date +%s)
LOCKSTEP_DECODE_ONE_GRID=1 RC_PARAMS="max_success=2000" timeout 170 $G/lockstep_proptests --gtest_filter='Decode.*:*IncrementalDecode*' > $OUT/props_one.log 2>&1
echo "decode properties 2000, one grid rc=$? in $(( $(date +%s) - t0 )) s" | tee -a $sm; grep -E "^\[ +(OK|FAILED)|Falsifiable" $OUT/props_one.log | tee -a $sm
t0=$(date +%s)
RC_PARAMS="max_success=300" timeout 60 $G/lockstep_proptests --gtest_filter='Decode.*' > $OUT/props_two.log 2>&1
echo "decode properties 300, two launches rc=$? in $(( $(date +%s) - t0 )) s" | tee -a $sm; grep -E "^\[ +(OK|FAILED)|Falsifiable" $OUT/props_two.log | tee -a $sm
# Note [row-major exact]: the CPU's exact fused attention now runs row by row; CUDA against it.
t0=$(date +%s)
RC_PARAMS="max_success=1000" timeout 150 $G/lockstep_proptests --gtest_filter='*FusedExact*:*FusedMatches*' > $OUT/props_exact.log 2>&1
echo "fused exact properties 1000 (CUDA vs the CPU's row-major path) rc=$? in $(( $(date +%s) - t0 )) s" | tee -a $sm; grep -E "^\[ +(OK|FAILED)|Falsifiable" $OUT/props_exact.log | tee -a $sm
# Eighteenth session: the CPU runs warp-independent kernels a warp at a time (Note [warp passes]:
# softmax, scale, scale_mask, copy3d, rope, add, kv_scatter); every property against CUDA.
t0=$(date +%s)
RC_PARAMS="max_success=300" timeout 170 $G/lockstep_proptests > $OUT/props_all.log 2>&1
echo "all properties 300 rc=$? in $(( $(date +%s) - t0 )) s: $(grep -E '^\[  (PASSED|FAILED) ' $OUT/props_all.log | tr '\n' ' ')" | tee -a $sm
grep -E "^\[ +FAILED|Falsifiable" $OUT/props_all.log | head -8 | tee -a $sm
# parity: every registered kernel, since the eighteenth session also the KV cache's calls
# (append, copy_slot_from, grow), flash_decoding with device positions, fixed large shapes per
# kernel variant, and a rerun of the decode entries under LOCKSTEP_DECODE_ONE_GRID=1.
timeout 150 $G/lockstep parity --device cuda:0 --cases 100 > $OUT/parity.log 2>&1; echo "parity rc=$?: $(tail -1 $OUT/parity.log)" | tee -a $sm
for tool in racecheck memcheck; do
  t0=$(date +%s)
  LOCKSTEP_DECODE_ONE_GRID=1 timeout 170 compute-sanitizer --tool $tool --error-exitcode 9 $G/lockstep_tests --gtest_filter='*Decod*cuda*:*Flash*cuda*:*KvCache*cuda*:*Increm*cuda*:CudaInterop*:-CudaInterop.OutOfMemory*' > $OUT/$tool.log 2>&1
  echo "$tool unit tests, one grid (decode, flash, kv cache, interop) rc=$? $(( $(date +%s) - t0 )) s: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' $OUT/$tool.log | tail -1) $(grep -E '^\[  PASSED' $OUT/$tool.log)" | tee -a $sm
done
cp $OUT/summary.txt /tmp/summary.txt; tar czf /tmp/all.tgz -C $OUT .; rm -rf $OUT/*; mv /tmp/all.tgz /tmp/summary.txt $OUT/
