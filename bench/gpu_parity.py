"""Model parity on the GPU: kiln's CUDA backend against its CPU exact path, on random-weight models of every
architecture made by transformers (tests/python/test_hf_architectures.py's configs, SmolLM2's tokenizer).

Per architecture, teacher-forced over a 256-token prompt (the logits of every position):
  - CUDA exact (f32 GEMV / SGEMM): top-1 agreement and mean KL(cpu || cuda);
  - CUDA fast path (--quantize-x: bf16 tensor cores for the 64-token batch): the same figures;
  - the model converted to Q8_0 (kiln convert): CUDA fast path (x rounded to 8 bits, integer dot products;
    the prompt in 32-token chunks) against the CPU exact path on the same file;
  - partial offload: the first half of the layers on CUDA, the rest and the output head on the CPU (exact,
    the prompt in 100-token chunks): the same figures;
and greedy 32-token continuations of 10 prompts through the engine on both devices, and split in two
(`gpu_layers`: half the layers, exact), identical on how many.
Targets: top-1 >= 99%, mean KL <= 1e-3, greedy identical on >= 8 of 10. Exit status 1 when one is missed.
For the fast paths, where the KL comes from: the positions that hold most of it and, on MoE models, the
router's closest call there (the gap between its k-th and (k+1)-th logit in transformers, f32).
`--only mixtral,qwen2moe` runs some architectures alone.

Runs on the GPU machine: scripts/gpu-check.sh parity (the tokenizer travels in .gpu-deps/tokenizer).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "python"))

import torch  # noqa: E402
import transformers  # noqa: E402

from parity_text import PARITY_TEXT  # noqa: E402
from test_hf_architectures import ARCHS, configs, save_folder  # noqa: E402

N_PROMPT = 256
N_GREEDY = 32
N_PROMPTS = 10


def driver(build: Path, args: list, stdin) -> dict:
    r = subprocess.run([str(build / "tests" / "logits_driver"), *map(str, args)], input=json.dumps(stdin),
                       capture_output=True, text=True)
    reply = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {"ok": False, "error": r.stderr}
    if not reply.get("ok"):
        raise RuntimeError(f"logits_driver {' '.join(map(str, args))}: {reply.get('error')}\n{r.stderr[-2000:]}")
    return reply


def logits(build: Path, folder: Path, ids: list[int], out: Path, *extra) -> np.ndarray:
    reply = driver(build, ["logits", folder, out, *extra], [ids])
    return np.fromfile(out, dtype="<f4").reshape(-1, int(reply["n_vocab"])).astype(np.float64)


def position_kl(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    """KL(ref || got) of each position's distribution."""
    lp = ref - ref.max(-1, keepdims=True)
    lp -= np.log(np.exp(lp).sum(-1, keepdims=True))
    lq = got - got.max(-1, keepdims=True)
    lq -= np.log(np.exp(lq).sum(-1, keepdims=True))
    return np.sum(np.exp(lp) * (lp - lq), -1)


def agreement(ref: np.ndarray, got: np.ndarray) -> tuple[float, float]:
    top1 = float(np.mean(ref.argmax(-1) == got.argmax(-1)))
    return top1, float(np.mean(position_kl(ref, got)))


def router_margins(model, ids: list[int]) -> np.ndarray | None:
    """MoE models: at each position, the smallest gap over the layers between the router's k-th and (k+1)-th
    largest logit (transformers, f32), k the experts a token uses; where it is small a rounding of the
    activations can swap an expert in or out. None for dense models."""
    k = getattr(model.config, "num_experts_per_tok", None)
    if not k:
        return None
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_router_logits=True)
    layers = getattr(out, "router_logits", None)
    if not layers:
        return None
    gaps = []
    for r in layers:
        top = torch.sort(r.float().reshape(len(ids), -1), -1, descending=True).values
        gaps.append((top[:, k - 1] - top[:, k]).numpy())
    return np.min(np.stack(gaps), 0)


def worst(label: str, ref: np.ndarray, got: np.ndarray, margins: np.ndarray | None) -> str:
    """Where a path's KL comes from: its three largest positions (with the router's closest call there), the
    share of the total they hold, and how many positions pass 1e-4."""
    kl = position_kl(ref, got)
    top = np.argsort(kl)[::-1][:3]
    at = ", ".join(f"{p}: {kl[p]:.1e}" + (f" (router gap {margins[p]:.1e})" if margins is not None else "")
                   for p in top)
    line = (f"  {label}: largest KL at positions {at}; {kl[top].sum() / max(kl.sum(), 1e-300):.0%} of the total; "
            f"{int((kl > 1e-4).sum())} positions above 1e-4")
    if margins is not None:
        line += (f"; router gaps: median {np.median(margins):.1e}, {int((margins < 1e-2).sum())} positions "
                 f"below 1e-2")
    return line


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokenizer", type=Path, default=ROOT / ".gpu-deps" / "tokenizer")
    ap.add_argument("--only", default="", help="comma-separated architectures (default: all)")
    a = ap.parse_args()
    unknown = [n for n in a.only.split(",") if n and n not in ARCHS]
    if unknown:
        ap.error(f"--only: no architecture {', '.join(unknown)} (there are {', '.join(ARCHS)})")
    archs = [n for n in ARCHS if not a.only or n in a.only.split(",")]
    tok = transformers.AutoTokenizer.from_pretrained(str(a.tokenizer))
    words = tok(PARITY_TEXT)["input_ids"]
    ids = words[:N_PROMPT]
    prompts = [words[i * 40:i * 40 + 24] for i in range(N_PROMPTS)]
    rows, ok = [], True
    with tempfile.TemporaryDirectory() as tmp:
        for name in archs:
            torch.manual_seed(1234)
            model = transformers.AutoModelForCausalLM.from_config(configs(len(tok))[name]).eval()
            folder = save_folder(model, a.tokenizer, Path(tmp) / name, torch.float32)
            cpu = logits(a.build, folder, ids, Path(tmp) / "cpu.f32")
            exact = agreement(cpu, logits(a.build, folder, ids, Path(tmp) / "cuda.f32", "--device", "cuda"))
            fast_logits = logits(a.build, folder, ids, Path(tmp) / "fast.f32", "--device", "cuda", "--quantize-x")
            fast = agreement(cpu, fast_logits)
            q8 = Path(tmp) / f"{name}-q8_0.gguf"
            subprocess.run([str(a.build / "tools" / "kiln" / "kiln"), "convert", str(folder), str(q8), "--type",
                            "q8_0"], check=True, capture_output=True)
            q8_cpu = logits(a.build, q8, ids, Path(tmp) / "q8cpu.f32")
            # 32-token chunks: the prompt goes through the integer GEMV (up to 64 tokens a step), as decode does.
            quant_logits = logits(a.build, q8, ids, Path(tmp) / "q8fast.f32", "--device", "cuda", "--quantize-x",
                                  "--chunk", "32")
            quant = agreement(q8_cpu, quant_logits)
            # Partial offload: the first half of the layers on the GPU, the rest and the head on the CPU.
            half = str(model.config.num_hidden_layers // 2)
            split = agreement(cpu, logits(a.build, folder, ids, Path(tmp) / "split.f32", "--device", "cuda",
                                          "--split", half, "--chunk", "100"))
            g_cpu = driver(a.build, ["generate", folder, N_GREEDY], prompts)["tokens"]
            g_gpu = driver(a.build, ["generate", folder, N_GREEDY, "--device", "cuda", "--quantize-x"], prompts)["tokens"]
            g_split = driver(a.build, ["generate", folder, N_GREEDY, "--device", "cuda", "--split", half],
                             prompts)["tokens"]
            same = sum(x == y for x, y in zip(g_cpu, g_gpu))
            same_split = sum(x == y for x, y in zip(g_cpu, g_split))
            passed = (min(exact[0], fast[0], quant[0], split[0]) >= 0.99 and
                      max(exact[1], fast[1], quant[1], split[1]) <= 1e-3 and min(same, same_split) >= 8)
            ok &= passed
            rows.append((name, *exact, *fast, *quant, same, *split, same_split, passed))
            print(f"{name}: exact top1 {exact[0]:.4f} KL {exact[1]:.2e}; fast top1 {fast[0]:.4f} KL {fast[1]:.2e}; "
                  f"q8_0 fast top1 {quant[0]:.4f} KL {quant[1]:.2e}; greedy {same}/{N_PROMPTS}; split exact top1 "
                  f"{split[0]:.4f} KL {split[1]:.2e}, greedy {same_split}/{N_PROMPTS}", flush=True)
            margins = router_margins(model, ids)
            print(worst("fast", cpu, fast_logits, margins), flush=True)
            print(worst("q8_0 fast", q8_cpu, quant_logits, margins), flush=True)
    lines = ["| architecture | CUDA exact: top-1 | mean KL | CUDA fast (bf16): top-1 | mean KL "
             "| Q8_0 file, CUDA fast: top-1 | mean KL | greedy 32 identical "
             "| half the layers on CUDA, exact: top-1 | mean KL | greedy 32 identical |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, t1, kl, f1, fkl, q1, qkl, same, s1, skl, same_split, passed in rows:
        lines.append(f"| {name} | {t1:.2%} | {kl:.1e} | {f1:.2%} | {fkl:.1e} | {q1:.2%} | {qkl:.1e} "
                     f"| {same}/{N_PROMPTS} | {s1:.2%} | {skl:.1e} | {same_split}/{N_PROMPTS}"
                     f"{'' if passed else ' (missed)'} |")
    (a.out / "parity.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
