#!/usr/bin/env bash
# Makes the Python venv of test-only tools ($KILN_VENV, default ~/.cache/kiln/venv) from
# scripts/requirements-test.txt. Idempotent: skipped when the requirements and the peer's build flags have not
# changed.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

# llama-cpp-python (the peer in the parity tests) is compiled from source, by default for the build machine
# (-march=native). On a processor that reports AMX, that build runs its matmuls in AMX tiles, and it was killed
# by SIGILL on the Intel Xeon the tests run on (a machine that grants the tile state to a process that asks,
# as kiln's `amx` level does): there it is built for the processor's SIMD levels up to AVX-512, named one by
# one, without AMX. CMAKE_ARGS set by the caller is used as it is.
peer_cmake_args() {
  local flags args
  flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
  [[ "$flags" == *" amx_tile "* ]] || return 0
  args="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  local f opt
  for f in avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx_vnni:AVX_VNNI avx512f:AVX512 \
           avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
    opt=${f#*:}
    if [[ "$flags" == *" ${f%%:*} "* ]]; then args+=" -DGGML_$opt=ON"; else args+=" -DGGML_$opt=OFF"; fi
  done
  echo "$args"
}
export CMAKE_ARGS="${CMAKE_ARGS:-$(peer_cmake_args)}"

req="$KILN_ROOT/scripts/requirements-test.txt"
stamp="$KILN_VENV/.kiln-requirements.sha256"
want=$( (cat "$req"; echo "CMAKE_ARGS=$CMAKE_ARGS") | sha256sum | cut -d' ' -f1)
if [ -x "$KILN_VENV/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
say "making the test venv at $KILN_VENV (test-only tools; a few minutes the first time)"
[ -x "$KILN_VENV/bin/python" ] || python3 -m venv "$KILN_VENV"
# The peer goes in last, built with CMAKE_ARGS and never from pip's wheel cache (it may hold a build made
# with other flags); a venv made before with other flags has it rebuilt.
peer_args="$KILN_VENV/.kiln-peer-cmake-args"
peer=$(grep -E '^llama-cpp-python==' "$req")
"$KILN_VENV/bin/python" -m pip install --quiet --upgrade pip
"$KILN_VENV/bin/python" -m pip install --quiet -r <(grep -vE '^llama-cpp-python==' "$req")
if ! "$KILN_VENV/bin/python" -c "import llama_cpp" 2>/dev/null; then
  "$KILN_VENV/bin/python" -m pip install --quiet --no-cache-dir "$peer"
elif [ "$(cat "$peer_args" 2>/dev/null)" != "$CMAKE_ARGS" ]; then
  say "rebuilding $peer with CMAKE_ARGS=${CMAKE_ARGS:-(none)}"
  "$KILN_VENV/bin/python" -m pip install --quiet --no-cache-dir --force-reinstall --no-deps "$peer"
fi
echo "$CMAKE_ARGS" > "$peer_args"
echo "$want" > "$stamp"
