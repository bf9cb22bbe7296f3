#!/usr/bin/env bash
# The first command for a new user: installs what is missing, builds kiln, fetches the default model
# and runs the main job on it. Idempotent; fast when everything is already there.
# Extra arguments go to kiln.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
"$KILN_ROOT/scripts/install-deps.sh"
"$KILN_ROOT/scripts/fetch-models.sh" --default-only
"$KILN_ROOT/scripts/build.sh" release kiln >&2  # the CLI only: tests build with scripts/test.sh
kiln="$KILN_ROOT/build/release/tools/kiln/kiln"
if [ $# -gt 0 ]; then exec "$kiln" "$@"; fi
exec "$kiln" run -m "$KILN_MODELS_DIR/SmolLM2-135M-Instruct.Q4_1.gguf" --chat --temp 0 -n 64 \
  -p "Write one sentence about the sea."
