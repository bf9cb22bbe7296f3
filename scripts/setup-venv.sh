#!/usr/bin/env bash
# Makes the Python venv of test-only tools ($KILN_VENV, default ~/.cache/kiln/venv) from
# scripts/requirements-test.txt. Idempotent: skipped when the requirements have not changed.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

req="$KILN_ROOT/scripts/requirements-test.txt"
stamp="$KILN_VENV/.kiln-requirements.sha256"
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ -x "$KILN_VENV/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
say "making the test venv at $KILN_VENV (test-only tools; a few minutes the first time)"
[ -x "$KILN_VENV/bin/python" ] || python3 -m venv "$KILN_VENV"
"$KILN_VENV/bin/python" -m pip install --quiet --upgrade pip
"$KILN_VENV/bin/python" -m pip install --quiet -r "$req"
echo "$want" > "$stamp"
