#!/usr/bin/env bash
# Builds the libFuzzer targets (preset `fuzz`: clang, ASan + UBSan) and runs each for a while.
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET]   (default 60), or
#        scripts/fuzz.sh --runs N               (N executions per target from a fixed seed: what CI runs, so
#                                                that its verdict is the same every time)
# A crash leaves its input in build/fuzz/crashes/ and the script fails.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
if [ "${1:-}" = "--runs" ]; then
  limit=(-runs="${2:?--runs needs a count}" -seed=1)
  what="${2} runs"
else
  limit=(-max_total_time="${1:-60}")
  what="${1:-60}s"
fi
"$KILN_ROOT/scripts/install-deps.sh"
if ! command -v clang++ >/dev/null || ! dpkg-query -W libclang-rt-14-dev >/dev/null 2>&1; then
  say "installing clang and its fuzzer runtime"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang libclang-rt-14-dev >/dev/null
fi
"$KILN_ROOT/scripts/build.sh" fuzz
cd "$KILN_ROOT/build/fuzz"
mkdir -p crashes
for t in tests/fuzz_*; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  mkdir -p "corpus/$name"
  case "$name" in
    fuzz_chat_template) seeds="$KILN_ROOT/tests/data/templates" ;;  # the real templates as seeds
    *) seeds="$KILN_ROOT/tests/fuzz/seeds/$name" ;;
  esac
  say "fuzzing $name for $what"
  "$t" "${limit[@]}" -rss_limit_mb=2048 -timeout=10 -artifact_prefix=crashes/ \
    "corpus/$name" $( [ -d "$seeds" ] && echo "$seeds" ) 2>&1 | tail -n 3
done
