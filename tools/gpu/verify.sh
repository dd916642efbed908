#!/usr/bin/env bash
# The GPU verification and benchmarks, in named stages.
#
#   tools/gpu/verify.sh stage                 on the build machine: builds the gpu preset (sm_90a,
#                                             static CUDA runtime; BUILD_DIR: an existing CUDA
#                                             build instead) and fills .gpu/ with what the GPU
#                                             machine needs
#   tools/gpu/verify.sh [--cases N] [STAGE ...]   on the GPU machine, from the repository root
#                                             (default: every stage below, in this order)
#
# Stages on the GPU machine (binaries from .gpu/; logs, JSON and summary.txt under $OUT, ./out
# when OUT is not set; a summary line per stage):
#   tests     the unit tests, then the test suite's reruns of them under other settings (ctest's
#             entries with an environment of their own, e.g. LOCKSTEP_TUNING=...; none is fine)
#   formats   the format conversions (lockstep/formats.hpp) against CUDA's own over all 2^32
#             floats and every code (tools/gpu/formats.cu)
#   props     the properties, CUDA against the CPU device and a float64 oracle, at N cases each
#             (--cases N or PROPS_CASES, default 1000; PROPS_FILTER: a gtest filter)
#   parity    lockstep parity: every kernel on random shapes, CUDA bytes against the CPU's
#   sanitize  compute-sanitizer memcheck over the fused, decode and cache tests, racecheck over
#             the tests of the kernels that share memory between threads
#   bench     lockstep-bench --json (BENCH_ROUNDS rounds, default 1; BENCH_FILTER) and the bare
#             launch's host cost (launch_cost)
#   peers     PyTorch's figures in the same call (bench/peers/)
# With bench (and peers) the call also writes $OUT/results/<card>.json: bench/results/'s file
# for the card with the figures just measured (bench/results/README.md).
#
# LOCKSTEP_TEST_REQUIRE_CUDA=1 is set for every stage: a CUDA test or property fails instead of
# skipping when CUDA is not usable, so a call whose driver or runtime broke cannot pass on the
# CPU's checks alone. Exit status: 0 when every stage passed, 1 otherwise, 2 for a usage error.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
G=${GPU_DIR:-$root/.gpu}
gpu_stages=(tests formats props parity sanitize bench peers)

usage() {
  sed -n '2,/^[^#]/{/^#/p}' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

# ---------------------------------------------------------------------------------------------
# The build machine: build, then copy the binaries, the test list and their shared libraries.
stage_build() {
  # BUILD_DIR: an existing build directory with the CUDA backend for sm_90a (the default preset
  # on a machine with nvcc builds sm_90a and static cudart), built as it is configured.
  local build=${BUILD_DIR:-$root/build/gpu}
  if [ -n "${BUILD_DIR:-}" ]; then
    build=$(cd "$BUILD_DIR" && pwd) || return 1  # absolute: ldd's paths below
  else
    local args=(--preset gpu -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_CUDA_RUNTIME_LIBRARY=Static)
    command -v ccache > /dev/null &&
      args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
    (cd "$root" && cmake "${args[@]}") || return 1
  fi
  cmake --build "$build" -j "${JOBS:-$(nproc)}" || return 1

  rm -rf "$G" && mkdir -p "$G"
  local bins=() name path
  for name in lockstep_tests lockstep_proptests lockstep lockstep-bench; do
    # (not the copies that the install test puts under consumer-install/: they can be older)
    path=$(find "$build" -name "$name" -type f -perm -u+x -not -path '*/CMakeFiles/*' -not -path '*/consumer-install/*' | head -1)
    [ -n "$path" ] || { echo "verify.sh stage: $name not built in $build" >&2; return 1; }
    cp "$path" "$G/" && bins+=("$G/$name")
  done
  # Every shared library the binaries load that is not the base system's (libc, libstdc++, the
  # loader) or the driver's (libcuda comes with the GPU machine's driver).
  local lib
  for lib in $(LD_LIBRARY_PATH="$build" ldd "${bins[@]}" | awk '/=> \// {print $3}' | sort -u); do
    case $(basename "$lib") in
      libc.so*|libm.so*|libstdc++.so*|libgcc_s.so*|ld-linux*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|libutil.so*|libcuda.so*) ;;
      *) cp -L "$lib" "$G/" ;;
    esac
  done
  if LD_LIBRARY_PATH="$build" ldd "${bins[@]}" | grep -q "not found"; then
    echo "verify.sh stage: a library the binaries need is not found (ldd)" >&2; return 1
  fi
  # The test suite's list (ctest's JSON), for the reruns of the unit tests under other settings.
  ctest --test-dir "$build" --show-only=json-v1 > "$G/ctest.json" || return 1
  # The bare launch's host cost (bench stage), where nvcc is at hand.
  local nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
  if [ -x "$nvcc" ]; then
    "$nvcc" -O2 -std=c++17 -arch=sm_90a -cudart static -o "$G/launch_cost" "$root/tools/gpu/launch_cost.cu" \
        -L"$(dirname "$nvcc")/../lib64/stubs" -lcuda || echo "verify.sh stage: launch_cost not built" >&2
    "$nvcc" -O2 -std=c++20 -arch=sm_90a -cudart static -I "$root/core/include" -o "$G/formats" \
        "$root/tools/gpu/formats.cu" || { echo "verify.sh stage: formats not built" >&2; return 1; }
  fi
  local commit
  commit=$(git -C "$root" rev-parse --short=12 HEAD)
  git -C "$root" diff --quiet HEAD -- 2> /dev/null || commit="$commit-dirty"
  echo "$commit" > "$G/COMMIT"
  # ptxas has given asynchronous copies a descriptor register that nothing sets (docs/kernels.md):
  # an illegal instruction at run time that loses the CUDA context for every later stage.
  local cuobjdump=${CUOBJDUMP:-$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)}
  if [ -x "$cuobjdump" ]; then
    "$cuobjdump" -sass "$G/liblockstep.so.0" > "$G/sass.txt" ||
      { echo "verify.sh stage: cuobjdump failed on liblockstep.so.0" >&2; return 1; }
    python3 "$root/tools/gpu/check_descriptors.py" "$G/sass.txt" ||
      { echo "verify.sh stage: unset descriptors ($G/sass.txt): do not run this build" >&2; return 3; }
    rm -f "$G/sass.txt"
  else
    echo "verify.sh stage: no cuobjdump (set CUOBJDUMP; without a full toolkit, PyPI's nvidia-cuda-cuobjdump" \
         "and nvidia-cuda-nvdisasm wheels have both, nvdisasm on PATH): descriptors not checked" >&2
  fi
  du -sh "$G"
}

# ---------------------------------------------------------------------------------------------
# The GPU machine.
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
gtest_counts() {  # the gtest counts of a log, on one line
  grep -E '^\[  (PASSED  |FAILED  |SKIPPED )\] [0-9]+ tests?' "$1" | sed 's/, listed below://' | tr '\n' ' '
}

run_tests() {
  "$G/lockstep_tests" > "$OUT/tests.log" 2>&1
  local rc=$?
  say "  unit tests: $(gtest_counts "$OUT/tests.log")"
  grep -E '^\[  FAILED  \] .*\(' "$OUT/tests.log" | head -20 | tee -a "$OUT/summary.txt"
  python3 "$root/tools/gpu/ctest_reruns.py" "$G" "$OUT" | tee -a "$OUT/summary.txt"
  local rc2=${PIPESTATUS[0]}
  [ "$rc" = 0 ] && [ "$rc2" = 0 ]
}

run_formats() {
  [ -x "$G/formats" ] || { say "  formats: not staged (no nvcc where the stage ran)"; return 1; }
  timeout 300 "$G/formats" > "$OUT/formats.log" 2>&1
  local rc=$?
  tee -a "$OUT/summary.txt" < "$OUT/formats.log"
  return "$rc"
}

run_props() {
  RC_PARAMS="max_success=$cases" "$G/lockstep_proptests" ${PROPS_FILTER:+--gtest_filter="$PROPS_FILTER"} \
      > "$OUT/props.log" 2>&1
  local rc=$?
  say "  properties at $cases cases: $(gtest_counts "$OUT/props.log")"
  grep -E '^\[  FAILED  \] .*\(|Falsifiable|differ|outside' "$OUT/props.log" | head -20 | tee -a "$OUT/summary.txt"
  return "$rc"
}

run_parity() {
  "$G/lockstep" parity --cases "${PARITY_CASES:-20}" > "$OUT/parity.log" 2>&1
  local rc=$?
  say "  $(tail -1 "$OUT/parity.log")"
  return "$rc"
}

run_sanitize() {
  compute-sanitizer --tool memcheck --error-exitcode 9 "$G/lockstep_tests" \
      --gtest_filter="${MEMCHECK_FILTER:-*Fused*cuda*:*Decod*cuda*:*Flash*cuda*:*Incr*cuda*:*Cache*cuda*}" \
      > "$OUT/memcheck.log" 2>&1
  local rc=$?
  say "  memcheck: $(gtest_counts "$OUT/memcheck.log")$(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1 | sed 's/^=* //')"
  compute-sanitizer --tool racecheck --error-exitcode 9 "$G/lockstep_tests" \
      --gtest_filter="${RACECHECK_FILTER:-*FusedWgmma*cuda*:*SplitKeys*cuda*:*FlashDecoding*cuda*}" \
      > "$OUT/racecheck.log" 2>&1
  local rc2=$?
  say "  racecheck: $(gtest_counts "$OUT/racecheck.log")$(grep -E 'RACECHECK SUMMARY' "$OUT/racecheck.log" | tail -1 | sed 's/^=* //')"
  [ "$rc" = 0 ] && [ "$rc2" = 0 ]
}

run_bench() {
  local rc=0 round
  for round in $(seq 1 "${BENCH_ROUNDS:-1}"); do
    "$G/lockstep-bench" --device cuda:0 --json "$OUT/bench-$round.json" \
        ${BENCH_FILTER:+--filter "$BENCH_FILTER"} > "$OUT/bench-$round.log" 2>&1 || rc=1
    say "  lockstep-bench round $round: $(grep -c '^| cuda' "$OUT/bench-$round.log") results"
  done
  if [ -x "$G/launch_cost" ]; then
    timeout 60 "$G/launch_cost" > "$OUT/launch_cost.log" 2>&1 || rc=1
    say "  launch_cost (us per launch, busy and idle stream): $(grep -m1 "driver wrapper" "$OUT/launch_cost.log" | tr -s ' ')"
  fi
  return "$rc"
}

run_peers() {
  local rc=0
  PYTHONUNBUFFERED=1 python3 "$root/bench/peers/torch_peers.py" --prefill --json "$OUT/peers.json" \
      > "$OUT/peers.log" 2>&1 || rc=1
  PYTHONUNBUFFERED=1 python3 "$root/bench/peers/torch_graph_prefill.py" --json "$OUT/peers-graph.json" \
      > "$OUT/peers-graph.log" 2>&1 || rc=1
  python3 "$root/bench/peers/efficient_pipes.py" > "$OUT/peers-efficient.log" 2>&1 || rc=1
  say "  PyTorch: $(grep -h '^torch' "$OUT/peers.log" | head -1)"
  return "$rc"
}

write_results() {
  local bench=("$OUT"/bench-*.json) args=() f
  [ -e "${bench[0]}" ] || return 0
  args=(--bench "${bench[@]}")
  for f in "$OUT/peers.json" "$OUT/peers-graph.json"; do
    [ -e "$f" ] && args+=(--peers "$f")
  done
  local path
  path=$(python3 "$root/tools/gpu/results.py" "${args[@]}" --commit "$(cat "$G/COMMIT")" \
      --merge-dir "$root/bench/results" --out "$OUT/results") &&
    say "results: $path (copy to bench/results/)"
}

main() {
  cases=${PROPS_CASES:-1000}
  local stages=()
  while [ $# -gt 0 ]; do
    case $1 in
      -h|--help) usage 0 ;;
      --cases) [ $# -ge 2 ] || usage 2; cases=$2; shift 2 ;;
      --cases=*) cases=${1#--cases=}; shift ;;
      -*) echo "verify.sh: unknown option $1" >&2; usage 2 ;;
      *) stages+=("$1"); shift ;;
    esac
  done
  [[ $cases =~ ^[1-9][0-9]*$ ]] || { echo "verify.sh: --cases takes a positive count, not '$cases'" >&2; exit 2; }
  if [ "${stages[*]:-}" = stage ]; then
    stage_build; exit $?
  fi
  [ ${#stages[@]} -gt 0 ] || stages=("${gpu_stages[@]}")
  local s
  for s in "${stages[@]}"; do
    [[ " ${gpu_stages[*]} " == *" $s "* ]] ||
      { echo "verify.sh: unknown stage '$s' (stage alone, or: ${gpu_stages[*]})" >&2; exit 2; }
  done
  [ -x "$G/lockstep_tests" ] || { echo "verify.sh: $G has no binaries: run 'tools/gpu/verify.sh stage' first" >&2; exit 2; }

  OUT=${OUT:-$root/out}
  mkdir -p "$OUT"
  export LD_LIBRARY_PATH=$G${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export LOCKSTEP_TEST_REQUIRE_CUDA=1
  say "commit $(cat "$G/COMMIT"); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2> /dev/null | head -1)"
  local failed=0 t0 rc
  for s in "${stages[@]}"; do
    t0=$(date +%s)
    "run_$s"
    rc=$?
    [ $rc = 0 ] || failed=1
    say "stage $s: $([ $rc = 0 ] && echo passed || echo "FAILED (rc $rc)") in $(( $(date +%s) - t0 )) s"
  done
  write_results
  exit $failed
}

main "$@"
