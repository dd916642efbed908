# Sourced by tools/gpu/run119{a,b,c}.sh on the GPU machine: paths, the summary file, the call's
# time budget (BUDGET seconds from now; the device tool allows 10 minutes a command) and step.
export OUT; G=$(pwd)/.gpu
export LD_LIBRARY_PATH=$G
# A CUDA test or property fails instead of skipping when CUDA is not usable (tests/support/backends.hpp).
export LOCKSTEP_TEST_REQUIRE_CUDA=1
sm=$OUT/summary.txt
T0=$(date +%s); BUDGET=${BUDGET:-545}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
step() {  # step <seconds> <label> <log> <command...>: run with that timeout if the budget holds it
  local need=$1 label=$2 log=$3; shift 3
  if [ $(left) -lt $need ]; then echo "$label skipped: $(left) s left" | tee -a $sm; return; fi
  local t0=$(date +%s)
  timeout $need "$@" > $OUT/$log 2>&1
  echo "$label rc=$? in $(( $(date +%s) - t0 )) s" | tee -a $sm
}
echo "commit $(cat $G/COMMIT)" | tee -a $sm
# Stops the call (exit 3) unless cuobjdump is there and the library has no unset descriptor: an
# unset descriptor is an illegal instruction that loses the context for every later step.
check_descriptors_or_stop() {
  command -v cuobjdump > /dev/null || { echo "no cuobjdump: descriptors not checked; stopping" | tee -a $sm; exit 3; }
  cuobjdump -sass $G/liblockstep.so.0 > $OUT/sass.txt; python3 $G/check_descriptors.py $OUT/sass.txt > $OUT/desc.txt; local rc=$?
  tail -1 $OUT/desc.txt | tee -a $sm; rm -f $OUT/sass.txt; [ $rc = 0 ] || exit 3
}
# Note [four wgmma blocks per SM]: ncu's occupancy limits of both head_dim 64 wgmma schedules
# (LOCKSTEP_FUSED_TC_WGMMA_SERIAL=0/1) at 16x16x1024x64 causal, the last attention_fused shape on
# cuda: the serial schedule is worth timing only if the SM holds four of its blocks.
ncu_wgmma_occupancy() {
  for serial in 0 1; do
    LOCKSTEP_FUSED_TC_WGMMA_SERIAL=$serial step 60 "ncu occupancy, serial $serial" ncu-$serial.log ncu --clock-control none --kernel-name-base demangled --kernel-name regex:'FusedAttentionWgmma<\(int\)64, \(int\)1' --launch-count 1 \
      --metrics gpu__time_duration.sum,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,launch__occupancy_limit_warps,sm__warps_active.avg.pct_of_peak_sustained_active,sm__inst_issued.avg.pct_of_peak_sustained_active,launch__registers_per_thread \
      $G/lockstep-bench --device cuda:0 --filter attention_fused --reps 2
    grep -E "FusedAttentionWgmma|gpu__time|occupancy_limit|warps_active|inst_issued|registers" $OUT/ncu-$serial.log | sed 's/  */ /g' | head -12 | tee -a $sm
  done
}
