#!/usr/bin/env bash
# Instructions per element of the CPU device's softmax_rows, counted by callgrind (deterministic;
# this VM has no hardware counters): the row-major code (Note [row-major softmax]) and the lane
# code (LOCKSTEP_CPU_SOFTMAX_LANES=1), each over 2 calls on 32 rows of 4096 (every thread counted),
# inside the kernel's function only (CpuExec's softmax_row, or run_range<SoftmaxRows, ...>).
# Usage: tools/host/softmax_instructions.sh [build dir, default build/default]
source "$(dirname "$0")/driver.sh"
build_driver softmax_calls
rows=32 n=4096 reps=2
elements=$(( rows * n * reps ))
for lanes in 0 1; do
  LOCKSTEP_CPU_SOFTMAX_LANES=$lanes valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.$lanes" \
      "$tmp/softmax_calls" $rows $n $reps > /dev/null 2>&1
  name=$([ $lanes = 0 ] && echo "row-major" || echo "lane code")
  callgrind_annotate --threshold=100 "$tmp/cg.$lanes" 2>/dev/null |
    grep -E "softmax_row\(|run_range<lockstep::kernels::SoftmaxRows" | head -1 |
    awk -v e=$elements -v name="$name" '{gsub(",", "", $1); printf "%s: %d instructions in the kernel, %.2f per element\n", name, $1, $1 / e}'
done
