#!/usr/bin/env bash
# Runs on the GPU machine from the repository root: bash .gpu/run.sh <cases> <stages...>
# stages: info tests props props_fused parity memcheck racecheck bench bench_g2 knobs variants peers sass ncu ncu_detail mathacc
# env: BENCH_FILTER, KNOBS, SAN_CASES, SAN_PROPS (gtest filter of the properties under the sanitizers),
# RACE_FILTER, FUSED_CASES, VARIANT_ROUNDS
set -u
cases=$1; shift
G=$(pwd)/.gpu
export LD_LIBRARY_PATH=$G
# A CUDA test or property fails instead of skipping when CUDA is not usable (tests/support/backends.hpp).
export LOCKSTEP_TEST_REQUIRE_CUDA=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
summary="$OUT/summary.txt"
echo "commit $(cat $G/COMMIT)" | tee -a "$summary"
for stage in "$@"; do
  t0=$(date +%s)
  case $stage in
    info)
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv | tee -a "$summary"
      $G/lockstep devices | tee -a "$summary"
      nproc | sed 's/^/host cores: /' | tee -a "$summary"
      grep -m1 "model name" /proc/cpuinfo | tee -a "$summary" ;;
    tests)
      $G/lockstep_tests > "$OUT/tests.log" 2>&1; rc=$?
      echo "unit tests rc=$rc: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/tests.log" | tr '\n' ' ')" | tee -a "$summary"
      grep -E "FAILED|Failure" "$OUT/tests.log" | head -20 | tee -a "$summary" ;;
    props_fused)  # the fused kernels first: a quick look before the long stages
      RC_PARAMS="max_success=${FUSED_CASES:-200}" $G/lockstep_proptests --gtest_filter='*Fused*' > "$OUT/props_fused.log" 2>&1; rc=$?
      echo "fused properties (${FUSED_CASES:-200} cases) rc=$rc:" | tee -a "$summary"
      grep -E "^\[       OK \]|^\[  FAILED  \]|differ|outside|unwritten|reproduce|Falsifiable" "$OUT/props_fused.log" | head -20 | tee -a "$summary" ;;
    props)
      RC_PARAMS="max_success=$cases" $G/lockstep_proptests > "$OUT/props.log" 2>&1; rc=$?
      echo "properties ($cases cases each) rc=$rc:" | tee -a "$summary"
      grep -E "^\[       OK \]|^\[  FAILED  \]|differ|outside|unwritten|reproduce" "$OUT/props.log" | head -30 | tee -a "$summary" ;;
    parity)
      $G/lockstep parity --cases 100 > "$OUT/parity.log" 2>&1; rc=$?
      echo "parity rc=$rc" | tee -a "$summary"; cat "$OUT/parity.log" | tee -a "$summary" ;;
    memcheck)
      # The out-of-memory test provokes a failing cudaMalloc on purpose: not a memory error.
      compute-sanitizer --tool memcheck --error-exitcode 9 $G/lockstep_tests --gtest_filter='*cuda*:CudaInterop*:-CudaInterop.OutOfMemory*' > "$OUT/memcheck.log" 2>&1; rc=$?
      RC_PARAMS="max_success=${SAN_CASES:-25}" compute-sanitizer --tool memcheck --error-exitcode 9 $G/lockstep_proptests --gtest_filter="${SAN_PROPS:-*}" >> "$OUT/memcheck.log" 2>&1; rc2=$?
      echo "memcheck on properties (${SAN_CASES:-25} cases each) rc=$rc2" | tee -a "$summary"
      echo "memcheck rc=$rc: $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)" | tee -a "$summary"
      grep -E "^\[  (PASSED|FAILED) " "$OUT/memcheck.log" | tee -a "$summary" ;;
    racecheck)
      compute-sanitizer --tool racecheck --error-exitcode 9 $G/lockstep_tests --gtest_filter="${RACE_FILTER:-*cuda*}" > "$OUT/racecheck.log" 2>&1; rc=$?
      RC_PARAMS="max_success=${SAN_CASES:-25}" compute-sanitizer --tool racecheck --error-exitcode 9 $G/lockstep_proptests --gtest_filter="${SAN_PROPS:-*}" >> "$OUT/racecheck.log" 2>&1; rc2=$?
      echo "racecheck on properties (${SAN_CASES:-25} cases each) rc=$rc2" | tee -a "$summary"
      echo "racecheck rc=$rc: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/racecheck.log" | tail -2 | tr '\n' ' ')" | tee -a "$summary"
      grep -E "^\[  (PASSED|FAILED) " "$OUT/racecheck.log" | tee -a "$summary" ;;
    bench)  # benchmark names (BENCH_FILTER): decode (= incremental_attention), flash_decoding, flash_decoding_graph_step, ...
      $G/lockstep-bench --device cuda:0 --json "$OUT/bench_cuda.json" ${BENCH_FILTER:+--filter "$BENCH_FILTER"} > "$OUT/bench.log" 2>&1; rc=$?
      echo "bench rc=$rc" | tee -a "$summary"; grep -E "ceilings|^\|" "$OUT/bench.log" | tee -a "$summary" ;;
    bench_g2)  # decode with at most 2 query heads per block (same bits, different schedule)
      LOCKSTEP_DECODE_HEAD_DIM_PRODUCT=256 $G/lockstep-bench --device cuda:0 --filter 'decode' --json "$OUT/bench_g2.json" > "$OUT/bench_g2.log" 2>&1; rc=$?
      echo "bench (heads per block * head_dim <= 256) rc=$rc" | tee -a "$summary"; grep -E "^\| cuda" "$OUT/bench_g2.log" | tee -a "$summary" ;;
    knobs)  # decode schedule variants (same bits): KNOBS="cfg cfg ..." with cfg = VAR=VAL[,VAR=VAL]
      i=0
      for cfg in ${KNOBS:-LOCKSTEP_PDL=0 LOCKSTEP_DECODE_STAGES=3}; do
        i=$((i+1))
        env $(echo "$cfg" | tr ',' ' ') $G/lockstep-bench --device cuda:0 --filter "${BENCH_FILTER:-decode}" --json "$OUT/bench_knob$i.json" > "$OUT/bench_knob$i.log" 2>&1; rc=$?
        echo "knobs $i: $cfg rc=$rc" | tee -a "$summary"; grep -E "^\| cuda" "$OUT/bench_knob$i.log" | tee -a "$summary"
      done ;;
    variants)  # the same benchmarks with each library in .gpu/var/<name>/ (and .gpu/old/ with its own bench), alternating rounds
      for round in $(seq 1 ${VARIANT_ROUNDS:-1}); do
        for d in $G/var/*/ $G/old/; do
          [ -f "$d/liblockstep.so.0" ] || continue
          name=$(basename "$d"); bin=$G/lockstep-bench; [ -x "$d/lockstep-bench" ] && bin=$d/lockstep-bench
          LD_LIBRARY_PATH=$d:$G $bin --device cuda:0 ${BENCH_FILTER:+--filter "$BENCH_FILTER"} ${BENCH_REPS:+--reps $BENCH_REPS} --json "$OUT/var-$name-$round.json" > "$OUT/var-$name-$round.log" 2>&1; rc=$?
          echo "variant $name round $round rc=$rc" | tee -a "$summary"; grep -E "^\| cuda" "$OUT/var-$name-$round.log" | tee -a "$summary"
        done
        $G/lockstep-bench --device cuda:0 ${BENCH_FILTER:+--filter "$BENCH_FILTER"} ${BENCH_REPS:+--reps $BENCH_REPS} --json "$OUT/var-head-$round.json" > "$OUT/var-head-$round.log" 2>&1; rc=$?
        echo "variant head round $round rc=$rc" | tee -a "$summary"; grep -E "^\| cuda" "$OUT/var-head-$round.log" | tee -a "$summary"
      done ;;
    ncu)  # per-kernel times of the head_dim-128 decode kernels (the whisper shape comes first and is skipped; clocks left alone)
      ncu --clock-control none --kernel-name-base demangled --kernel-name regex:"${NCU_KERNELS:-Decode.*\(int\)128}" --launch-count ${NCU_COUNT:-8} \
          --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__registers_per_thread \
          $G/lockstep-bench --device cuda:0 --filter "${NCU_FILTER:-decode}" --reps 2 > "$OUT/ncu.log" 2>&1; rc=$?
      echo "ncu rc=$rc" | tee -a "$summary"
      grep -E "entry<|gpu__time|dram__|warps_active|grid_size|registers" "$OUT/ncu.log" | sed 's/  */ /g' | head -150 | tee -a "$summary" ;;
    ncu_detail)  # why the chunk kernel is where it is: stall reasons, occupancy, memory (NCU_ENV: knobs)
      for f in '^decode$' '^flash_decoding$'; do  # bench names: decode = incremental_attention
        env ${NCU_ENV:-} ncu --clock-control none --kernel-name-base demangled --kernel-name regex:"DecodeChunk<\\(int\\)128, \\(int\\)[14]" --launch-skip 1 --launch-count 1 \
            --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
            --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio \
            $G/lockstep-bench --device cuda:0 --filter "$f" --reps 1 >> "$OUT/ncu_detail.log" 2>&1; rc=$?
        echo "ncu_detail $f ${NCU_ENV:-default} rc=$rc" | tee -a "$summary"
      done
      grep -E "entry|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Block Limit|Registers Per|Issued Warp|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|Stall|L2 Hit|L1/TEX Hit|Shared Memory Configuration|Dynamic Shared|stalled" "$OUT/ncu_detail.log" | sed 's/  */ /g' | tail -${NCU_LINES:-120} | tee -a "$summary" ;;
    mathacc)
      $G/lockstep mathacc --device cuda:0 --stride ${MATH_STRIDE:-1} > "$OUT/mathacc.log" 2>&1; rc=$?
      echo "mathacc rc=$rc" | tee -a "$summary"; cat "$OUT/mathacc.log" | tee -a "$summary" ;;
    peers)
      PYTHONUNBUFFERED=1 python3 $G/torch_peers.py --prefill --json "$OUT/peers.json" > "$OUT/peers.log" 2>&1; rc=$?
      echo "peers rc=$rc" | tee -a "$summary"; tail -40 "$OUT/peers.log" | tee -a "$summary" ;;
    sass)
      cuobjdump --dump-resource-usage $G/liblockstep.so.0 > "$OUT/sass.txt" 2>&1
      cuobjdump --dump-sass $G/liblockstep.so.0 > /tmp/sass_full.txt 2>&1
      echo "tensor-core instructions (HMMA) in GemmTensorCore: $(awk '/Function : .*GemmTensorCore/{f=1} /Function : /&&!/GemmTensorCore/{f=0} f' /tmp/sass_full.txt | grep -c HMMA)" | tee -a "$summary"
      echo "tensor-core instructions (HMMA) in FusedAttentionTensorCore<128>: $(awk '/Function : .*FusedAttentionTensorCoreILi128/{f=1;next} /Function : /{f=0} f' /tmp/sass_full.txt | grep -c HMMA)" | tee -a "$summary"
      grep -A1 "FusedAttentionTensorCore\|DecodeChunk\|DecodeMerge" "$OUT/sass.txt" | grep -E "Function|REG" | paste - - | sed 's/_ZN8lockstep4cuda5entryINS_7kernels//;s/EEEEvNT_6ParamsE//' | awk '{print $2, $3, $4, $5, $6, $7}' | tee -a "$summary"
      echo "FFMA in DecodeChunk<128,4>: $(awk '/Function : .*DecodeChunkILi128ELi4/{f=1;next} /Function : /{f=0} f' /tmp/sass_full.txt | grep -c FFMA)" | tee -a "$summary"
      echo "kernels with local memory (LDL/STL): $(awk '/Function : /{fn=$3} /LDL|STL/{print fn}' /tmp/sass_full.txt | sort -u | wc -l)" | tee -a "$summary"
      awk '/Function : /{fn=$3} /LDL|STL/{print fn}' /tmp/sass_full.txt | sort | uniq -c | head -20 | tee -a "$summary" ;;
  esac
  echo "[stage $stage: $(( $(date +%s) - t0 )) s]" | tee -a "$summary"
done
