#!/usr/bin/env bash
# Run 157 (thirty-second session): softmax_rows, three rounds alternating 62c076c (.gpu-old),
# fa3e3c3 (.gpu-b: Note [batched loads], main) and an experiment (.gpu-n: the long rows' GPU
# passes in a __noinline__ device function). Each folder: liblockstep.so.0 and lockstep-bench;
# .gpu-old also libtbb and libhwy. Run (carry [".gpu-old", ".gpu-b", ".gpu-n"]): bash tools/gpu/run157.sh
export OUT; R=$(pwd)
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
for r in 1 2 3; do
  for v in old b n; do
    LD_LIBRARY_PATH=$R/.gpu-$v:$R/.gpu-old timeout 90 $R/.gpu-$v/lockstep-bench --device cuda:0 --filter '^softmax_rows$' --json $OUT/$v$r.json > $OUT/$v$r.log 2>&1
    rc=$?; echo "$v round $r ($(cut -c1-7 $R/.gpu-$v/COMMIT)) rc=$rc"; grep -E "^\| cuda.*softmax_rows" $OUT/$v$r.log
  done
done
