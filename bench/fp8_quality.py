#!/usr/bin/env python3
"""What FP8 weights cost a model: `kiln quantize FOLDER OUT FP8` (per-channel e4m3, compressed-tensors) against
the model's BF16 folder, beside FP8 rounded by GPTQ (`--method gptq`, with an importance matrix of
`kiln imatrix --full` over --calib, another text than the one scored) and Q8_0 of the same folder, by
`kiln perplexity --kl-divergence`. The FP8 folders take dynamic per-token activations, but for one whose
activation scales are static (a scale a projection: the largest input --calib gave it / 448, from the same
importance matrix). Only a backend that rounds activations to e4m3 (CUDA at the fast precision: --device cuda
--fast) tells the two apart; the CPU multiplies FP8 weights by f32 activations.

    python3 bench/fp8_quality.py --model ~/.cache/kiln/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf

The test models ship quantized, so the BF16 source is the GGUF file dequantized by transformers' GGUF loader
(tests/python/hf_cache.py) and saved as a BF16 folder. Every file is scored over --chunks chunks of --ctx tokens
of --text (the second half of each chunk, as llama.cpp's perplexity scores), at the exact precision (f32
products: what the weights cost, without the CPU's 8-bit activations; --fast leaves the default). Prints a markdown table: mean KLD,
its 99th percentile, the same-top fraction and the perplexity beside BF16's. --device cuda scores on a GPU.
"""
import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))


def run(*args) -> str:
    res = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{' '.join(str(a) for a in args)}: exit {res.returncode}\n{res.stderr[-2000:]}")
    return res.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="a GGUF test model (dequantized to BF16 first)")
    ap.add_argument("--kiln", type=Path, default=ROOT / "build" / "release" / "tools" / "kiln" / "kiln")
    ap.add_argument("--work", type=Path, default=Path("/tmp/kiln-fp8-quality"), help="folders and files made")
    ap.add_argument("--text", type=Path, default=Path("/usr/share/common-licenses/GPL-3"))
    ap.add_argument("--calib", type=Path, default=Path("/usr/share/common-licenses/GPL-2"),
                    help="GPTQ's calibration text (kiln imatrix --full)")
    ap.add_argument("--calib-chunks", type=int, default=8, help="chunks of --ctx tokens of --calib")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--fast", action="store_true", help="the default precision instead of --exact")
    a = ap.parse_args()

    work = a.work / a.model.stem
    work.mkdir(parents=True, exist_ok=True)
    bf16 = work / "bf16"
    if not (bf16 / "config.json").exists():
        import torch
        from hf_cache import hf_model, hf_tokenizer

        tmp = work / "bf16.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        hf_model(a.model).to(torch.bfloat16).save_pretrained(str(tmp))
        hf_tokenizer(a.model).save_pretrained(str(tmp))
        tmp.rename(bf16)
    fp8, q8 = work / "fp8", work / "q8_0.gguf"
    threads = ["-t", a.threads] if a.threads else []
    if not (fp8 / "config.json").exists():
        run(a.kiln, "quantize", bf16, fp8, "FP8")
    full = work / f"full-{a.calib.name}-{a.ctx}x{a.calib_chunks}.imatrix.gguf"
    if not full.exists():
        run(a.kiln, "imatrix", "-m", bf16, "-f", a.calib, "-o", full, "-c", a.ctx, "--chunks", a.calib_chunks,
            "--no-ppl", "--full", "-d", a.device, *threads)
    gptq = work / f"fp8-gptq-{a.calib.name}-{a.ctx}x{a.calib_chunks}"
    if not (gptq / "config.json").exists():
        run(a.kiln, "quantize", bf16, gptq, "FP8", "--imatrix", full, "--method", "gptq", "--fp8-activations",
            "dynamic", "-d", a.device, *threads)
    static = work / f"fp8-static-{a.calib.name}-{a.ctx}x{a.calib_chunks}"
    if not (static / "config.json").exists():
        run(a.kiln, "quantize", bf16, static, "FP8", "--imatrix", full, "--fp8-activations", "static")
    from_gguf = work / "q8_0.from-gguf"  # written when Q8_0 came from the GGUF file
    if not q8.exists():
        res = subprocess.run([str(x) for x in (a.kiln, "quantize", bf16, q8, "Q8_0")], capture_output=True,
                             text=True)
        if res.returncode != 0:
            # A BF16 folder whose tokenizer has no GGUF form (transformers 4.x saves SmolLM2's with byte
            # fallback to unk for the 21 bytes its vocabulary lacks):
            # Q8_0 of the GGUF file itself (the same source weights) as the reference row.
            print(f"Q8_0 of the BF16 folder failed ({res.stderr.strip()[-200:]}); requantizing {a.model.name}",
                  file=sys.stderr)
            run(a.kiln, "quantize", a.model, q8, "Q8_0", "--allow-requantize")
            from_gguf.touch()
    q8_name = f"Q8_0 (requantized from {a.model.name})" if from_gguf.exists() else "Q8_0"

    common = ["-d", a.device, "-o", "json"] + threads + ([] if a.fast else ["--exact"])
    base = work / f"bf16-{a.ctx}x{a.chunks}{'-fast' if a.fast else ''}.kld"
    if not base.exists():
        run(a.kiln, "perplexity", "-m", bf16, "-f", a.text, "-c", a.ctx, "--chunks", a.chunks, *common,
            "--kl-divergence-base", base)
    print(f"{a.model.name} as BF16 (dequantized), {a.chunks} x {a.ctx} tokens of {a.text.name}, on {a.device}"
          f"{'' if a.fast else ', --exact'}; GPTQ calibrated on {a.calib_chunks} x {a.ctx} tokens of {a.calib.name}\n")
    print("| weights | mean KLD | KLD p99 | same top | ppl | BF16 ppl |")
    print("|---|---:|---:|---:|---:|---:|")
    rows = (("FP8 e4m3, per channel", fp8), ("FP8 e4m3, per channel, static activations", static),
            ("FP8 e4m3, per channel, GPTQ", gptq), (q8_name, q8))
    for name, path in rows:
        r = json.loads(run(a.kiln, "perplexity", "-m", path, *common, "--kl-divergence-base", base,
                           "--kl-divergence"))
        print(f"| {name} | {r['kld']['value']:.5f} | {r['kld_percentiles']['p99']:.4f} | "
              f"{100 * r['same_top']['value']:.1f}% | {r['ppl']['value']:.3f} | {r['ppl_base']['value']:.3f} |")


if __name__ == "__main__":
    main()
