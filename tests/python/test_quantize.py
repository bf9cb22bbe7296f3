"""`kiln quantize` against llama.cpp's quantizer (llama_model_quantize, what llama-quantize runs) on the same input:

1. SmolLM2-135M dequantized to an F16 file: for every file type, each tensor's type is the one llama.cpp chooses
   (its dry run; most of SmolLM2's rows, 576 long, are not whole 256-blocks, so the fallbacks are exercised), and
   for a few types the whole file is byte-identical to llama.cpp's.
2. Two tiny random models, qwen2 (GQA 4, an output head of its own, FFN down rows of 272: not whole 32-blocks)
   and qwen2moe (8 experts stacked in 3-d tensors, a shared expert): every file type's tensor types, with and
   without an importance matrix; the whole file byte-identical for every legacy and k-quant type and a set of
   i-quants, with an importance matrix (per expert for the stacked experts) where the type needs or uses one;
   --pure, --tensor-type, --output-tensor-type, --token-embedding-type, --allow-requantize; threads.
   Where kiln has no quantizer for a type yet, the types are compared and the bytes are not.
   KILN_QUANTIZE_ALL=1 compares the whole file for every type (minutes).
3. Bad input: the input as output (also via a hard link, also with --force), an existing output without
   --force, a write that fails (RLIMIT_FSIZE), a truncated input, an unknown type, bad --tensor-type specs, a
   quantized input without --allow-requantize, an i-quant without an importance matrix, an importance matrix
   whose entry does not fit or is missing. Each is an error naming what is wrong; nothing is left behind.
4. kiln runs the file it wrote, and llama.cpp loads and evaluates it.
"""
from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

from quantize_lib import (FTYPES, NEED_IMATRIX, first_difference, imatrix_entries, llama_plan, llama_quantize,
                          tensor_types, write_f16_copy, write_imatrix, write_legacy_imatrix, write_tiny_model)

MODELS = Path(os.environ.get("KILN_MODELS_DIR") or Path.home() / ".cache/kiln/models")
SMOL_Q4_1 = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
KILN = Path(os.environ.get("KILN_BUILD_DIR", "build")) / "tools" / "kiln" / "kiln"
ALL_TYPES = list(FTYPES)
# Whole files compared (quantizing is the slow part, the i-quants most; the types of every file type are
# compared by the dry runs): SmolLM2 in one type of each family that fits its 576-long rows differently, the
# tiny models in every legacy and k-quant type and the quickest i-quants, with an importance matrix where the
# type needs one ("+im": also with one where it only changes the result). KILN_QUANTIZE_ALL=1: every type
# (minutes).
ALL = os.environ.get("KILN_QUANTIZE_ALL") == "1"
SMOL_BYTE_TYPES = [t for t in ALL_TYPES if t not in NEED_IMATRIX] if ALL else ["BF16", "Q4_0", "Q4_K_M"]
IMATRIX_TOO = {"Q4_0", "Q5_0", "Q4_K_M", "IQ4_NL", "IQ4_XS", "IQ3_S"}
TINY_BYTE_CASES = {
    "qwen2": ["F32", "F16", "Q8_0", "Q4_0+im", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q2_K_S", "Q3_K_S", "Q3_K_M",
              "Q3_K_L", "Q4_K_S", "Q4_K_M+im", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS+im", "IQ2_XXS"],
    "qwen2moe": ["BF16", "Q8_0", "Q5_1", "Q3_K_M", "Q4_K_M+im", "Q2_K_S", "IQ4_XS", "IQ2_XXS"],
}
if ALL:
    TINY_BYTE_CASES = {a: [t + ("+im" if t in IMATRIX_TOO else "") for t in ALL_TYPES] for a in TINY_BYTE_CASES}
RESULTS: dict[str, str] = {}  # "model type" -> "bytes" | "types" (printed at the end with -s)


def kiln(*args, check: bool = False, **kw) -> subprocess.CompletedProcess:
    assert KILN.exists(), f"build kiln first ({KILN})"
    p = subprocess.run([str(KILN), *map(str, args)], capture_output=True, text=True, timeout=300, **kw)
    if check:
        assert p.returncode == 0, p.stderr[-3000:]
    return p


def kiln_plan(src: Path, ftype: str, *extra) -> list[tuple[str, str]]:
    """(name, type) of each tensor kiln would write (--dry-run), in its order."""
    p = kiln("quantize", src, ftype, "--dry-run", *extra, check=True)
    return [(m[1], m[2]) for m in re.finditer(r"^(\S+)\s+\[[^\]]*\]\s+\S+\s+->\s+(\S+)", p.stdout, re.M)]


def compare(src: Path, ftype: str, tmp: Path, label: str, imatrix: tuple[Path, dict] | None = None,
            extra: tuple = (), llama_kw: dict | None = None, keep: bool = False) -> str:
    """kiln's file vs llama.cpp's for one file type: byte-identical, or (where kiln cannot write one of the
    types yet) the same types. Returns "bytes" or "types". keep: kiln's file is left for later tests."""
    out_k, out_l = tmp / f"{label}-{ftype}-kiln.gguf", tmp / f"{label}-{ftype}-llama.gguf"
    args = list(extra)
    kw = dict(llama_kw or {})
    if imatrix:
        args += ["--imatrix", imatrix[0]]
        kw.update(imatrix=imatrix[1], imatrix_file=str(imatrix[0]), dataset="calib.txt", chunk_count=10)
    p = kiln("quantize", src, out_k, ftype, "-t", "2", *args)
    if p.returncode != 0:
        assert "kiln cannot write type" in p.stderr, p.stderr[-3000:]
        assert not out_k.exists()
        assert kiln_plan(src, ftype, *args) == llama_plan(src, ftype, **kw)
        return "types"
    llama_quantize(src, out_l, ftype, **kw)
    assert tensor_types(out_k) == tensor_types(out_l)
    same = out_k.read_bytes() == out_l.read_bytes()
    assert same, first_difference(out_k, out_l)
    if not keep:
        out_k.unlink()
    out_l.unlink()
    return "bytes"


# ------------------------------------------------------------------------------------------------------------
# Inputs


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("quantize")


@pytest.fixture(scope="module")
def smol(tmp) -> Path:
    if not SMOL_Q4_1.exists():
        pytest.fail(f"missing test model {SMOL_Q4_1} (set KILN_MODELS_DIR)")
    return write_f16_copy(SMOL_Q4_1, tmp / "smol-f16.gguf")


@pytest.fixture(scope="module")
def tiny(tmp) -> dict[str, Path]:
    return {
        "qwen2": write_tiny_model(tmp / "tiny-qwen2.gguf", "qwen2", n_layer=8, n_embd=256, n_head=8, n_head_kv=2,
                                  n_ff=272, n_vocab=320, tied=False, seed=1),
        "qwen2moe": write_tiny_model(tmp / "tiny-qwen2moe.gguf", "qwen2moe", n_layer=8, n_embd=256, n_head=4,
                                     n_head_kv=4, n_ff=256, n_vocab=320, tied=False, n_expert=8, n_ff_exp=64,
                                     n_ff_shexp=256, seed=2),
    }


@pytest.fixture(scope="module")
def tiny_imatrix(tmp, tiny) -> dict[str, tuple[Path, dict]]:
    out = {}
    for name, path in tiny.items():
        entries = imatrix_entries(path, seed=3)
        out[name] = (write_imatrix(tmp / f"{name}.imatrix.gguf", entries), entries)
    return out


# ------------------------------------------------------------------------------------------------------------
# 1-2. The same files as llama.cpp


@pytest.mark.parametrize("ftype", ALL_TYPES)
def test_smollm2_types_match_llama_cpp(smol, ftype):
    """Every tensor's type, for every file type, as llama.cpp's dry run has it (the types that need an
    importance matrix too: a dry run decides them without one)."""
    assert kiln_plan(smol, ftype) == llama_plan(smol, ftype)


@pytest.mark.parametrize("ftype", SMOL_BYTE_TYPES)
def test_smollm2_file_matches_llama_cpp(smol, tmp, ftype):
    RESULTS[f"SmolLM2 {ftype}"] = compare(smol, ftype, tmp, "smol", keep=ftype == "Q4_K_M")


@pytest.mark.parametrize("arch", ["qwen2", "qwen2moe"])
@pytest.mark.parametrize("ftype", ALL_TYPES)
def test_tiny_types_match_llama_cpp(tiny, tiny_imatrix, arch, ftype):
    """Every file type's tensor types, without and with an importance matrix (some rules differ with one)."""
    assert kiln_plan(tiny[arch], ftype) == llama_plan(tiny[arch], ftype)
    path, entries = tiny_imatrix[arch]
    assert kiln_plan(tiny[arch], ftype, "--imatrix", path) == llama_plan(tiny[arch], ftype, imatrix=entries)


@pytest.mark.parametrize("case", [(a, t) for a, ts in TINY_BYTE_CASES.items() for t in ts], ids="-".join)
def test_tiny_file_matches_llama_cpp(tiny, tiny_imatrix, tmp, case):
    arch, spec = case
    ftype = spec.removesuffix("+im")
    im = tiny_imatrix[arch] if ftype in NEED_IMATRIX else None
    RESULTS[f"{arch} {ftype}"] = compare(tiny[arch], ftype, tmp, arch, imatrix=im)
    if spec.endswith("+im"):
        RESULTS[f"{arch} {ftype} imatrix"] = compare(tiny[arch], ftype, tmp, arch, imatrix=tiny_imatrix[arch])


def test_options_match_llama_cpp(tiny, tmp):
    """--pure, --tensor-type (first match wins, lower-cased), --output-tensor-type, --token-embedding-type."""
    src = tiny["qwen2"]
    ids = {"q8_0": 8, "q6_k": 14, "f16": 1, "q5_0": 6}
    RESULTS["qwen2 Q4_0 --pure"] = compare(src, "Q4_0", tmp, "pure", extra=("--pure",), llama_kw={"pure": True})
    RESULTS["qwen2 Q4_0 --tensor-type"] = compare(
        src, "Q4_0", tmp, "tt", extra=("--tensor-type", "ATTN_V=q8_0", "--tensor-type", r"blk\.[0-3]\.ffn=q5_0"),
        llama_kw={"tensor_types": [("attn_v", ids["q8_0"]), (r"blk\.[0-3]\.ffn", ids["q5_0"])]})
    RESULTS["qwen2 Q4_0 --output/--token-embedding-type"] = compare(
        src, "Q4_0", tmp, "oe", extra=("--output-tensor-type", "f16", "--token-embedding-type", "q8_0"),
        llama_kw={"output_type": ids["f16"], "token_embd_type": ids["q8_0"]})


def test_legacy_imatrix_matches_llama_cpp(tiny, tmp):
    """A legacy .dat importance matrix (a stacked weight's experts in one entry) for the MoE model."""
    src = tiny["qwen2moe"]
    dat = tmp / "qwen2moe.imatrix.dat"
    seen = write_legacy_imatrix(dat, imatrix_entries(src, seed=4))
    RESULTS["qwen2moe Q4_K_M legacy imatrix"] = compare(src, "Q4_K_M", tmp, "legacy", imatrix=(dat, seen))


def test_type_names(tiny):
    """As llama-quantize takes them: any case, the _M aliases, the file type number."""
    want = kiln_plan(tiny["qwen2"], "Q4_K_M")
    for name in ("q4_k_m", "Q4_K", "15"):
        assert kiln_plan(tiny["qwen2"], name) == want


def test_requantize_matches_llama_cpp(tiny, tmp):
    """A quantized input with --allow-requantize: its q4_k, q6_k, q5_0 and f16 tensors dequantized as ggml
    dequantizes them, the same file."""
    q4 = tmp / "requant-src.gguf"
    llama_quantize(tiny["qwen2"], q4, "Q4_K_M")
    RESULTS["qwen2 Q4_K_M -> Q8_0 --allow-requantize"] = compare(
        q4, "Q8_0", tmp, "requant", extra=("--allow-requantize",), llama_kw={"allow_requantize": True})


def test_threads_do_not_change_the_bytes(tiny, tmp):
    src = tiny["qwen2moe"]
    outs = []
    for t in (1, 3):
        out = tmp / f"threads-{t}.gguf"
        p = kiln("quantize", src, out, "Q8_0", "-t", t)
        if p.returncode != 0 and "kiln cannot write type" in p.stderr:
            p = kiln("quantize", src, out, "BF16", "-t", t, "--force")
        assert p.returncode == 0, p.stderr
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]


def test_summary():
    """Prints which comparisons were byte for byte (run with -s)."""
    by = {}
    for k, v in RESULTS.items():
        by.setdefault(v, []).append(k)
    for v, ks in sorted(by.items()):
        print(f"\n{v} ({len(ks)}): {', '.join(ks)}")


# ------------------------------------------------------------------------------------------------------------
# 3. Bad input


def error_of(p: subprocess.CompletedProcess) -> str:
    assert p.returncode != 0, p.stderr
    assert "error" in p.stderr and "Traceback" not in p.stderr and "terminate" not in p.stderr, p.stderr
    return p.stderr


def leftovers(folder: Path, before: set) -> set:
    return {p.name for p in folder.iterdir()} - before


def test_output_is_never_the_input(tiny, tmp):
    src = tiny["qwen2"]
    data = src.read_bytes()
    for extra in ((), ("--force",)):
        err = error_of(kiln("quantize", src, src, "Q8_0", *extra))
        assert str(src) in err or src.name in err
        link = tmp / "hard-link.gguf"
        link.unlink(missing_ok=True)
        os.link(src, link)
        error_of(kiln("quantize", src, link, "Q8_0", *extra))
        link.unlink()
    assert src.read_bytes() == data


def test_existing_output_needs_force(tiny, tmp):
    out = tmp / "exists.gguf"
    out.write_bytes(b"keep me")
    assert "--force" in error_of(kiln("quantize", tiny["qwen2"], out, "BF16"))
    assert out.read_bytes() == b"keep me"
    kiln("quantize", tiny["qwen2"], out, "BF16", "--force", check=True)
    assert out.read_bytes()[:4] == b"GGUF"


def test_a_failed_write_leaves_nothing(tiny, tmp):
    """A full disk, as a file size limit: the write error named, no output, no temporary file."""
    folder = tmp / "full"
    folder.mkdir()

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    p = subprocess.run([str(KILN), "quantize", str(tiny["qwen2"]), str(folder / "out.gguf"), "F16"],
                       capture_output=True, text=True, timeout=120, preexec_fn=limit)
    err = error_of(p)
    assert "out.gguf" in err and "failed" in err, err
    assert list(folder.iterdir()) == []


def test_truncated_input(tiny, tmp):
    cut = tmp / "cut.gguf"
    data = tiny["qwen2"].read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    err = error_of(kiln("quantize", cut, tmp / "cut-out.gguf", "Q8_0"))
    assert "cut.gguf" in err
    assert not (tmp / "cut-out.gguf").exists()


@pytest.mark.parametrize("args, message", [
    (("Q4_K_X",), "unknown type 'Q4_K_X'"),
    (("Q4_0", "--tensor-type", "attn_v"), "PATTERN=TYPE"),
    (("Q4_0", "--tensor-type", "attn_(v=q8_0"), "attn_(v"),
    (("Q4_0", "--tensor-type", "attn_v=q9_9"), "q9_9"),
    (("Q4_0", "--tensor-type", "=q8_0"), "pattern is empty"),
    (("Q4_0", "--output-tensor-type", "q3_x"), "q3_x"),
])
def test_bad_options(tiny, tmp, args, message):
    out = tmp / "bad-options.gguf"
    err = error_of(kiln("quantize", tiny["qwen2"], out, *args))
    assert message in err, err
    assert not out.exists()


def test_quantized_input_needs_allow_requantize(tmp):
    err = error_of(kiln("quantize", SMOL_Q4_1, tmp / "rq.gguf", "Q8_0"))
    assert "--allow-requantize" in err and "q4_1" in err


def test_iquant_needs_an_imatrix(tiny, tmp):
    err = error_of(kiln("quantize", tiny["qwen2"], tmp / "iq.gguf", "IQ2_XS"))
    assert "--imatrix" in err and "blk.0." in err


def test_imatrix_that_does_not_fit(tiny, tmp):
    src = tiny["qwen2"]
    entries = imatrix_entries(src)
    name = "blk.1.attn_q.weight"
    sums, counts = entries[name]
    bad = dict(entries)
    bad[name] = (sums[:, :128], counts)
    err = error_of(kiln("quantize", src, tmp / "im.gguf", "IQ2_XS", "--imatrix",
                        write_imatrix(tmp / "bad-cols.imatrix.gguf", bad)))
    assert name in err and "128" in err
    missing = {k: v for k, v in entries.items() if k != name}
    err = error_of(kiln("quantize", src, tmp / "im.gguf", "IQ2_XS", "--imatrix",
                        write_imatrix(tmp / "missing.imatrix.gguf", missing)))
    assert name in err
    assert not (tmp / "im.gguf").exists()


# ------------------------------------------------------------------------------------------------------------
# 4. The output runs


def test_kiln_and_llama_cpp_run_the_output(smol, tmp):
    """The SmolLM2 Q4_K_M file kiln wrote above (or, where kiln cannot write its types yet, a BF16 one)."""
    out = tmp / "smol-Q4_K_M-kiln.gguf"
    if not out.exists():
        out = tmp / "smol-run.gguf"
        kiln("quantize", smol, out, "BF16", check=True)
    run = kiln("run", "-m", out, "-p", "The capital of France is", "-n", "8", "--temp", "0", check=True)
    assert run.stdout.strip()
    from llama_cpp import Llama

    llm = Llama(model_path=str(out), n_ctx=64, logits_all=True, verbose=False, n_threads=2)
    tokens = llm.tokenize(b"The capital of France is", add_bos=True)
    llm.eval(tokens)
    logits = np.array(llm.scores[len(tokens) - 1])
    assert np.isfinite(logits).all() and logits.std() > 0


# ------------------------------------------------------------------------------------------------------------
# 5. Size budgets and plans


def test_target_size_and_plans(tiny, tmp):
    """--target-size at the Q4_K_M file's size: the file fits and uses the budget, with no more rounding error
    than the mix's types; --target-bpw in bits per weight; --save-plan then --plan writes the same bytes;
    budgets that cannot be met and plans of another model are errors that leave no file."""
    # FFN rows of 512: every weight matrix fits a 256-block ladder (the fixture's 272 fall back to f16).
    src = write_tiny_model(tmp / "tiny-budget.gguf", "qwen2", n_layer=4, n_embd=256, n_head=8, n_head_kv=2,
                           n_ff=512, n_vocab=320, tied=False, seed=5)
    imx = write_imatrix(tmp / "tiny-budget.imatrix.gguf", imatrix_entries(src, seed=6))
    preset = tmp / "budget-preset.gguf"
    kiln("quantize", src, preset, "Q4_K_M", "--imatrix", imx, check=True)
    size = preset.stat().st_size
    out, plan = tmp / "budget.gguf", tmp / "budget.plan"
    r = kiln("quantize", src, out, "Q4_K_M", "--imatrix", imx, "--target-size", size, "--save-plan", plan,
             check=True)
    assert 0.98 * size <= out.stat().st_size <= size, (out.stat().st_size, size)
    m = re.search(r"typed (\d+) weight matrices: rounding error ([\d.e+-]+) in all, against ([\d.e+-]+)", r.stderr)
    assert m and int(m[1]) > 0, r.stderr
    assert float(m[2]) <= float(m[3]), r.stderr
    assert f"the file is {out.stat().st_size} bytes" in r.stderr, r.stderr
    types = {line.split()[1] for line in plan.read_text().splitlines()[1:]}
    assert len(types) >= 2, types  # a mix, not one type
    again = tmp / "budget-again.gguf"
    kiln("quantize", src, again, "Q4_K_M", "--imatrix", imx, "--plan", plan, check=True)
    assert again.read_bytes() == out.read_bytes()
    small = tmp / "budget-small.gguf"
    r = kiln("quantize", src, small, "Q4_K_M", "--imatrix", imx, "--target-bpw", "3.5", check=True)
    from gguf import GGUFReader

    n_params = sum(int(t.n_elements) for t in GGUFReader(str(src)).tensors)
    assert small.stat().st_size * 8 <= 3.5 * n_params
    # Bad budgets and plans: an error naming the cause, no file.
    bad = tmp / "budget-bad.gguf"
    for args, message in (
            (("--target-size", "1000"), "cannot be met"),
            (("--target-bpw", "-1"), "--target-bpw -1"),
            (("--target-bpw", "4", "--target-size", str(size)), "give one of them"),
            (("--target-bpw", "4", "--plan", str(plan)), "give one of them")):
        err = error_of(kiln("quantize", src, bad, "Q4_K_M", *args))
        assert message in err, (args, err)
    err = error_of(kiln("quantize", tiny["qwen2moe"], bad, "Q4_K_M", "--plan", plan))
    assert "another model" in err, err
    mangled = tmp / "mangled.plan"
    lines = plan.read_text().splitlines()
    name, _, shape = lines[1].split()
    mangled.write_text("\n".join([lines[0], f"{name} q9_9 {shape}"] + lines[2:]) + "\n")
    assert "unknown type" in error_of(kiln("quantize", src, bad, "Q4_K_M", "--plan", mangled))
    assert not bad.exists()


def test_target_kld(tmp):
    """--target-kld: the file written is one the search measured at or below the target (checked again by kiln
    perplexity --kl-divergence), no try file is left, and a target the tensors it cannot type miss is an
    error that leaves nothing."""
    import json

    src = write_tiny_model(tmp / "tiny-runnable.gguf", "qwen2", n_layer=4, n_embd=256, n_head=8, n_head_kv=2,
                           n_ff=512, n_vocab=320, tied=False, seed=5, runnable=True)
    text = tmp / "kld-text.txt"
    text.write_text(" ".join(f"word{i % 97} and {i * 7 % 13} more" for i in range(600)))
    base = tmp / "tiny.kld"
    kiln("perplexity", "-m", src, "-f", text, "-c", 128, "--chunks", 4, "-d", "cpu", "-t", 2,
         "--kl-divergence-base", base, check=True)

    def kld_of(model):
        r = kiln("perplexity", "-m", model, "--kl-divergence-base", base, "--kl-divergence", "-d", "cpu", "-t", 2,
                 "-o", "json", check=True)
        return json.loads(r.stdout)["kld"]["value"]

    preset = tmp / "kld-preset.gguf"
    kiln("quantize", src, preset, "Q6_K", "--force", check=True)
    target = kld_of(preset) * 2  # a target some smaller file meets
    out = tmp / "kld-target.gguf"
    before = {p.name for p in tmp.iterdir()}
    r = kiln("quantize", src, out, "Q6_K", "--target-kld", target, "--kld-base", base, "-d", "cpu", "-t", 2,
             check=True)
    assert "try 1:" in r.stderr and f"wrote {out}" in r.stderr, r.stderr
    assert kld_of(out) <= target
    assert out.stat().st_size < preset.stat().st_size, (out.stat().st_size, preset.stat().st_size)
    assert leftovers(tmp, before) == {out.name}
    # Not met: the output head and embedding keep Q2_K's types whatever the budget.
    missed = tmp / "kld-missed.gguf"
    err = error_of(kiln("quantize", src, missed, "Q2_K", "--target-kld", 1e-7, "--kld-base", base, "-d", "cpu",
                        "-t", 2))
    assert "not met" in err and "TYPE with more bits" in err, err
    assert leftovers(tmp, before) == {out.name}
    assert "--kld-base" in error_of(kiln("quantize", src, missed, "Q6_K", "--target-kld", 0.01))
    err = error_of(kiln("quantize", src, missed, "Q6_K", "--target-kld", -1, "--kld-base", base))
    assert "--target-kld -1 is not in" in err, err
