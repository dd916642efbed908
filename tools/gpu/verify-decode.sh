#!/usr/bin/env bash
# The decode verification of this session's last GPU run (run 23): unit tests, the decode
# properties at 2000 cases, memcheck and racecheck on the decode tests, the decode benchmarks.
# Run on the GPU machine from the repository root, after tools/gpu/stage.sh.
R=$OUT; export LD_LIBRARY_PATH=$PWD/.gpu; mkdir -p /tmp/o; export OUT=/tmp/o; S=/tmp/o/summary.txt
bash .gpu/run.sh 0 info tests > /dev/null 2>&1
F='Decode.*:Attention.IncrementalDecode:Attention.DecodeMatches*:Attention.KvCacheScatter'
RC_PARAMS=max_success=2000 .gpu/lockstep_proptests --gtest_filter="$F" > /tmp/o/props.log 2>&1; echo "decode properties 2000 rc=$?" >> $S; grep -E "^\[       OK|FAILED" /tmp/o/props.log >> $S
compute-sanitizer --tool memcheck --error-exitcode 9 .gpu/lockstep_tests --gtest_filter='*cuda*:CudaInterop.Decode*' > /tmp/o/mem.log 2>&1; echo "memcheck unit rc=$? $(grep 'ERROR SUMMARY' /tmp/o/mem.log | tail -1)" >> $S
RC_PARAMS=max_success=10 compute-sanitizer --tool memcheck --error-exitcode 9 .gpu/lockstep_proptests --gtest_filter="$F" >> /tmp/o/mem.log 2>&1; echo "memcheck props rc=$?" >> $S
compute-sanitizer --tool racecheck --error-exitcode 9 .gpu/lockstep_tests --gtest_filter='*Decode*cuda*:*Flash*cuda*:CudaInterop.Decode*' > /tmp/o/race.log 2>&1; echo "racecheck rc=$? $(grep 'RACECHECK SUMMARY' /tmp/o/race.log | tail -1)" >> $S
BENCH_FILTER=decod bash .gpu/run.sh 0 bench > /dev/null 2>&1
cd /tmp/o && tar czf $R/run23.tgz *
grep -v "PROF\|^commit" $S | cut -c1-300
grep -E "DecodeStepReplays|DevicePositions" /tmp/o/tests.log | head -4
python3 - <<'P'
import json;d=json.load(open('/tmp/o/bench_cuda.json'))
def walk(x):
  if isinstance(x,dict):
    if 'name' in x and 'median_ms' in x: print(x['name'], x['shape'], round(x['median_ms'],4), x.get('idle_stream_ms'), x.get('host_us_per_call'), x.get('host_us_per_attention_call'))
    for v in x.values(): walk(v)
  elif isinstance(x,list):
    for v in x: walk(v)
walk(d)
P
