#!/usr/bin/env python3
"""What quantization costs, kiln beside llama.cpp, measured by one tool: for each type, with and without an
importance matrix, the file kiln makes (kiln imatrix + kiln quantize) and the file llama.cpp makes
(llama-imatrix + llama-quantize, when --peer names their build) are scored by `kiln perplexity
--kl-divergence` against the F16 source's distributions over an evaluation text. The calibration text and the
evaluation text are different files.

    python3 bench/quant_quality.py --model ~/.cache/kiln/models/SmolLM2-135M-Instruct.Q4_1.gguf \
        --peer ~/.cache/kiln/peer-build/llama.cpp/build/bin --types Q4_K_M,Q3_K_M,Q2_K,IQ4_XS,IQ2_XS

`bench/kld_vs_llamacpp.py --build-only` builds those llama.cpp tools (~/.cache/kiln/peer-build/llama.cpp/build/bin).
The source is the model file dequantized to F16 by `kiln quantize ... F16 --allow-requantize` (the test models
ship quantized only). Prints a markdown table; --json FILE also writes the rows.

`--gptq` adds kiln imatrix --full and kiln quantize --method gptq rows (maker kiln-gptq). `--types all` takes
every type `kiln quantize` writes but F32; `--decode` adds each file's size in bits per
weight and its CPU decode speed (`kiln bench -p 0 -n 128`), and prints the summary table, one row a type:

    python3 bench/quant_quality.py --model ~/.cache/kiln/models/SmolLM2-135M-Instruct.Q4_1.gguf --types all --decode
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LICENSES = Path("/usr/share/common-licenses")
CALIB = [LICENSES / n for n in ("GPL-3", "LGPL-2.1", "GFDL-1.3")]       # Debian's base-files
EVAL = [LICENSES / n for n in ("Apache-2.0", "MPL-2.0", "Artistic", "CC0-1.0")]
# Every type `kiln quantize` writes but F32 (F16, the source, is exact), largest first.
ALL_TYPES = ("F16,BF16,Q8_0,Q6_K,Q5_K_M,Q5_K_S,Q5_1,Q5_0,Q4_K_M,Q4_K_S,Q4_1,IQ4_NL,Q4_0,IQ4_XS,Q3_K_L,Q3_K_M,"
             "IQ3_M,IQ3_S,Q3_K_S,IQ3_XS,IQ3_XXS,Q2_K,Q2_K_S,IQ2_M,IQ2_S,IQ2_XS,IQ2_XXS,IQ1_M,IQ1_S")


def run(cmd, **kw):
    t = time.time()
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(map(str, cmd))}\n{r.stderr[-3000:]}")
    return r, time.time() - t


def concat(paths, out):
    out.write_text("\n\n".join(p.read_text(errors="replace") for p in paths))
    return out


def prepare(a, full=False):
    """The work folder's shared inputs, made once: the source dequantized to F16, the F16 model's distributions
    over the evaluation text (base.kld), kiln's imatrix over the calibration text and, with `full`, the one with
    the Gram matrices (--full) over the same chunks. `a` has model, kiln, work, ctx, chunks, calib_chunks and
    threads. Returns (f16, base, {"kiln": imatrix[, "full": full imatrix]})."""
    k, w, t = a.kiln, a.work, str(a.threads)
    w.mkdir(parents=True, exist_ok=True)
    calib, evalt = concat(CALIB, w / "calib.txt"), concat(EVAL, w / "eval.txt")
    f16 = w / "source-f16.gguf"
    if not f16.exists():
        run([k, "quantize", a.model, f16, "F16", "--allow-requantize", "-t", t])
    base = w / "base.kld"
    if not base.exists():
        run([k, "perplexity", "-m", f16, "-f", evalt, "-c", a.ctx, "--chunks", a.chunks, "-d", "cpu", "-t", t,
             "--kl-divergence-base", base])
    imx = {"kiln": w / "kiln.imatrix.gguf"}
    if not imx["kiln"].exists():
        _, sec = run([k, "imatrix", "-m", f16, "-f", calib, "-o", imx["kiln"], "-c", a.ctx, "--chunks",
                      a.calib_chunks, "-d", "cpu", "-t", t, "--no-ppl"])
        print(f"kiln imatrix: {sec:.1f} s", file=sys.stderr)
    if full:  # the Gram matrices too, over the same chunks (collected on the CPU)
        imx["full"] = w / "kiln.full.imatrix.gguf"
        if not imx["full"].exists():
            _, sec = run([k, "imatrix", "-m", f16, "-f", calib, "-o", imx["full"], "-c", a.ctx, "--chunks",
                          a.calib_chunks, "-d", "cpu", "-t", t, "--no-ppl", "--full"])
            print(f"kiln imatrix --full: {sec:.1f} s", file=sys.stderr)
    return f16, base, imx


def kld_of(k, path, base, t):
    """`kiln perplexity --kl-divergence` of a file against base.kld, as JSON; kept beside the file, so that a
    second run with the same work folder scores only new files."""
    cached = path.with_suffix(".kld.json")
    if cached.exists() and cached.stat().st_mtime >= path.stat().st_mtime:
        return json.loads(cached.read_text())
    r, _ = run([k, "perplexity", "-m", path, "--kl-divergence", "--kl-divergence-base", base, "-d", "cpu",
                "-t", t, "-o", "json"])
    cached.write_text(r.stdout)
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--kiln", type=Path, default=ROOT / "build/release/tools/kiln/kiln")
    ap.add_argument("--peer", type=Path, help="a llama.cpp build's bin folder (llama-imatrix, llama-quantize)")
    ap.add_argument("--types", default="Q4_K_M,Q3_K_M,Q2_K,IQ4_XS,IQ2_XS")
    ap.add_argument("--work", type=Path, default=Path("/tmp/kiln-quant-quality"))
    ap.add_argument("-c", "--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=8, help="evaluation chunks")
    ap.add_argument("--calib-chunks", type=int, default=16)
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count())
    ap.add_argument("--decode", action="store_true", help="bits per weight and CPU decode tokens/s of each type")
    ap.add_argument("--gptq", action="store_true",
                    help="also kiln imatrix --full and kiln quantize --method gptq (maker kiln-gptq) for each type")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    if a.types == "all":
        a.types = ALL_TYPES
    k, w, t = a.kiln, a.work, str(a.threads)
    f16, base, imx = prepare(a, full=a.gptq)
    if a.peer:
        calib = w / "calib.txt"
        imx["llama"] = w / "llama.imatrix.gguf"
        if not imx["llama"].exists():
            _, sec = run([a.peer / "llama-imatrix", "-m", f16, "-f", calib, "-o", imx["llama"], "-c", a.ctx,
                          "--chunks", a.calib_chunks, "-t", t, "--no-ppl"])
            print(f"llama-imatrix: {sec:.1f} s", file=sys.stderr)
    rows = []
    decode = {}  # (type, imatrix) -> (CPU tokens/s, bits per weight)
    files = {}   # (type, imatrix) -> kiln's file, whose decode speed is measured at the end

    def score(path):
        return kld_of(k, path, base, t)

    src_bytes = f16.stat().st_size
    for ty in a.types.split(","):
        for maker in ["kiln"] + (["kiln-gptq"] if a.gptq else []) + (["llama"] if a.peer else []):
            # An importance matrix changes nothing in F16, BF16 and Q8_0.
            for use_imx in (True,) if maker == "kiln-gptq" else (False,) if ty in ("F16", "BF16", "Q8_0") else (
                    False, True):
                name = f"{ty}-{maker}{'-imx' if use_imx else ''}"
                out = w / f"{name}.gguf"
                if not out.exists():
                    if maker == "kiln":
                        cmd = [k, "quantize", f16, out, ty, "-t", t] + (["--imatrix", imx["kiln"]] if use_imx else [])
                    elif maker == "kiln-gptq":
                        cmd = [k, "quantize", f16, out, ty, "-t", t, "--imatrix", imx["full"], "--method", "gptq"]
                    else:
                        cmd = [a.peer / "llama-quantize"] + (["--imatrix", imx["llama"]] if use_imx else []) + \
                              [f16, out, ty, t]
                    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
                    if r.returncode != 0:
                        last = [x for x in (r.stderr + r.stdout).splitlines() if x.strip() and "===" not in x]
                        rows.append({"type": ty, "maker": maker, "imatrix": use_imx, "error": last[-1][-160:]})
                        continue
                s = score(out)
                if a.decode and maker == "kiln":
                    files[(ty, use_imx)] = out
                rows.append({"type": ty, "maker": maker, "imatrix": use_imx, "mib": out.stat().st_size / 2**20,
                             "ratio_to_f16": out.stat().st_size / src_bytes, "ppl": s["ppl"]["value"],
                             "ppl_base": s["ppl_base"]["value"], "d_ppl": s["ppl_diff"]["value"],
                             "kld": s["kld"]["value"], "kld_err": s["kld"]["error"],
                             "kld_p99": s["kld_percentiles"].get("p99"), "same_top": s["same_top"]["value"]})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)  # as it comes
        # kiln's imatrix in llama-quantize: the files interchange.
        if a.peer:
            out = w / f"{ty}-llama-kilnimx.gguf"
            if not out.exists():
                run([a.peer / "llama-quantize", "--imatrix", imx["kiln"], f16, out, ty, t])
            s = score(out)
            rows.append({"type": ty, "maker": "llama+kiln-imatrix", "imatrix": True, "mib": out.stat().st_size / 2**20,
                         "ratio_to_f16": out.stat().st_size / src_bytes, "ppl": s["ppl"]["value"],
                         "ppl_base": s["ppl_base"]["value"], "d_ppl": s["ppl_diff"]["value"], "kld": s["kld"]["value"],
                         "kld_err": s["kld"]["error"], "kld_p99": s["kld_percentiles"].get("p99"),
                         "same_top": s["same_top"]["value"]})
    print(f"source: {a.model.name} dequantized to F16 ({src_bytes / 2**20:.1f} MiB); eval {a.chunks} x {a.ctx} tokens")
    print("| type | made by | imatrix | MiB | ppl | Δppl | mean KLD | p99 KLD | same top |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['type']} | {r['maker']} | {'yes' if r['imatrix'] else 'no'} | refused: {r['error']} |")
            continue
        print(f"| {r['type']} | {r['maker']} | {'yes' if r['imatrix'] else 'no'} | {r['mib']:.1f} | {r['ppl']:.3f} | "
              f"{r['d_ppl']:+.3f} | {r['kld']:.5f} ± {r['kld_err']:.5f} | {r['kld_p99']:.4f} | {100 * r['same_top']:.2f}% |")
    if a.decode:
        # Decode speed in one pass after the scoring, so that nothing else of this script runs beside it; the
        # file without an importance matrix where there is one (the same types, the same speed).
        for (ty, use_imx), out in files.items():
            if use_imx and (ty, False) in files:
                continue
            r, _ = run([k, "bench", "-m", out, "-p", "0", "-n", "128", "-r", "2", "-d", "cpu", "-t", t, "-o", "json"])
            b = json.loads(r.stdout)[0]
            decode[(ty, False)] = decode[(ty, True)] = (b["tokens_per_s"], 8 * b["size_bytes"] / b["n_params"])
        summary(rows, decode)
    if a.json:
        for r in rows:
            if r["maker"] == "kiln" and (r["type"], r["imatrix"]) in decode:
                r["cpu_tg128"], r["bpw"] = decode[(r["type"], r["imatrix"])]
        a.json.write_text(json.dumps(rows, indent=1))


def summary(rows, decode):
    """One row a type: kiln's file without and with the importance matrix (Δppl, mean and p99 KLD, same top),
    its bits per weight and CPU decode speed (the file without an imatrix, else the one with it)."""
    def cells(r):
        if r is None:
            return " | | | "
        if "error" in r:
            return "needs one | | |"
        return f"{r['d_ppl']:+.3f} | {r['kld']:.4f} | {r['kld_p99']:.3f} | {100 * r['same_top']:.1f}%"

    print("\n| type | MiB | bpw | Δppl | mean KLD | p99 KLD | same top | imatrix: Δppl | mean KLD | p99 KLD | same top "
          "| CPU tg128 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    kiln = {(r["type"], r["imatrix"]): r for r in rows if r["maker"] == "kiln"}
    for ty in dict.fromkeys(r["type"] for r in rows if r["maker"] == "kiln"):
        plain, imx = kiln.get((ty, False)), kiln.get((ty, True))
        made = imx if plain is None or "error" in plain else plain
        tps, bpw = decode.get((made["type"], made["imatrix"]), (0.0, 0.0))
        plain_cells = "needs one | | |" if plain is None or "error" in plain else cells(plain)
        print(f"| {ty} | {made.get('mib', 0):.1f} | {bpw:.2f} | {plain_cells} | {cells(imx)} | {tps:.1f} |")


if __name__ == "__main__":
    main()
