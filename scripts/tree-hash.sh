#!/usr/bin/env bash
# Prints the hash of the files a build of kiln reads (sources, headers, CMake files) in this tree:
# scripts/gpu-deps.sh --kiln-binaries stores it beside the binaries it packs, and scripts/gpu-check.sh uses those
# only in a tree that gives the same hash.
set -euo pipefail
cd "$(dirname "$0")/.."
find CMakeLists.txt CMakePresets.json cmake src include tools tests bench -type f \
  \( -name '*.c' -o -name '*.cc' -o -name '*.cpp' -o -name '*.h' -o -name '*.hpp' -o -name '*.cu' -o -name '*.cuh' \
  -o -name '*.inc' -o -name '*.in' -o -name 'CMakeLists.txt' -o -name '*.cmake' -o -name '*.json' \) \
  ! -path bench/cublaslt_probe.cu -print0 |
  LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1
