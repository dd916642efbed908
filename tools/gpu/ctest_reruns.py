#!/usr/bin/env python3
"""Runs the test suite's reruns of the unit tests on the GPU machine: the ctest entries (from
`ctest --show-only=json-v1`, which `tools/gpu/verify.sh stage` saves as .gpu/ctest.json) that run
lockstep_tests again with a filter or an environment of their own. Entries that run one test
(gtest_discover_tests's), other programs, or settings of the CPU device alone are left out: the
unit tests ran once already, and CI runs the CPU device's.

Usage: ctest_reruns.py GPU_DIR OUT_DIR   (prints a line per rerun; exit status 1 if one failed)
"""
import json
import os
import re
import subprocess
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    gpu, out = sys.argv[1], sys.argv[2]
    with open(os.path.join(gpu, "ctest.json")) as f:
        tests = json.load(f)["tests"]
    failed = 0
    reruns = 0
    for t in tests:
        cmd = t.get("command") or []
        if not cmd or os.path.basename(cmd[0]) != "lockstep_tests" or "--gtest_also_run_disabled_tests" in cmd:
            continue
        env_list = next((p["value"] for p in t.get("properties", []) if p["name"] == "ENVIRONMENT"), [])
        env_list = [env_list] if isinstance(env_list, str) else env_list
        settings = [e for e in env_list if not e.startswith("LOCKSTEP_CPU_POISON=")]
        if settings and all(e.startswith("LOCKSTEP_CPU_") for e in settings):
            continue
        env = dict(os.environ, **dict(e.split("=", 1) for e in env_list))
        log = os.path.join(out, "rerun-" + re.sub(r"[^A-Za-z0-9_.-]", "_", t["name"]) + ".log")
        with open(log, "w") as f:
            rc = subprocess.call([os.path.join(gpu, "lockstep_tests")] + cmd[1:], env=env, stdout=f,
                                 stderr=subprocess.STDOUT)
        with open(log) as f:
            counts = [l.strip() for l in f if re.match(r"\[  (PASSED  |FAILED  )\] \d+ tests?", l)]
        failed |= rc != 0
        reruns += 1
        print(f"  rerun {t['name']} ({' '.join(settings) or 'no settings'}): {' '.join(counts) or 'rc ' + str(rc)}")
    if reruns == 0:
        print("  reruns: none in the test list")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
