#!/usr/bin/env bash
# Runs on the GPU machine (through the `device` tool, with .gpu-deps carried: scripts/gpu-deps.sh fetches it):
# unpacks the build dependencies into a prefix, builds the `cuda-dev` preset (sm_90a), runs the C++ tests that
# need no model file, and writes the logs under $OUT.
#   usage (as the `device` command): scripts/gpu-check.sh      carry: [".gpu-deps"]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/kiln-gpu-out}"
mkdir -p "$out"
deps=/tmp/kiln-deps
mkdir -p "$deps"
for f in .gpu-deps/*.deb; do dpkg -x "$f" "$deps"; done
lib="$deps/usr/lib/x86_64-linux-gnu"
export PATH="$deps/usr/bin:$PATH"
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PKG_CONFIG_PATH="$lib/pkgconfig:$deps/usr/share/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$deps"  # the .pc files say prefix=/usr
export CMAKE_PREFIX_PATH="$deps/usr"
export OPENSSL_ROOT_DIR="$deps/usr"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvcc --version | tail -1
  cmake --version | head -1
} | tee "$out/machine.txt"
cmake --preset cuda-dev -DKILN_PYTHON= -DCMAKE_CXX_COMPILER_LAUNCHER= -DCMAKE_CUDA_COMPILER_LAUNCHER= \
  2>&1 | tee "$out/configure.log" | tail -3
cmake --build build/cuda-dev -j "$(nproc)" -- -k 0 2>&1 | tee "$out/build.log" | tail -3
build/cuda-dev/tools/kiln/kiln --version | tee -a "$out/machine.txt"
# The tests that need no model file (the models live on the development machine, not here).
for t in core_tests ops_tests cuda_tests; do
  build/cuda-dev/tests/$t --gtest_brief=1 2>&1 | tee "$out/$t.log" | tail -2
done
