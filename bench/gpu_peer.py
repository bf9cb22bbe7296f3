"""kiln beside llama.cpp's CUDA build on the same GGUF files, on the GPU machine, in one run.

Models: random-weight Llama-3-8B- and SmolLM2-135M-shaped folders made there by transformers (gpu_generate.py),
written as GGUF by `kiln convert` (BF16, Q8_0) and quantized from the BF16 file by llama.cpp's `llama-quantize`
(Q4_0, Q4_K_M): both engines read the very same files. Named in --only, NAME-q4_k_r and NAME-q4_0_r are random
blocks typed as Q4_K_M and Q4_0 type them (random_kquant_gguf.py, from the bf16 file): no llama-quantize, so no
wait for the peer's build.

Per file, interleaved: `kiln bench -d cuda -p 2048 -n 128` and `llama-bench -ngl 99 -fa 1 -p 2048 -n 128` (pp2048:
a 2048-token prompt in one step; tg128: 128 tokens decoded one step at a time after it), and for the 8B BF16 and
Q4_K_M files batched decode: `kiln bench --batch 4,16,64` (requests of one prompt token, 128 greedy tokens each,
decoding together) beside `llama-batched-bench -npp 128 -ntg 128 -npl 4,16,64` (its S_TG: generation alone).
Decode is also shown against the card's copy bandwidth: bytes a decoded token reads (every weight but the token
embedding table, unless that is also the output head) times tokens/s.

Runs on the GPU machine: scripts/gpu-check.sh peer. Writes peer.md under --out.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_generate import copy_gbs, make_folder, of_copy  # noqa: E402

BATCHED = {("llama3-8b", "bf16"), ("llama3-8b", "q4_k_m")}
BATCH_SIZES = (4, 16, 64)


def run(cmd: list[str], env: dict | None = None) -> tuple[str, str]:
    """(stdout, stderr) of a command that must succeed."""
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, errors="replace", env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))}: exit {r.returncode}\n{r.stderr[-3000:]}")
    return r.stdout, r.stderr


def json_rows(stdout: str) -> list:
    return json.loads(stdout[stdout.index("["):stdout.rindex("]") + 1])


MODELS = (("smollm2-135m", ("bf16", "q4_0")), ("llama3-8b", ("bf16", "q8_0", "q4_0", "q4_k_m")))
CONVERTED = ("bf16", "q8_0")  # written by `kiln convert` from the folder; the others by llama-quantize from bf16
# Made only when --only names them: random blocks typed as Q4_K_M or Q4_0 types them (random_kquant_gguf.py's
# mixes), from the bf16 file: such a file's bytes with no llama-quantize, hence no wait for the peer's build.
RANDOM = {"q4_k_r": "q4_k_m", "q4_0_r": "q4_0"}


def make_files(kiln: Path, quantize: Path, models: Path, tokenizer: Path,
               peer_ready: Path | None = None, only: set | None = None) -> list[tuple[str, str, Path]]:
    """The GGUF files, made where missing, each under a temporary name first. Every `kiln convert` runs before
    the first llama-quantize, which waits for the peer's build to finish (peer_ready: a file its end writes). A
    folder is made only while a file converted from it is missing, and the 8B's (16 GB) is removed once its
    files are written: the machine's disk holds 64 GiB."""
    def make(path: Path, cmd) -> None:  # cmd: the command line that writes the file it is given
        if path.exists():
            return
        t0 = time.time()
        tmp = path.with_suffix(".part.gguf")
        run(cmd(tmp))
        tmp.rename(path)
        print(f"{path.name}: made in {time.time() - t0:.0f} s", flush=True)

    def wanted(name: str, typ: str) -> bool:
        return not only or f"{name}-{typ}" in only

    def random_wanted(name: str) -> list[str]:
        return [r for r in RANDOM if only and f"{name}-{r}" in only]

    for name, types in MODELS:
        folder = models / name
        needed = [t for t in types if t in CONVERTED and (wanted(name, t) or (t == "bf16" and random_wanted(name)))]
        for typ in needed:
            path = models / f"{name}-{typ}.gguf"
            if not path.exists() and not (folder / "config.json").exists():
                make_folder(name, folder, tokenizer)
            make(path, lambda out: [kiln, "convert", folder, out, "--type", typ])
    random_files = []
    for name, _ in MODELS:
        for typ in random_wanted(name):
            path = models / f"{name}-{typ}.gguf"
            make(path, lambda out: [sys.executable, ROOT / "bench" / "random_kquant_gguf.py",
                                    models / f"{name}-bf16.gguf", out, "--mix", RANDOM[typ]])
            random_files.append((name, typ, path))
    deadline = time.time() + 900
    needs_quantize = any(t not in CONVERTED and wanted(n, t) for n, types in MODELS for t in types)
    while needs_quantize and peer_ready and not peer_ready.exists() and time.time() < deadline:
        time.sleep(5)
    files = []
    for name, types in MODELS:
        if name == "llama3-8b" and (models / name).exists():
            shutil.rmtree(models / name)
        for typ in (t for t in types if wanted(name, t)):
            path = models / f"{name}-{typ}.gguf"
            if typ not in CONVERTED:
                make(path, lambda out: [quantize, models / f"{name}-bf16.gguf", out, typ.upper()])
            files.append((name, typ, path))
    return files + random_files


def decode_bytes(path: Path) -> int:
    """Bytes a decoded token reads: the file's tensors but token_embd (read one row a step) unless it is also
    the output head."""
    try:
        import gguf  # the machine's own package, if it has one
    except ImportError:
        return path.stat().st_size
    r = gguf.GGUFReader(str(path))
    names = {t.name for t in r.tensors}
    total = 0
    for t in r.tensors:
        if t.name == "token_embd.weight" and "output.weight" in names:
            continue
        total += int(t.n_bytes)
    return total


def kiln_bench(kiln: Path, path: Path, reps: int, batched: bool) -> dict:
    cmd = [kiln, "bench", "-m", path, "-d", "cuda", "-p", "2048", "-n", "128", "-r", reps, "-o", "json"]
    if batched:
        cmd += ["--batch", ",".join(map(str, BATCH_SIZES))]
    rows = json_rows(run(cmd)[0])
    return {r["test"]: (r["tokens_per_s"], r["tokens_per_s_sd"]) for r in rows}


def llama_bench(bench: Path, path: Path, reps: int) -> dict:
    rows = json_rows(run([bench, "-m", path, "-ngl", "99", "-fa", "1", "-p", "2048", "-n", "128", "-r", reps, "-o",
                          "json"])[0])
    res = {}
    for r in rows:
        test = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
        res[test] = (r["avg_ts"], r["stddev_ts"])
    return res


def offload_bench(kiln: Path, bench: Path, path: Path, ngl: int, reps: int) -> tuple[dict, dict]:
    """pp512 and tg128 with only `ngl` layers on the GPU, each engine's way: kiln runs the first ngl layers there
    (`--gpu-layers`), llama.cpp the last ngl (`-ngl`); the rest and the output head run on the CPU (its default
    threads in both). The same bytes of weights on each side."""
    rows = json_rows(run([kiln, "bench", "-m", path, "-d", "cuda", "--gpu-layers", ngl, "-p", "512", "-n", "128",
                          "-r", reps, "-o", "json"])[0])
    k = {r["test"]: (r["tokens_per_s"], r["tokens_per_s_sd"]) for r in rows}
    rows = json_rows(run([bench, "-m", path, "-ngl", ngl, "-fa", "1", "-p", "512", "-n", "128", "-r", reps, "-o",
                          "json"])[0])
    ll = {(f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"): (r["avg_ts"], r["stddev_ts"])
          for r in rows}
    return k, ll


def llama_batched(batched: Path, path: Path) -> dict:
    out = "\n".join(run([batched, "-m", path, "-ngl", "99", "-fa", "on", "-c", "20480", "-b", "2048", "-ub", "512",
               "-npp", "128", "-ntg", "128", "-npl", ",".join(map(str, BATCH_SIZES))]))
    res = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 8 and cells[0] == "128" and cells[1] == "128" and cells[2].isdigit():
            res[f"tg128@bs{cells[2]}"] = (float(cells[7]), 0.0)
    if not res:
        raise RuntimeError(f"llama-batched-bench: no table in\n{out[-2000:]}")
    return res


def ncu_kernels(cmd: list, skip: int, count: int, env: dict | None = None, split: str = "",
                part: int = 0) -> str:
    """ncu's gpu__time_duration of launches skip .. skip + count of cmd, summed by kernel name, as a table.
    Clocks and caches are left as they are (a kernel finds in L2 what the one before it wrote, as in a step).
    With `split` (a regex), only the launches of part `part`: parts begin at each launch whose name matches."""
    ncu = ["ncu", "--clock-control", "none", "--cache-control", "none", "--metrics", "gpu__time_duration.sum",
           "--csv", "--launch-skip", str(skip), "--launch-count", str(count)]
    r = subprocess.run(ncu + [str(c) for c in cmd], capture_output=True, text=True, errors="replace", env=env)
    rows = list(csv.reader(ln for ln in r.stdout.splitlines() if ln.startswith('"')))
    if not rows or "Kernel Name" not in rows[0]:
        return f"ncu: exit {r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}"
    head = rows[0]
    name_i, unit_i, value_i = head.index("Kernel Name"), head.index("Metric Unit"), head.index("Metric Value")
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
    if split:
        starts = [i for i, row in enumerate(rows[1:], 1) if re.search(split, row[name_i])] + [len(rows)]
        if part + 1 >= len(starts):
            return f"ncu: no part {part} split on {split!r} in {len(rows) - 1} launches"
        rows = [head] + rows[starts[part]:starts[part + 1]]
    per: dict[str, list[float]] = {}
    for row in rows[1:]:
        name = re.sub(r"^(void )?(kiln::cuda::)?(\(anonymous namespace\)::)?", "", row[name_i])
        name = re.sub(r"\(.*$", "", name)
        per.setdefault(name, []).append(float(row[value_i].replace(",", "")) * scale.get(row[unit_i], 1.0))
    total = sum(sum(v) for v in per.values())
    lines = [f"{len(rows) - 1} kernel launches{f' (part {part} split on {split})' if split else ''} after the first "
             f"{skip}: {total:.0f} us of kernels",
             "| kernel | launches | us total | us a launch | share |", "|---|---:|---:|---:|---:|"]
    for name, v in sorted(per.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"| {name[:90]} | {len(v)} | {sum(v):.0f} | {sum(v) / len(v):.2f} | {sum(v) / total:.1%} |")
    return "\n".join(lines)


def kernel_profile(kiln: Path, path: Path, prompt: str) -> str:
    """Each kernel's time in decode steps, graphs off so that kernels launch one by one: the launches after the
    prompt and the first decode steps."""
    env = dict(os.environ, KILN_CUDA_GRAPHS="0")
    return ncu_kernels([kiln, "run", "-m", path, "-d", "cuda", "-p", prompt, "-n", "64", "--temp", "0",
                        "--ignore-eos"], 3000, 900, env)


def prefill_profile(kiln: Path, bench: Path, path: Path, n: int = 2048) -> str:
    """A pp{n}'s kernels, kiln's and llama.cpp's (llama-bench, flash attention on) on the same file. kiln's: the
    launches of its first prefill (the fourth step, after the load's warm-up steps of 1, 1 and 64 tokens; a step
    begins with its embedding rows); llama.cpp's: the first 2400 launches (its warm-up run, 4 batches of 512)."""
    out = [f"### kiln, pp{n}", ncu_kernels([kiln, "bench", "-m", path, "-d", "cuda", "-p", n, "-n", 0, "-r", 1],
                                             0, 2400, split=r"dequant_rows_kernel<30,", part=3)]
    out += [f"### llama.cpp, pp{n}", ncu_kernels([bench, "-m", path, "-ngl", 99, "-fa", 1, "-p", n, "-n", 0, "-r", 1],
                                                  0, 2400)]
    env = dict(os.environ, KILN_CUDA_PROFILE="1")
    r = subprocess.run([str(kiln), "bench", "-m", str(path), "-d", "cuda", "-p", str(n), "-n", "0", "-r", "2"],
                       capture_output=True, text=True, errors="replace", env=env)
    out += [f"### kiln, pp{n}, KILN_CUDA_PROFILE=1", "\n".join(r.stderr.splitlines()[-45:])]
    return "\n".join(out)


def step_profile(kiln: Path, path: Path, log: Path) -> None:
    """Where the engine thread's time goes in a decode step (KILN_STEP_PROFILE), each op's share
    (KILN_CUDA_PROFILE: ops timed one by one, graphs off), and each kernel's time by ncu."""
    prompt = "The quick brown fox jumps over the lazy dog. " * 4
    with log.open("a") as f:
        for env_var in ("KILN_STEP_PROFILE", "KILN_CUDA_PROFILE"):
            env = dict(os.environ, **{env_var: "1"})
            r = subprocess.run([str(kiln), "run", "-m", str(path), "-d", "cuda", "-p", prompt, "-n", "128", "--temp",
                                "0", "--ignore-eos"], capture_output=True, text=True, errors="replace", env=env)
            tail = [ln for ln in r.stderr.splitlines() if not ln.startswith("kiln run:")]
            f.write(f"\n## {path.name}, {env_var}=1\n" + "\n".join(tail[-45:]) + "\n")
        f.write(f"\n## {path.name}, kernels (ncu)\n" + kernel_profile(kiln, path, prompt) + "\n")
        for env_var in ("KILN_STEP_PROFILE", "KILN_CUDA_PROFILE"):  # batched decode: 64 requests
            env = dict(os.environ, **{env_var: "1"})
            r = subprocess.run([str(kiln), "bench", "-m", str(path), "-d", "cuda", "-p", "16", "-n", "64", "-r", "1",
                                "--batch", "64"], capture_output=True, text=True, errors="replace", env=env)
            f.write(f"\n## {path.name}, batch 64, {env_var}=1\n" + "\n".join(r.stderr.splitlines()[-45:]) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", type=Path, required=True, help="kiln's build folder")
    ap.add_argument("--peer", type=Path, required=True, help="llama.cpp's build folder (bin/llama-bench ...)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokenizer", type=Path, default=ROOT / ".gpu-deps" / "tokenizer")
    ap.add_argument("--models", type=Path, default=Path("/tmp/kiln-models"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--copy-gbs", type=float, help="the card's copy bandwidth, GB/s (default: measured here)")
    ap.add_argument("--only", default="", help="comma-separated model-type names to run (default: all)")
    ap.add_argument("--prepare-only", action="store_true", help="make the files, run nothing")
    ap.add_argument("--peer-ready", type=Path, help="a file whose existence says the peer's build has ended")
    ap.add_argument("--no-profile", action="store_true", help="skip the step and kernel profiles (profiles.txt)")
    ap.add_argument("--offload", default="", help="comma-separated layer counts: partial offload alone, each "
                    "engine with that many layers on the GPU (pp512, tg128), on the 8B files of --only")
    a = ap.parse_args()
    kiln = a.build / "tools" / "kiln" / "kiln"
    peer = {n: a.peer / "bin" / n for n in ("llama-bench", "llama-batched-bench", "llama-quantize")}
    a.models.mkdir(parents=True, exist_ok=True)
    only = set(filter(None, a.only.split(",")))
    files = make_files(kiln, peer["llama-quantize"], a.models, a.tokenizer, a.peer_ready, only)
    if a.prepare_only:
        return 0
    if a.offload:
        lines = ["| model | weights | layers on the GPU | engine | pp512 tok/s | tg128 tok/s |",
                 "|---|---|---:|---|---:|---:|"]
        for name, typ, path in files:
            if name != "llama3-8b" or (only and f"{name}-{typ}" not in only):
                continue
            for ngl in map(int, a.offload.split(",")):
                k, ll = offload_bench(kiln, peer["llama-bench"], path, ngl, a.reps)
                for engine, res in (("kiln", k), ("llama.cpp", ll)):
                    lines.append(f"| {name} | {typ} | {ngl} | {engine} | {res['pp512'][0]:.1f} ± "
                                 f"{res['pp512'][1]:.1f} | {res['tg128'][0]:.2f} ± {res['tg128'][1]:.2f} |")
                print("\n".join(lines[-2:]), flush=True)
        (a.out / "offload.md").write_text("\n".join(["## Partial offload", "", *lines]) + "\n")
        print("\n".join(lines), flush=True)
        return 0
    a.copy_gbs = copy_gbs(a.copy_gbs)
    lines = ["| model | weights | engine | tg128 tok/s | decode GB/s | of copy bw | pp2048 tok/s |",
             "|---|---|---|---:|---:|---:|---:|"]
    ratios, batched_lines = [], []
    for name, typ, path in files:
        if only and f"{name}-{typ}" not in only:
            continue
        per_token = decode_bytes(path)
        batched = (name, typ) in BATCHED
        k = kiln_bench(kiln, path, a.reps, batched)
        ll = llama_bench(peer["llama-bench"], path, a.reps)
        if batched:
            ll.update(llama_batched(peer["llama-batched-bench"], path))
        for engine, res in (("kiln", k), ("llama.cpp", ll)):
            tg, pp = res["tg128"][0], res["pp2048"][0]
            gbs = per_token * tg / 1e9
            lines.append(f"| {name} | {typ} | {engine} | {tg:.1f} ± {res['tg128'][1]:.1f} | {gbs:.0f} | "
                         f"{of_copy(gbs, a.copy_gbs)} | {pp:.0f} ± {res['pp2048'][1]:.0f} |")
        ratios.append(f"| {name} | {typ} | {k['tg128'][0] / ll['tg128'][0]:.2f}x | "
                      f"{k['pp2048'][0] / ll['pp2048'][0]:.2f}x |")
        if batched:
            for bs in BATCH_SIZES:
                t = f"tg128@bs{bs}"
                batched_lines.append(f"| {name} | {typ} | {bs} | {k[t][0]:.0f} | {ll[t][0]:.0f} | "
                                     f"{k[t][0] / ll[t][0]:.2f}x |")
        print("\n".join(lines[-2:]), flush=True)
    report = ["## Decode (tg128) and prefill (pp2048), one request", "", *lines, "",
              "## kiln / llama.cpp", "", "| model | weights | tg128 | pp2048 |", "|---|---|---:|---:|", *ratios]
    if batched_lines:
        report += ["", "## Batched decode, tok/s (all requests together)", "",
                   "| model | weights | requests | kiln | llama.cpp | kiln / llama.cpp |", "|---|---|---:|---:|---:|---:|",
                   *batched_lines]
    (a.out / "peer.md").write_text("\n".join(report) + "\n")
    print("\n".join(report), flush=True)
    for name, typ, path in files:
        if a.no_profile:
            break
        if (name, typ) in (("llama3-8b", "bf16"), ("smollm2-135m", "bf16")) and (not only or f"{name}-{typ}" in only):
            step_profile(kiln, path, a.out / "profiles.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
