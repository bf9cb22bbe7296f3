# Shared by the scripts in this folder: paths and small helpers. Source it, do not run it.
KILN_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KILN_CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/kiln"
KILN_MODELS_DIR="${KILN_MODELS_DIR:-$KILN_CACHE/models}"
KILN_VENV="${KILN_VENV:-$KILN_CACHE/venv}"
export KILN_MODELS_DIR

say() { printf '\033[1m[kiln]\033[0m %s\n' "$*" >&2; }
die() { printf '[kiln] error: %s\n' "$*" >&2; exit 1; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}
