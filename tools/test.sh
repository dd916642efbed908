#!/usr/bin/env bash
# Quick start, command 2 (what CI runs, .ci/run): installs what is missing, builds, and runs the
# whole test suite: unit tests on every backend (the CUDA instances skip where no GPU is usable),
# the property tests, the `lockstep` tool's runs, the README's example, the consumer example
# against a fresh install and the benchmark smoke test. Then one line per reason tests were
# skipped, with their count.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
tools/deps.sh
cmake --preset default > /dev/null
cmake --build --preset default
junit=build/default/ctest-junit.xml
rm -f "$junit"
rc=0
ctest --preset default --output-junit "$(pwd)/$junit" || rc=$?

# ctest prints "Skipped" without the reason; the JUnit report holds each skipped test's output,
# where GoogleTest writes the reason on the line after "<file>:<line>: Skipped".
if [ -f "$junit" ]; then
  awk '
    function unxml(s) {
      gsub(/&lt;/, "<", s); gsub(/&gt;/, ">", s); gsub(/&quot;/, "\"", s); gsub(/&apos;/, "\047", s)
      gsub(/&amp;/, "\\&", s)
      return s
    }
    /<testcase / { skipped = 0; reason = ""; message = ""; output = 0; next_is_reason = 0 }
    /<skipped message="/ {
      skipped = 1
      message = $0; sub(/.*<skipped message="/, "", message); sub(/".*/, "", message)
      message = unxml(message)
    }
    /<system-out>/ { output = 1; sub(/.*<system-out>/, "") }
    output {
      line = $0; sub(/<\/system-out>.*/, "", line)
      if (next_is_reason && reason == "" && line !~ /^\[  SKIPPED \]/) reason = unxml(line)
      next_is_reason = line ~ /: Skipped$/
    }
    /<\/system-out>/ { output = 0 }
    /<\/testcase>/ {
      if (skipped) count[reason != "" ? reason : "(no reason given: " message ")"]++
      skipped = 0
    }
    END { for (r in count) printf "%6d  %s\n", count[r], r }
  ' "$junit" | sort -rn > build/default/skip-reasons.txt
  if [ -s build/default/skip-reasons.txt ]; then
    echo "skipped tests, by reason:"
    cat build/default/skip-reasons.txt
  fi
fi
echo "test suite: $(( $(date +%s) - start )) s"
exit $rc
