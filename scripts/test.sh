#!/usr/bin/env bash
# The second command: installs what is missing (packages, the test venv, the test models), builds
# the `ci` preset (warnings are errors) and runs the whole test suite with ctest.
# Usage: scripts/test.sh [PRESET]   (ci by default; asan runs the same suite under the sanitizers)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
preset="${1:-ci}"
"$KILN_ROOT/scripts/install-deps.sh"
"$KILN_ROOT/scripts/setup-venv.sh"
"$KILN_ROOT/scripts/fetch-models.sh"
"$KILN_ROOT/scripts/build.sh" "$preset"
cd "$KILN_ROOT"
ctest --preset "$preset" -j"$(nproc)"
