#!/usr/bin/env bash
# Run 155 (thirty-second session): Note [batched loads] in kernels/softmax.hpp -- the GPU's long
# rows issue 8 loads per lane before using them. Three rounds of softmax_rows alternating the
# previous library (.gpu-old: 62c076c's liblockstep.so.0 and lockstep-bench) with this one
# (.gpu), then the softmax property against the CPU at 1000 cases, the softmax unit tests on
# both devices, and memcheck over them (the kernel uses no shared memory: no racecheck).
# Staging: stage.sh at the new commit, and .gpu-old from the previous build. Run (device tool,
# carry [".gpu", ".gpu-old"]): bash .gpu/run155.sh
export BUDGET=${BUDGET:-560}
source "$(pwd)/.gpu/run119_common.sh"
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $name; old $(cat .gpu-old/COMMIT)" | tee -a $sm
for r in 1 2 3; do
  LD_LIBRARY_PATH=$(pwd)/.gpu-old:$G step 90 "old round $r" old$r.log $(pwd)/.gpu-old/lockstep-bench --device cuda:0 --filter '^softmax_rows$' --json $OUT/old$r.json
  grep -E "^\| cuda.*softmax_rows" $OUT/old$r.log | tee -a $sm
  step 90 "new round $r" new$r.log $G/lockstep-bench --device cuda:0 --filter '^softmax_rows$' --json $OUT/new$r.json
  grep -E "^\| cuda.*softmax_rows" $OUT/new$r.log | tee -a $sm
done
RC_PARAMS="max_success=1000" step 200 "softmax property 1000" props_softmax.log $G/lockstep_proptests --gtest_filter='Kernels.SoftmaxRows'
grep -E "^\[ +(OK|FAILED)|Falsifiable|PASSED|OK, passed" $OUT/props_softmax.log | tee -a $sm
step 60 "softmax unit tests" softmax_units.log $G/lockstep_tests --gtest_filter='*Softmax*'
grep -E "^\[  (PASSED|FAILED)|FAILED|Failure|SKIPPED \]" $OUT/softmax_units.log | head -6 | tee -a $sm
step 120 "memcheck softmax" memcheck.log compute-sanitizer --tool memcheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*Kernels.Softmax*/cuda'
grep -E "ERROR SUMMARY|PASSED|FAILED" $OUT/memcheck.log | tail -3 | tee -a $sm
echo "elapsed $(( $(date +%s) - T0 )) s" | tee -a $sm
