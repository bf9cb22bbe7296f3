#!/usr/bin/env bash
# Configures and builds one CMake preset (default: release). Usage: scripts/build.sh [PRESET]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
preset="${1:-release}"
cd "$KILN_ROOT"
if [ -x "$KILN_VENV/bin/python" ]; then export KILN_PYTHON="$KILN_VENV/bin/python"; fi
if [ ! -f "build/$preset/build.ninja" ] || [ "${KILN_PYTHON:-}" != "$(sed -n 's/^KILN_PYTHON:FILEPATH=//p' "build/$preset/CMakeCache.txt" 2>/dev/null)" ]; then
  cmake --preset "$preset" >/dev/null
fi
cmake --build --preset "$preset" -- -j"$(nproc)"
