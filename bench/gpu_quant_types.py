#!/usr/bin/env python3
"""Decode speed of every type `kiln quantize` writes, on one device: for each model, its F16 source quantized to
each type by kiln (the i-quants that need one with an importance matrix from `kiln imatrix` on the same device),
then `kiln bench -p 16 -n 128` of each file (its tg128 row). Prints one markdown table a model: type, MiB, bits per weight,
tg128 tokens/s.

Models: `default` (a GGUF file, dequantized to F16 by `kiln quantize ... F16 --allow-requantize`) and, with
--qwen-shape, a random-weight Qwen2 model of Qwen2.5-1.5B's shape (28 layers, 1536 wide, 8960 FFN, 12 heads,
2 KV heads, 151,936 rows of tied embedding), written by transformers and converted to F16 by `kiln convert`:
decode speed depends on the shape and the types, not on the values.

    python3 bench/gpu_quant_types.py --build build/cuda --model /tmp/kiln-models/default.gguf --qwen-shape
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from quant_quality import ALL_TYPES  # noqa: E402

NEEDS_IMATRIX = {"IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M", "Q2_K_S", "IQ3_XXS", "IQ3_XS"}
QWEN_1_5B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936, rope_theta=1000000.0, max_position_embeddings=32768,
                 rms_norm_eps=1e-6, tie_word_embeddings=True)


def run(cmd) -> str:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"failed ({r.returncode}): {' '.join(map(str, cmd))}\n{r.stderr[-2000:]}")
    return r.stdout


def qwen_folder(out: Path, tokenizer: Path) -> Path:
    import torch
    import transformers
    if (out / "config.json").exists():
        return out
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.Qwen2Config(**QWEN_1_5B),
                                                              dtype=torch.bfloat16)
    model.save_pretrained(str(out))
    for f in tokenizer.iterdir():
        shutil.copy(f, out / f.name)
    return out


def table(kiln: Path, name: str, label: str, f16: Path, work: Path, device: str, types: list[str],
          calib: Path) -> None:
    threads = str(os.cpu_count())
    imx = work / f"{name}.imatrix.gguf"
    if not imx.exists():
        run([kiln, "imatrix", "-m", f16, "-f", calib, "-o", imx, "-c", "512", "--chunks", "16", "-d", device,
             "--no-ppl"])
    print(f"\n## {label}: decode on {device}, tg128 (mean of 3)\n")
    print("| type | MiB | bpw | tg128 tokens/s | quantized in |")
    print("|---|---:|---:|---:|---:|", flush=True)
    for ty in types:
        out = work / f"{name}-{ty}.gguf"
        t0 = time.time()
        try:
            run([kiln, "quantize", f16, out, ty, "-t", threads, "--force"] +
                (["--imatrix", imx] if ty in NEEDS_IMATRIX else []))
            took = time.time() - t0
            b = next(r for r in json.loads(run([kiln, "bench", "-m", out, "-d", device, "-p", "16", "-n", "128",
                                                "-r", "3", "-o", "json"])) if r["test"] == "tg128")
        except RuntimeError as e:  # the row says what failed; the others still run
            print(f"| {ty} | failed: {str(e).strip().splitlines()[-1][-200:]} | | | |", flush=True)
            out.unlink(missing_ok=True)
            continue
        bpw = 8 * b["size_bytes"] / b["n_params"]
        print(f"| {ty} | {out.stat().st_size / 2**20:,.1f} | {bpw:.2f} | {b['tokens_per_s']:,.1f} ± "
              f"{b['tokens_per_s_sd']:.1f} | {took:.1f} s |", flush=True)
        out.unlink()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path, required=True)
    ap.add_argument("--model", type=Path, help="a GGUF file, dequantized to F16 as the source")
    ap.add_argument("--qwen-shape", action="store_true", help="also the random model of Qwen2.5-1.5B's shape")
    ap.add_argument("--tokenizer", type=Path, default=ROOT / ".gpu-deps" / "tokenizer")
    ap.add_argument("--work", type=Path, default=Path("/tmp/kiln-quant-types"))
    ap.add_argument("-d", "--device", default="cuda")
    ap.add_argument("--types", default=ALL_TYPES)
    a = ap.parse_args()
    kiln = a.build / "tools" / "kiln" / "kiln"
    a.work.mkdir(parents=True, exist_ok=True)
    types = a.types.split(",")
    # Calibration text for the i-quants' importance matrix: this tree's docs and sources.
    calib = a.work / "calib.txt"
    calib.write_text("\n".join(p.read_text(errors="replace") for p in sorted((ROOT / "docs").glob("*.md")) +
                               sorted((ROOT / "src").glob("*/*.cpp"))) * 2)
    if a.model:
        f16 = a.work / "default-f16.gguf"
        if not f16.exists():
            run([kiln, "quantize", a.model, f16, "F16", "--allow-requantize", "--force"])
        table(kiln, "default", a.model.name, f16, a.work, a.device, types, calib)
    if a.qwen_shape:
        f16 = a.work / "qwen1.5b-shape-f16.gguf"
        if not f16.exists():
            folder = qwen_folder(a.work / "qwen1.5b-shape", a.tokenizer)
            run([kiln, "convert", folder, f16, "--type", "f16"])
            shutil.rmtree(folder)
        table(kiln, "qwen1.5b-shape", "Qwen2.5-1.5B shape, random weights", f16, a.work, a.device, types, calib)
    return 0


if __name__ == "__main__":
    sys.exit(main())
