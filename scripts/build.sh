#!/usr/bin/env bash
# Configures and builds one CMake preset (default: release), all of it or only the named targets.
# Usage: scripts/build.sh [PRESET [TARGET...]]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
preset="${1:-release}"
shift || true
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cd "$KILN_ROOT"
if [ -x "$KILN_VENV/bin/python" ]; then export KILN_PYTHON="$KILN_VENV/bin/python"; fi
if [ ! -f "build/$preset/build.ninja" ] || [ "${KILN_PYTHON:-}" != "$(sed -n 's/^KILN_PYTHON:FILEPATH=//p' "build/$preset/CMakeCache.txt" 2>/dev/null)" ]; then
  cmake --preset "$preset" >/dev/null
fi
cmake --build --preset "$preset" "${targets[@]}" -- -j"$(nproc)"
