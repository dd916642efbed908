# Sourced by tools/gpu/run119{a,b,c}.sh on the GPU machine: paths, the summary file, the call's
# time budget (BUDGET seconds from now; the device tool allows 10 minutes a command) and step.
export OUT; G=$(pwd)/.gpu
export LD_LIBRARY_PATH=$G
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
