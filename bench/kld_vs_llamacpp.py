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
  on the same base file, how far apart the two base files are (tokens equal, mean KL of the stored
  distributions, same top token), and the noise floor: the same ratios for llama.cpp against itself with flash
  attention off. Both engines round activations to 8 bits, so any change of arithmetic re-draws the rounding
  noise of the whole pass: over the default text (8 chunks, 2,040 scored tokens) same top and Δppl move by
  0.5-1.3% between equally right runs; over 64 chunks (--text, e.g. /usr/share/common-licenses' texts
  concatenated) by under 0.5%.
"""
import argparse
import os
import platform
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


def isa_options() -> list[str]:
    """ggml's CPU options for this machine. On x86-64: its instruction sets from /proc/cpuinfo, AMX left out
    (-march=native turns AMX on wherever the CPU lists it, and a virtual machine that does not grant the AMX
    state then dies on the first tile instruction); elsewhere -march=native."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return ["-DGGML_NATIVE=ON"]
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    want = {"GGML_SSE42": "sse4_2", "GGML_AVX": "avx", "GGML_AVX2": "avx2", "GGML_FMA": "fma", "GGML_F16C": "f16c",
            "GGML_BMI2": "bmi2", "GGML_AVX_VNNI": "avx_vnni", "GGML_AVX512": "avx512bw",
            "GGML_AVX512_VBMI": "avx512vbmi", "GGML_AVX512_VNNI": "avx512_vnni", "GGML_AVX512_BF16": "avx512_bf16"}
    return ["-DGGML_NATIVE=OFF"] + [f"-D{opt}={'ON' if flag in flags else 'OFF'}" for opt, flag in want.items()]


# Built beside llama-perplexity for bench/quant_quality.py (--peer PEER_BUILD/build/bin).
PEER_TOOLS = ("perplexity", "imatrix", "quantize")


def build_llama_perplexity() -> Path:
    """llama-perplexity (and llama-imatrix, llama-quantize) of the pinned llama.cpp, CPU backend only, built under PEER_BUILD (a build that is up to
    date costs a second)."""
    version = peer_version()
    if not (PEER_BUILD / "CMakeLists.txt").exists():
        sdist = CACHE / "peer" / f"llama_cpp_python-{version}.tar.gz"
        if not sdist.exists():
            sys.exit(f"missing {sdist}: run scripts/gpu-deps.sh (it downloads the source package)")
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
                if d.is_dir() and d.name not in PEER_TOOLS:
                    shutil.rmtree(d)
            for d in (src / "ggml" / "src").glob("ggml-*/"):
                if d.is_dir() and d.name != "ggml-cpu":
                    shutil.rmtree(d)
            (src / "tools" / "CMakeLists.txt").write_text(
                "llama_add_compile_flags()\n" + "".join(f"add_subdirectory({t})\n" for t in PEER_TOOLS))
            PEER_BUILD.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(src), PEER_BUILD)
    build = PEER_BUILD / "build"
    print(f"building llama-perplexity in {build} (the first time: 10-15 minutes on 2 cores)", file=sys.stderr)
    jobs = str(min(os.cpu_count() or 2, 2))
    for cmd in (["cmake", "-S", PEER_BUILD, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                 "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF",
                 "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF", *isa_options()],
                ["nice", "cmake", "--build", build, "-j", jobs, "--target",
                 *(f"llama-{t}" for t in PEER_TOOLS)]):
        run(cmd)
    return build / "bin" / "llama-perplexity"


# --- runs ------------------------------------------------------------------------------------------------------


def run(cmd: list, env: dict | None = None) -> tuple[str, float]:
    """stdout + stderr of cmd (which must succeed), and its wall seconds."""
    t0 = time.perf_counter()
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t0
    if res.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed ({res.returncode}):\n{res.stderr[-3000:]}\n{res.stdout[-2000:]}")
    return res.stdout + "\n" + res.stderr, seconds


NUMBER = r"-?[\d.]+|nan|-?inf"
LINE = re.compile(rf"^(?P<label>[^:=\[]+?)\s*:\s*(?P<value>{NUMBER})\s*(?:±\s*(?P<error>{NUMBER}))?\s*%?\s*$")
SECTION = "====== Perplexity statistics ======"


def parse_summary(text: str) -> dict[str, tuple[float, float | None]]:
    """The summary both tools print (llama-perplexity's layout): label -> (value, error or None)."""
    at = text.find(SECTION)
    if at < 0:
        sys.exit(f"no summary in:\n{text[-3000:]}")
    out = {}
    for line in text[at:].splitlines():
        line = re.sub(r"^\S+ [IWE] ", "", line.strip())  # llama.cpp's log prefix, when there is one
        m = LINE.match(line)
        if m:
            out[" ".join(m["label"].split())] = (float(m["value"]), float(m["error"]) if m["error"] else None)
    return out


# --- base files ------------------------------------------------------------------------------------------------


class BaseFile:
    """A --kl-divergence-base file, mapped (quant/kld_file.h's layout)."""

    def __init__(self, path: Path):
        head = np.fromfile(path, np.uint8, 20)
        assert bytes(head[:8]) == b"_logits_", path
        self.n_ctx = int(head[8:12].view("<u4")[0])
        self.n_vocab, self.n_chunk = (int(v) for v in head[12:20].view("<i4"))
        self.tokens = np.memmap(path, "<i4", "r", 20, (self.n_chunk, self.n_ctx))
        self.n_scored = self.n_ctx - 1 - self.n_ctx // 2
        nv = 2 * ((self.n_vocab + 1) // 2) + 4
        self.rows = np.memmap(path, "<u2", "r", 20 + 4 * self.n_chunk * self.n_ctx, (self.n_chunk, self.n_scored, nv))

    def log_probs(self, c: int, j: int) -> np.ndarray:
        scale, lo = self.rows[c, j, :4].copy().view("<f4")
        return (scale * self.rows[c, j, 4 : 4 + self.n_vocab].astype(np.float32) + lo).astype(np.float64)


def compare_bases(a: BaseFile, b: BaseFile) -> str:
    """How far apart two base files of the same model are: their tokens, and over the chunks with the same tokens
    the mean KL(a || b) of the stored distributions and how often their top tokens agree."""
    if (a.n_ctx, a.n_vocab) != (b.n_ctx, b.n_vocab):
        return f"different shapes: n_ctx {a.n_ctx} vs {b.n_ctx}, n_vocab {a.n_vocab} vs {b.n_vocab}"
    n = min(a.n_chunk, b.n_chunk)
    same = [c for c in range(n) if np.array_equal(a.tokens[c], b.tokens[c])]
    note = f"{len(same)} of {n} chunks hold the same tokens"
    if len(same) < n:
        first = next(c for c in range(n) if c not in same)
        at = int(np.argmax(a.tokens[first] != b.tokens[first]))
        note += f" (the first difference: chunk {first}, position {at})"
    if not same:
        return note
    kl, top = [], []
    for c in same:
        for j in range(a.n_scored):
            la, lb = a.log_probs(c, j), b.log_probs(c, j)
            pa = np.exp(la)
            kl.append(float((pa * (la - lb)).sum()))
            top.append(np.argmax(la) == np.argmax(lb))
    return (f"{note}; over them mean KL(llama.cpp's || kiln's) {np.mean(kl):.6f}, "
            f"same top token {100 * np.mean(top):.2f}%")


# --- main -------------------------------------------------------------------------------------------------------


ROWS = ["Mean PPL(Q)", "Mean PPL(base)", "Cor(ln(PPL(Q)), ln(PPL(base)))", "Mean ln(PPL(Q)/PPL(base))",
        "Mean PPL(Q)/PPL(base)", "Mean PPL(Q)-PPL(base)", "Mean KLD", "Maximum KLD", "99.9% KLD", "99.0% KLD",
        "95.0% KLD", "90.0% KLD", "Median KLD", "10.0% KLD", "5.0% KLD", "1.0% KLD", "0.1% KLD", "Minimum KLD",
        "Mean Δp", "Maximum Δp", "99.0% Δp", "Median Δp", "1.0% Δp", "Minimum Δp", "RMS Δp", "Same top p"]


def fmt(v: tuple[float, float | None] | None) -> str:
    if v is None:
        return "-"
    return f"{v[0]:.6f}" + (f" ± {v[1]:.6f}" if v[1] is not None else "")


def ratio(a, b) -> str:
    if a is None or b is None or b[0] == 0:
        return "-"
    return f"{a[0] / b[0]:.4f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, default=SMOL)
    ap.add_argument("--quant", type=Path, help="default: BASE requantized to Q4_0 (gguf-py), cached")
    ap.add_argument("--text", type=Path, help="default: the Python tests' parity text")
    ap.add_argument("-c", "--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=0, help="0: all the text holds")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--build-only", action="store_true")
    args = ap.parse_args()
    llama = build_llama_perplexity()
    if args.build_only:
        print(llama)
        return 0
    if not KILN.exists():
        sys.exit(f"missing {KILN}: run scripts/build.sh release kiln (or set KILN_BIN)")
    work = Path(tempfile.mkdtemp(prefix="kld-bench-"))
    try:
        text = args.text
        if text is None:
            from parity_text import PARITY_TEXT

            text = work / "text.txt"
            text.write_text(PARITY_TEXT)
        quant = args.quant
        if quant is None:
            from importlib.metadata import version

            from gguf_dequant import requantize_gguf

            st = args.base.stat()
            name = f"{args.base.stem}-{st.st_size}-{int(st.st_mtime)}-gguf-{version('gguf')}-Q4_0.gguf"
            quant = CACHE / "bench" / name
            if not quant.exists():
                quant.parent.mkdir(parents=True, exist_ok=True)
                print(f"writing {quant} (gguf-py: Q4_1 matrices dequantized and quantized to Q4_0)", file=sys.stderr)
                tmp = quant.with_name(quant.name + ".tmp")
                requantize_gguf(args.base, tmp, "Q4_1", "Q4_0")
                tmp.rename(quant)
        # llama.cpp's OpenMP threads sleep rather than spin while they wait: on a shared machine spinning threads
        # slow it down many times over. Values do not depend on it.
        llama_env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
        chunks = ["--chunks", args.chunks] if args.chunks > 0 else []
        common = ["-c", args.ctx, "-t", args.threads, *chunks]
        kiln_kld, llama_kld = work / "kiln.kld", work / "llama.kld"
        out, s_llama_base = run([llama, "-m", args.base, "-f", text, *common, "--kl-divergence-base", llama_kld],
                                llama_env)
        llama_ppl = re.search(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)", out)
        out, s_kiln_base = run([KILN, "perplexity", "-m", args.base, "-f", text, *common, "-d", "cpu",
                                "--kl-divergence-base", kiln_kld])
        kiln_ppl = re.search(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)", out)
        results, seconds = {}, {}
        for base_name, base in (("kiln", kiln_kld), ("llama.cpp", llama_kld)):
            out, seconds[("kiln", base_name)] = run(
                [KILN, "perplexity", "-m", quant, "--kl-divergence-base", base, "--kl-divergence", "-t",
                 args.threads, "-d", "cpu"])
            results[("kiln", base_name)] = parse_summary(out)
            out, seconds[("llama.cpp", base_name)] = run(
                [llama, "-m", quant, "--kl-divergence-base", base, "--kl-divergence", "-c", args.ctx, "-t",
                 args.threads], llama_env)
            results[("llama.cpp", base_name)] = parse_summary(out)
        # The noise floor: llama.cpp against itself with another attention path (flash attention off), the same
        # computation rounded differently. With activations rounded to 8 bits, any such change re-draws the
        # rounding noise of the whole forward pass; the statistics then move about as far as between two engines.
        out, _ = run([llama, "-m", quant, "--kl-divergence-base", llama_kld, "--kl-divergence", "-c", args.ctx,
                      "-t", args.threads, "-fa", "off"], llama_env)
        llama_fa_off = parse_summary(out)

        print(f"base {args.base.name}, Q {quant.name}, text {text.name}, chunks of {args.ctx}, {args.threads} threads")
        print(f"base pass: kiln PPL {kiln_ppl[1]} ± {kiln_ppl[2]} ({s_kiln_base:.1f} s), "
              f"llama-perplexity PPL {llama_ppl[1]} ± {llama_ppl[2]} ({s_llama_base:.1f} s)")
        print(f"base files: {compare_bases(BaseFile(llama_kld), BaseFile(kiln_kld))}")
        print(f"KL-divergence runs (s): " + ", ".join(f"{t} on {b}'s base {s:.1f}" for (t, b), s in seconds.items()))
        head = (f"{'':32} {'kiln, kiln base':>24} {'llama.cpp, kiln base':>24} {'ratio':>7}   "
                f"{'kiln, llama.cpp base':>24} {'llama.cpp, llama.cpp base':>26} {'ratio':>7}")
        print(head)
        for row in ROWS:
            cells = []
            for base_name in ("kiln", "llama.cpp"):
                a, b = results[("kiln", base_name)].get(row), results[("llama.cpp", base_name)].get(row)
                cells += [fmt(a), fmt(b), ratio(a, b)]
            print(f"{row:32} {cells[0]:>24} {cells[1]:>24} {cells[2]:>7}   {cells[3]:>24} {cells[4]:>26} {cells[5]:>7}")
        floor = ", ".join(f"{row} {ratio(llama_fa_off.get(row), results[('llama.cpp', 'llama.cpp')].get(row))}"
                          for row in ("Mean KLD", "Same top p", "Mean PPL(Q)/PPL(base)", "Mean PPL(Q)-PPL(base)"))
        print(f"noise floor, llama.cpp -fa off / llama.cpp on llama.cpp's base: {floor}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
