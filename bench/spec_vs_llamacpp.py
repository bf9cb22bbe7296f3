#!/usr/bin/env python3
"""Speculative decoding of one request on the CPU, kiln beside llama.cpp: the same greedy generation with and
without drafts in each tool, interleaved rep by rep.

    python3 bench/spec_vs_llamacpp.py --model TARGET.gguf [--draft-model DRAFT.gguf] [--spec ngram draft]
        [--prompt FILE] [--raw] [-n 256] [--reps 3] [--draft-max 8] [--draft-p-min 0.5] [-t 2] [-c 4096]
        [--kiln PATH] [--json FILE] [--build-only]

e.g. python3 bench/spec_vs_llamacpp.py --model ~/.cache/kiln/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf

What runs (each rep: kiln plain, llama.cpp plain, then per --spec kiln's and llama.cpp's speculative run):
- plain: `kiln run --spec none` and `llama-lookup --spec-draft-n-max 0` (the lookup loop with no drafts: one
  target pass a token; llama-simple has no thread count and llama-speculative-simple cannot run without a
  speculator).
- ngram: `kiln run --spec ngram --draft-max K` and `llama-lookup --spec-draft-n-max K` (prompt lookup). They
  draft differently: kiln copies the tokens that followed the latest earlier occurrence of the longest suffix of
  2-8 tokens (prompt and output); llama-lookup keeps counts of what followed every 1-4-gram of the prompt and
  output and drafts token by token the most frequent continuation while it passes count and share thresholds
  (no static or dynamic n-gram cache files are given, so nothing carries over between runs).
- draft (needs --draft-model): `kiln run --draft-model D --draft-max K --draft-p-min P` and
  `llama-speculative-simple -md D --spec-type draft-simple --spec-draft-n-max K --spec-draft-p-min P`. Both
  draft greedily and stop at a token below P, but llama.cpp's P is the top token's share among the draft's top
  10 (its draft sampler is top-k 10), kiln's over the whole vocabulary.

Both tools get the same text: the prompt file rendered through the target's chat template (from the GGUF, with
Jinja2 as transformers renders it, one user message, add_generation_prompt, bos_token empty) unless --raw. kiln
takes it as a raw prompt (`kiln run -p TEXT` without --chat), llama.cpp as -p TEXT (not -f, which drops a final
newline); both tokenize it with special tokens parsed and add the BOS token where the model asks for one. The
script checks that `kiln run --chat` on the prompt file makes as many prompt tokens as kiln does from the
rendered text, and prints llama.cpp's count beside kiln's. Sampling is greedy (kiln --temp 0; llama.cpp --temp 0
--top-k 1), the same threads (-t, also llama.cpp's -tb), the same context (-c).

Decode tokens/s counts target passes after the prompt the way kiln's `decode:` line does: kiln's rate as it
prints it (tokens after the first, which comes out of the prefill, over the decode time); llama-lookup's
(tokens - 1) / its decode time (its first token also comes out of the prefill); llama-speculative-simple's
tokens / its decode time (it leaves the last prompt token to its first decode step). Printed: the median of the
reps (and each rep's), the speed-up over the tool's own plain run (llama.cpp's: the llama-lookup plain run), the
draft tokens made and kept (last rep), and whether the text equals the tool's plain text. kiln's speculative text
must be byte for byte its plain text (greedy): the script fails otherwise. llama.cpp's examples stop past -n (by
up to a draft) and llama-lookup prints the end-of-generation token, so for llama.cpp "prefix" (one text begins
the other) is as good as "yes"; "NO" is possible too: llama.cpp verifies a draft in one batch of several tokens,
whose arithmetic differs from a one-token pass, and where two tokens are close that changes the greedy choice
(SmolLM2-135M on the default prompt parts from its plain text after 33 bytes).

Other differences: kiln keeps the CPU KV cache in f32, llama.cpp in f16; both multiply with 8-bit activations.
Tokens/s on a machine doing other work is noisy: keep it idle, or raise --reps.

llama.cpp: llama-lookup and llama-speculative-simple are built once from the llama-cpp-python source package
that scripts/gpu-deps.sh fetches (~/.cache/kiln/peer/llama_cpp_python-VERSION.tar.gz), trimmed to the CPU
backend and those two examples, under ~/.cache/kiln/peer/llama.cpp-VERSION-spec (--peer-dir); about 10 minutes on
2 cores the first time, a second when up to date. kiln: --kiln, else $KILN_BIN, else build/release/tools/kiln/kiln.
Needs jinja2 (unless --raw).
"""
import argparse
import json
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kld_vs_llamacpp import isa_options, peer_version  # noqa: E402  (the pinned llama.cpp, its CPU options)

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kiln"
PEER_EXAMPLES = ("lookup", "speculative-simple")
PEER_TARGETS = ("llama-lookup", "llama-speculative-simple")


# --- llama.cpp -------------------------------------------------------------------------------------------------


def build_peer(src_dir: Path) -> Path:
    """llama-lookup and llama-speculative-simple of the pinned llama.cpp, CPU backend only, built under src_dir
    (a build that is up to date costs a second); returns the folder of the binaries."""
    version = peer_version()
    if not (src_dir / "CMakeLists.txt").exists():
        sdist = CACHE / "peer" / f"llama_cpp_python-{version}.tar.gz"
        if not sdist.exists():
            sys.exit(f"missing {sdist}: run scripts/gpu-deps.sh (it downloads the source package)")
        print(f"unpacking llama.cpp {version} into {src_dir}", file=sys.stderr)
        prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
        with tempfile.TemporaryDirectory() as tmp, tarfile.open(sdist) as tar:
            tar.extractall(tmp, members=[m for m in tar.getmembers() if m.name.startswith(prefix)], filter="data")
            src = Path(tmp) / prefix
            for d in ("models", "docs", "tests", "tools", "pocs", "benches", "media", "gguf-py", "conversion",
                      "scripts", "skills", "ci", "app", "grammars"):
                shutil.rmtree(src / d, ignore_errors=True)
            for d in (src / "examples").iterdir():
                if d.name not in PEER_EXAMPLES:
                    shutil.rmtree(d) if d.is_dir() else d.unlink()
            for d in (src / "ggml" / "src").glob("ggml-*/"):
                if d.is_dir() and d.name != "ggml-cpu":
                    shutil.rmtree(d)
            # LLAMA_BUILD_EXAMPLES adds examples/ and pocs/: only the two examples, no pocs.
            (src / "examples" / "CMakeLists.txt").write_text(
                "find_package(Threads REQUIRED)\nllama_add_compile_flags()\n"
                + "".join(f"add_subdirectory({e})\n" for e in PEER_EXAMPLES))
            (src / "pocs").mkdir()
            (src / "pocs" / "CMakeLists.txt").write_text("")
            src_dir.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(src), src_dir)
    build = src_dir / "build"
    print(f"building {', '.join(PEER_TARGETS)} in {build} (the first time: about 10 minutes on 2 cores)",
          file=sys.stderr)
    jobs = str(min(os.cpu_count() or 2, 2))
    for cmd in (["cmake", "-S", src_dir, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                 "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_EXAMPLES=ON",
                 "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF",
                 *isa_options()],
                ["nice", "cmake", "--build", build, "-j", jobs, "--target", *PEER_TARGETS]):
        run(cmd)
    return build / "bin"


# --- the prompt ------------------------------------------------------------------------------------------------


def gguf_string(path: Path, key: str) -> str | None:
    """A string of a GGUF file's metadata, read up to that key (None when the file has no such key)."""
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # the fixed-size value types

    with open(path, "rb") as f:
        def u32() -> int:
            return struct.unpack("<I", f.read(4))[0]

        def u64() -> int:
            return struct.unpack("<Q", f.read(8))[0]

        def skip(kind: int):
            if kind == 8:  # string
                f.seek(u64(), 1)
            elif kind == 9:  # array: item type, count, items
                item, n = u32(), u64()
                if item in sizes:
                    f.seek(n * sizes[item], 1)
                else:
                    for _ in range(n):
                        skip(item)
            else:
                f.seek(sizes[kind], 1)

        if f.read(4) != b"GGUF":
            sys.exit(f"{path} is not a GGUF file")
        u32()  # version
        u64()  # tensors
        for _ in range(u64()):
            name = f.read(u64()).decode()
            kind = u32()
            if name == key and kind == 8:
                return f.read(u64()).decode()
            skip(kind)
    return None


def render_chat(model: Path, user: str) -> str:
    """user as the one user message of model's chat template, with the generation prompt: Jinja2 set up as
    transformers sets it up for chat templates."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    source = gguf_string(model, "tokenizer.chat_template")
    if source is None:
        sys.exit(f"{model} has no chat template: use --raw")

    def raise_exception(message):
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source).render(messages=[{"role": "user", "content": user}], add_generation_prompt=True,
                                          bos_token="", eos_token="")


# --- runs ------------------------------------------------------------------------------------------------------


def run(cmd: list) -> subprocess.CompletedProcess:
    res = subprocess.run([str(c) for c in cmd], capture_output=True, encoding="utf-8", errors="replace")
    if res.returncode != 0:
        shown = " ".join(str(c) if len(str(c)) < 200 else "PROMPT" for c in cmd)
        sys.exit(f"{shown} failed ({res.returncode}):\n{res.stderr[-3000:]}\n{res.stdout[-2000:]}")
    return res


def number(pattern: str, text: str, kind=float):
    m = re.search(pattern, text, re.M)
    if m is None:
        sys.exit(f"no match for {pattern!r} in:\n{text[-3000:]}")
    return kind(m[1])


def kiln_run(a, prompt: str, spec: str, chat: bool = False, n: int | None = None) -> dict:
    cmd = [a.kiln, "run", "-m", a.model, "-p", prompt, "-n", a.n if n is None else n, "--temp", "0",
           "-t", a.threads, "-c", a.ctx, "-d", "cpu", "--spec", spec, "--draft-max", a.draft_max]
    if spec == "draft":
        cmd += ["--draft-model", a.draft_model, "--draft-p-min", a.draft_p_min]
    if chat:
        cmd.append("--chat")
    r = run(cmd)
    kept = re.search(r"^drafts:\s+(\d+) of (\d+)", r.stderr, re.M)
    return {"text": r.stdout,
            "prompt_tokens": number(r"^prompt:\s+(\d+) tokens", r.stderr, int),
            "tokens": number(r"^decode:\s+(\d+) tokens", r.stderr, int),
            "tps": number(r"^decode: .* ([\d.]+) tokens/s", r.stderr),
            "drafted": int(kept[2]) if kept else 0, "kept": int(kept[1]) if kept else 0}


def llama_run(a, prompt: str, spec: str) -> dict:
    """llama-lookup (spec none: no drafts; ngram) or llama-speculative-simple (draft)."""
    common = ["-p", prompt, "-n", a.n, "-c", a.ctx, "-t", a.threads, "-tb", a.threads, "--temp", "0", "--top-k", "1"]
    if spec == "draft":
        cmd = [a.peer_bin / "llama-speculative-simple", "-m", a.model, "-md", a.draft_model, *common,
               "--spec-type", "draft-simple", "--spec-draft-n-max", a.draft_max, "--spec-draft-p-min", a.draft_p_min]
    else:
        cmd = [a.peer_bin / "llama-lookup", "-m", a.model, *common,
               "--spec-draft-n-max", 0 if spec == "none" else a.draft_max]
    r = run(cmd)
    # stdout: "\n\n", the prompt's pieces, the generated pieces, "\n\n\n\n".
    at = r.stdout.find(prompt)
    if at < 0:
        sys.exit(f"llama.cpp did not echo the prompt:\n{r.stdout[:2000]}")
    text = r.stdout[at + len(prompt):].removesuffix("\n\n\n\n")
    tokens = number(r"decoded\s+(\d+) tokens", r.stderr, int)
    seconds = number(r"decoded\s+\d+ tokens in\s+([\d.]+) seconds", r.stderr)
    passes = tokens if spec == "draft" else tokens - 1
    return {"text": text,
            "prompt_tokens": number(r"encoded\s+(\d+) tokens", r.stderr, int),
            "tokens": tokens, "tps": passes / seconds,
            "drafted": number(r"n_drafted\s*=\s*(\d+)", r.stderr, int),
            "kept": number(r"n_accept\s*=\s*(\d+)", r.stderr, int)}


# --- report ----------------------------------------------------------------------------------------------------

PEER_NAMES = {"none": "llama-lookup --spec-draft-n-max 0", "ngram": "llama-lookup",
              "draft": "llama-speculative-simple"}


def same(text: str, plain: str) -> str:
    if text == plain:
        return "yes"
    return "prefix" if text.startswith(plain) or plain.startswith(text) else "NO"


def common_prefix(x: str, y: str) -> int:
    return next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="the target GGUF (required but with --build-only)")
    ap.add_argument("--draft-model", type=Path, help="a GGUF with the target's tokenizer (--spec draft)")
    ap.add_argument("--spec", nargs="+", choices=("ngram", "draft"),
                    help="what to measure (default: ngram, and draft when --draft-model is given)")
    ap.add_argument("--prompt", type=Path, default=ROOT / "bench/prompts/edit-rename.txt")
    ap.add_argument("--raw", action="store_true", help="the prompt file as it is, not a chat message")
    ap.add_argument("-n", type=int, default=256, help="tokens to generate at most")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--draft-max", type=int, default=8)
    ap.add_argument("--draft-p-min", type=float, default=0.5)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx", type=int, default=4096)
    ap.add_argument("--kiln", type=Path,
                    default=Path(os.environ.get("KILN_BIN", ROOT / "build/release/tools/kiln/kiln")))
    ap.add_argument("--peer-dir", type=Path, default=CACHE / "peer" / f"llama.cpp-{peer_version()}-spec",
                    help="where llama.cpp is unpacked and built")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--build-only", action="store_true", help="build llama.cpp's examples and stop")
    a = ap.parse_args()
    specs = a.spec or (["ngram", "draft"] if a.draft_model else ["ngram"])
    if not a.build_only and a.model is None:
        ap.error("--model is required")
    if "draft" in specs and a.draft_model is None:
        ap.error("--spec draft needs --draft-model")
    a.peer_bin = build_peer(a.peer_dir)
    if a.build_only:
        return

    user = a.prompt.read_text()
    prompt = user if a.raw else render_chat(a.model, user)
    chat_tokens = None if a.raw else kiln_run(a, user, "none", chat=True, n=1)["prompt_tokens"]

    results = {tool: {s: [] for s in ["none", *specs]} for tool in ("kiln", "llama.cpp")}
    for rep in range(a.reps):
        for spec in ["none", *specs]:
            for tool, fn in (("kiln", kiln_run), ("llama.cpp", llama_run)):
                r = fn(a, prompt, spec)
                results[tool][spec].append(r)
                print(f"rep {rep + 1}/{a.reps} {tool} {spec}: {r['tokens']} tokens, {r['tps']:.2f} tokens/s",
                      file=sys.stderr)

    kiln_prompt = results["kiln"]["none"][0]["prompt_tokens"]
    peer_prompt = results["llama.cpp"]["none"][0]["prompt_tokens"]
    if chat_tokens is not None and chat_tokens != kiln_prompt:
        sys.exit(f"kiln run --chat makes {chat_tokens} prompt tokens, the rendered text {kiln_prompt}")
    kiln_plain, peer_plain = results["kiln"]["none"][-1]["text"], results["llama.cpp"]["none"][-1]["text"]
    print(f"{a.model.name}" + (f", draft {a.draft_model.name}" if "draft" in specs else "")
          + f", {a.prompt.name} ({'raw' if a.raw else 'chat template'}), -n {a.n}, {a.threads} threads, "
          f"median of {a.reps}")
    print(f"prompt tokens: kiln {kiln_prompt}, llama.cpp {peer_prompt}; plain texts: the first "
          f"{common_prefix(kiln_plain, peer_plain)} of {len(kiln_plain)} (kiln) / {len(peer_plain)} (llama.cpp) "
          "characters the same\n")
    print("| tool | decoding | tokens | decode tokens/s | each rep | speed-up | draft tokens kept "
          "| same text as plain |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    rows = []
    for tool, plain_text in (("kiln", kiln_plain), ("llama.cpp", peer_plain)):
        plain_tps = statistics.median(r["tps"] for r in results[tool]["none"])
        for spec in ["none", *specs]:
            runs = results[tool][spec]
            last = runs[-1]
            tps = statistics.median(r["tps"] for r in runs)
            texts = [same(r["text"], plain_text) for r in runs]
            agree = next((t for t in ("NO", "prefix") if t in texts), "yes")
            name = f"--spec {spec}" if tool == "kiln" else PEER_NAMES[spec]
            kept = "" if spec == "none" else \
                f"{last['kept']} of {last['drafted']} ({100 * last['kept'] / max(1, last['drafted']):.0f}%)"
            each = ", ".join(f"{r['tps']:.1f}" for r in runs)
            print(f"| {tool} | {name} | {last['tokens']} | {tps:.2f} | {each} | {tps / plain_tps:.2f} | {kept} | "
                  f"{'' if spec == 'none' else agree} |")
            rows.append({"tool": tool, "spec": spec, "command": name, "tokens": last["tokens"],
                         "tokens_per_s": [r["tps"] for r in runs], "median_tokens_per_s": tps,
                         "speedup": tps / plain_tps, "drafted": last["drafted"], "kept": last["kept"],
                         "same_text_as_plain": agree, "prompt_tokens": last["prompt_tokens"]})
    if a.json:
        a.json.write_text(json.dumps({"model": str(a.model), "draft_model": str(a.draft_model or ""),
                                      "prompt": str(a.prompt), "raw": a.raw, "n": a.n, "threads": a.threads,
                                      "ctx": a.ctx, "draft_max": a.draft_max, "draft_p_min": a.draft_p_min,
                                      "reps": a.reps, "rows": rows}, indent=2) + "\n")
    if any(r["tool"] == "kiln" and r["same_text_as_plain"] != "yes" for r in rows if r["spec"] != "none"):
        sys.exit("kiln's speculative text differs from its plain text")


if __name__ == "__main__":
    main()
