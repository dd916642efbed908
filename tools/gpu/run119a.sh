#!/usr/bin/env bash
# Run 119, first call (nineteenth session; run 117's plan split into two calls of at most ~9
# minutes, since the device tool allows 10 minutes a command): the unit tests on cuda:0 with the
# two launches and with the one grid (Note [one grid]), a launch's host time
# (tools/gpu/launch_cost.cu), and the decode benchmarks, two rounds alternating the one grid, the
# two launches and 9711eba's library (the library of runs 115-116) in .gpu/base.
# Staging: bash tools/gpu/stage.sh && mkdir -p .gpu/base && cp <9711eba's liblockstep.so.0> .gpu/base/
#   && nvcc -O2 -std=c++17 -arch=sm_90a -cudart static -o .gpu/launch_cost tools/gpu/launch_cost.cu
#      -L/usr/local/cuda/lib64/stubs -lcuda && cp tools/gpu/run119*.sh tools/gpu/check_descriptors.py .gpu/ (run119_common.sh too)
# Run (device tool, carry [".gpu"]): bash .gpu/run119a.sh; then bash .gpu/run119b.sh.
BUDGET=${BUDGET:-540}
source "$(pwd)/.gpu/run119_common.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader | tee -a $sm
lscpu | grep -E "Model name|^CPU\(s\)" | tee -a $sm
which cuobjdump > /dev/null && cuobjdump -sass $G/liblockstep.so.0 | python3 $G/check_descriptors.py | tail -1 | tee -a $sm
timeout 40 $G/launch_cost > $OUT/launch_cost.log 2>&1; echo "launch_cost rc=$?" | tee -a $sm; tee -a $sm < $OUT/launch_cost.log
t0=$(date +%s)
timeout 150 $G/lockstep_tests > $OUT/tests.log 2>&1; echo "unit tests rc=$? in $(( $(date +%s) - t0 )) s: $(grep -E '^\[  (PASSED|FAILED) ' $OUT/tests.log | tr '\n' ' ')" | tee -a $sm
grep -E "FAILED|Failure" $OUT/tests.log | head -12 | tee -a $sm
t0=$(date +%s)
LOCKSTEP_DECODE_ONE_GRID=1 timeout 90 $G/lockstep_tests --gtest_filter='*Decod*:*Flash*:*KvCache*:*Increm*:CudaInterop*:*MutationKills*' > $OUT/tests_one.log 2>&1; echo "decode unit tests, one grid rc=$? in $(( $(date +%s) - t0 )) s: $(grep -E '^\[  (PASSED|FAILED) ' $OUT/tests_one.log | tr '\n' ' ')" | tee -a $sm
grep -E "FAILED|Failure" $OUT/tests_one.log | head -8 | tee -a $sm
F='^decode$|^flash_decoding'
for round in 1 2; do
  for lib in one two base; do
    if [ $(left) -lt 70 ]; then echo "round $round $lib skipped: $(left) s left" | tee -a $sm; continue; fi
    if [ $lib = base ]; then lp=$G/base:$G; else lp=$G; fi
    if [ $lib = one ]; then export LOCKSTEP_DECODE_ONE_GRID=1; else unset LOCKSTEP_DECODE_ONE_GRID; fi
    t0=$(date +%s)
    LD_LIBRARY_PATH=$lp timeout 65 $G/lockstep-bench --device cuda:0 --filter "$F" --json $OUT/v-$lib-$round.json > $OUT/v-$lib-$round.log 2>&1
    echo "round $round $lib rc=$? in $(( $(date +%s) - t0 )) s" | tee -a $sm; grep -E "^\| cuda.*(incremental|flash)" $OUT/v-$lib-$round.log | cut -c1-120 | tee -a $sm
  done
done
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
echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm
