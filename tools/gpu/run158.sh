#!/usr/bin/env bash
# Run 158 (thirty-third session): Note [driver launches] (backends/cuda/cuda_device.cpp) -- kernels
# launched by the driver's cuLaunchKernelEx on a cached CUfunction instead of the runtime's
# cudaLaunchKernel(ExC). On an H200 the card decides for the issues' verification instead
# (run142.sh, then run153.sh in a second call). Otherwise: the launch floor on this host
# (launch_cost, built by hand: its header), every unit test with the driver's launches, the CUDA
# tests with the runtime's (LOCKSTEP_DRIVER_LAUNCH=0), short decode and fused properties,
# memcheck over the interop and decode tests, and three rounds of the decode benchmarks
# alternating LOCKSTEP_DRIVER_LAUNCH=0 with the default (host us per eager call: host_times.py).
# Staging: stage.sh, then cp tools/gpu/run119_common.sh tools/gpu/run142.sh tools/gpu/run143.sh
# tools/gpu/run153.sh tools/gpu/run158.sh tools/gpu/host_times.py tools/gpu/check_descriptors.py
# .gpu/ and the launch_cost binary. Run (device tool, kind nvidia-h200, carry [".gpu"]): bash .gpu/run158.sh
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$name" in
  *H200*) echo "card: $name: the issues' verification (run142.sh)"; BUDGET=${BUDGET:-575} bash .gpu/run142.sh; exit ;;
esac
export BUDGET=${BUDGET:-570}
source "$(pwd)/.gpu/run119_common.sh"
echo "card: $name" | tee -a $sm
step 60 "launch_cost" launch_cost.log $G/launch_cost
cat $OUT/launch_cost.log | tee -a $sm
step 150 "unit tests (driver launches)" units.log $G/lockstep_tests
grep -E "^\[  (PASSED|FAILED)|^\[  FAILED|SKIPPED \] [0-9]" $OUT/units.log | head -8 | tee -a $sm
LOCKSTEP_DRIVER_LAUNCH=0 step 120 "CUDA unit tests (runtime launches)" units_rt.log $G/lockstep_tests --gtest_filter='*cuda*:CudaInterop.*'
grep -E "^\[  (PASSED|FAILED)|^\[  FAILED" $OUT/units_rt.log | head -6 | tee -a $sm
for r in 1 2 3; do
  LOCKSTEP_DRIVER_LAUNCH=0 step 60 "runtime round $r" rt$r.log $G/lockstep-bench --device cuda:0 --filter '^(decode|flash_decoding|flash_decoding_graph)$' --json $OUT/rt$r.json
  step 60 "driver round $r" dr$r.log $G/lockstep-bench --device cuda:0 --filter '^(decode|flash_decoding|flash_decoding_graph)$' --json $OUT/dr$r.json
done
python3 $G/host_times.py $OUT/rt1.json $OUT/dr1.json $OUT/rt2.json $OUT/dr2.json $OUT/rt3.json $OUT/dr3.json | tee -a $sm
RC_PARAMS="max_success=300" step 120 "decode properties 300" props_decode.log $G/lockstep_proptests --gtest_filter='Decode.FlashDecoding:Decode.BatchInvariance:Attention.IncrementalDecode'
grep -E "^\[ +(OK|FAILED)|Falsifiable|PASSED" $OUT/props_decode.log | tee -a $sm
RC_PARAMS="max_success=100" step 90 "fused properties 100" props_fused.log $G/lockstep_proptests --gtest_filter='*Fused*'
grep -E "^\[ +(OK|FAILED)|Falsifiable|PASSED" $OUT/props_fused.log | tail -3 | tee -a $sm
step 150 "memcheck interop + decode" memcheck.log compute-sanitizer --tool memcheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='CudaInterop.*:*Flash*cuda*:*Cache*cuda*'
grep -E "ERROR SUMMARY|PASSED|FAILED" $OUT/memcheck.log | tail -3 | tee -a $sm
echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm
