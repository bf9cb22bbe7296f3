#!/usr/bin/env python3
"""kiln perplexity --kl-divergence against llama.cpp's llama-perplexity, on the same pair of GGUF files and text.

usage: bench/kld_vs_llamacpp.py [--base BASE.gguf] [--quant Q.gguf] [--text FILE] [-c 512] [--chunks K]
                                [-t THREADS] [--build-only]

Run with the test venv's Python after `scripts/build.sh release kiln` (KILN_BIN picks another binary).

- llama-perplexity is built once from the llama-cpp-python source package that scripts/gpu-deps.sh fetches
  (~/.cache/kiln/peer/llama_cpp_python-VERSION.tar.gz), trimmed to the CPU backend and that one tool, under
  ~/.cache/kiln/peer-build/llama.cpp (PEER_BUILD_DIR overrides; an existing build is reused). About 10-15 minutes
  on 2 cores.
- The pair: BASE (default: the default model, SmolLM2-135M Q4_1) and Q (default: BASE's weights dequantized and
  requantized to Q4_0 by gguf-py, tests/python/requant_gguf.py, written once to ~/.cache/kiln/bench/).
- The text (default: the Python tests' parity text) is scored by BASE with --kl-divergence-base in both tools,
  each writing its own base file; then Q is evaluated by both tools against both base files (kiln reads
  llama.cpp's file and llama.cpp reads kiln's). Printed: the four summaries side by side, kiln / llama.cpp ratios
  on the same base file, and how far apart the two base files are (tokens equal, mean |difference| of the
  stored log-probabilities).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "python"))
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kiln"
MODELS = Path(os.environ.get("KILN_MODELS_DIR") or CACHE / "models")
KILN = Path(os.environ.get("KILN_BIN", ROOT / "build/release/tools/kiln/kiln"))
PEER_BUILD = Path(os.environ.get("PEER_BUILD_DIR") or CACHE / "peer-build" / "llama.cpp")
SMOL = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"


def peer_version() -> str:
    for line in (ROOT / "scripts" / "requirements-test.txt").read_text().splitlines():
        if line.startswith("llama-cpp-python=="):
            return line.split("==")[1].strip()
    sys.exit("scripts/requirements-test.txt does not pin llama-cpp-python")


def build_llama_perplexity() -> Path:
    """llama-perplexity of the pinned llama.cpp, CPU backend only, built once under PEER_BUILD."""
    binary = PEER_BUILD / "build" / "bin" / "llama-perplexity"
    if binary.exists():
        return binary
    version = peer_version()
    sdist = CACHE / "peer" / f"llama_cpp_python-{version}.tar.gz"
    if not sdist.exists():
        sys.exit(f"missing {sdist}: run scripts/gpu-deps.sh (it downloads the source package)")
    if not (PEER_BUILD / "CMakeLists.txt").exists():
        print(f"unpacking llama.cpp {version} into {PEER_BUILD}", file=sys.stderr)
        prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
        with tempfile.TemporaryDirectory() as tmp, tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            tar.extractall(tmp, members=members, filter="data")
            src = Path(tmp) / prefix
            for d in ("models", "docs", "tests", "examples", "pocs", "benches", "media", "gguf-py", "conversion",
                      "scripts", "skills", "ci", "app", "grammars"):
                shutil.rmtree(src / d, ignore_errors=True)
            for d in (src / "tools").iterdir():
                if d.is_dir() and d.name != "perplexity":
                    shutil.rmtree(d)
            for d in (src / "ggml" / "src").glob("ggml-*/"):
                if d.is_dir() and d.name != "ggml-cpu":
                    shutil.rmtree(d)
            (src / "tools" / "CMakeLists.txt").write_text("llama_add_compile_flags()\nadd_subdirectory(perplexity)\n")
            PEER_BUILD.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(src), PEER_BUILD)
    build = PEER_BUILD / "build"
    print(f"building llama-perplexity in {build} (about 10-15 minutes on 2 cores)", file=sys.stderr)
    subprocess.run(["cmake", "-S", str(PEER_BUILD), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF",
                    "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF"],
                   check=True, stdout=subprocess.DEVNULL)
    jobs = str(min(os.cpu_count() or 2, 2))
    subprocess.run(["nice", "cmake", "--build", str(build), "-j", jobs, "--target", "llama-perplexity"], check=True)
    return binary
