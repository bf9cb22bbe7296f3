#!/usr/bin/env python3
"""The Gram matrices of `kiln imatrix --full` collected on the GPU against the CPU's, on the same model and text.

Both runs use `--exact` (f32 matmuls on both devices), so the inputs of each projection agree to float rounding
and so must their X^T X. Prints, per device pair, the worst relative Frobenius difference of a Gram matrix and
of a sums-of-squares vector, and the largest asymmetry of a GPU matrix; exits 1 when a Gram matrix differs by
more than --tol (default 1e-3).

    python3 bench/gram_check.py --kiln build/cuda-dev/tools/kiln/kiln --model MODEL.gguf --text TEXT
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import gguf
import numpy as np


def collect(kiln: str, model: str, text: str, device: str, out: Path, chunk: int, chunks: int) -> dict:
    cmd = [kiln, "imatrix", "-m", model, "-f", text, "-o", str(out), "-c", str(chunk), "--chunks", str(chunks),
           "--exact", "--full", "--no-ppl", "-d", device]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stderr}")
    return {t.name: np.asarray(t.data, np.float64) for t in gguf.GGUFReader(str(out)).tensors}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--chunks", type=int, default=2)
    ap.add_argument("--tol", type=float, default=1e-3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        cpu = collect(a.kiln, a.model, a.text, "cpu", Path(d) / "cpu.gguf", a.chunk, a.chunks)
        gpu = collect(a.kiln, a.model, a.text, "cuda", Path(d) / "cuda.gguf", a.chunk, a.chunks)
    if set(cpu) != set(gpu):
        print(f"different tensors: {sorted(set(cpu) ^ set(gpu))[:5]}")
        return 1
    grams = [n for n in cpu if n.endswith(".in_gram")]
    if not grams:
        print("no Gram matrices in the files")
        return 1
    worst_gram = worst_sums = worst_asym = 0.0
    for name, want in cpu.items():
        got = gpu[name]
        if got.shape != want.shape:
            print(f"{name}: shape {got.shape} on the GPU, {want.shape} on the CPU")
            return 1
        diff = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
        if name.endswith(".in_gram"):
            worst_gram = max(worst_gram, diff)
            n = int(round(got.size ** 0.5))
            m = got.reshape(n, n)
            worst_asym = max(worst_asym, np.abs(m - m.T).max() / max(np.abs(m).max(), 1e-30))
        elif name.endswith(".in_sum2"):
            worst_sums = max(worst_sums, diff)
    print(f"{len(grams)} Gram matrices: worst relative difference {worst_gram:.2e}, sums of squares "
          f"{worst_sums:.2e}, largest asymmetry on the GPU {worst_asym:.2e} (tolerance {a.tol:g})")
    return 0 if worst_gram <= a.tol else 1


if __name__ == "__main__":
    sys.exit(main())
