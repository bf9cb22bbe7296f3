"""Partial offload chosen by free memory: a model (`--model`, else the SmolLM2-135M-shaped one in BF16, made here
by transformers and `kiln convert`) run while this process holds all but `--leave` GiB of the GPU, so that its
weights do not fit beside what kiln keeps for the KV cache and scratch. By default --leave is the 1 GiB kiln keeps,
0.75 GiB for its CUDA context and cuBLAS workspace, and half the file: about half the layers fit. A small file
leaves that split to the guess of the context's size; the 8B files of `gpu-check.sh prep` do not. Without --gpu-layers, kiln must load the layers that fit
(and say so) and generate the same greedy tokens as with every layer on the GPU (the memory given back first).

Runs on the GPU machine: scripts/gpu-check.sh fit.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_generate import make_folder  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def run(kiln: Path, model: Path, *extra) -> subprocess.CompletedProcess:
    return subprocess.run([str(kiln), "run", "-m", str(model), "-d", "cuda", "-p", "The quick brown fox", "-n", "24",
                           "--temp", "0", "--ignore-eos", *extra], capture_output=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", type=Path, required=True)
    ap.add_argument("--tokenizer", type=Path, default=ROOT / ".gpu-deps" / "tokenizer")
    ap.add_argument("--model", type=Path, help="GGUF file (default: the 135M-shaped model, made here)")
    ap.add_argument("--leave", type=float, help="GiB of the GPU left free while kiln loads")
    a = ap.parse_args()
    kiln = a.build / "tools" / "kiln" / "kiln"
    model = a.model
    if model is None:
        folder = make_folder("smollm2-135m", Path("/tmp/kiln-fit/folder"), a.tokenizer)
        model = Path("/tmp/kiln-fit/model.gguf")
        subprocess.run([str(kiln), "convert", str(folder), str(model), "--type", "bf16"], check=True,
                       capture_output=True)
    leave = a.leave if a.leave is not None else 1.75 + model.stat().st_size / 2**31
    print(f"{model.name}: {model.stat().st_size / 2**30:.2f} GiB; {leave:.2f} GiB of the GPU left free")
    whole = run(kiln, model)
    free, _ = torch.cuda.mem_get_info()
    hold = torch.empty(int(free - leave * 2**30), dtype=torch.uint8, device="cuda")
    fitted = run(kiln, model)
    del hold
    err = fitted.stderr.decode(errors="replace")
    print(err[-1500:])
    ok = whole.returncode == 0 and fitted.returncode == 0 and "do not fit" in err and " + cpu" in err
    same = whole.stdout == fitted.stdout
    print(f"fitted run: {'ok' if ok else 'FAILED'}; text {'identical to' if same else 'differs from'} every layer "
          f"on the GPU")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
