"""Whole-model parity of kiln's CPU forward pass (llama architecture) on a real GGUF file.

1. kiln vs llama_ref (numpy, float64, same dequantized weights): per-position relative L2 error of the logits
   <= 1e-4 over >= 256 positions of PARITY_TEXT; greedy 16-token continuations of 3 prompts identical.
2. kiln vs llama.cpp (llama-cpp-python, same GGUF): teacher-forced over >= 1,000 positions, top-1 agreement
   >= 95%, mean KL(llama.cpp || kiln) <= 5e-3, and every top-1 disagreement a near tie in llama.cpp's logits;
   greedy 32-token continuations identical on >= 6 of 10 prompts, every divergence at a near tie. Both of kiln's
   matmul modes are held to it: exact f32 activations and 8-bit activations (quantize_x, `kiln run --quantize-activations`).
   llama.cpp rounds activations to 8 bits inside its quantized matmuls (and its K/V to f16), so its logits carry
   noise of ~0.1 (median) to ~0.3 (95th percentile) at the top token; it is compared statistically, not
   elementwise. Measured on SmolLM2 Q4_1: the exact f64 reference gets top-1 96.6%, mean KL 2.6e-3, 6 of 10
   greedy identical; kiln exact the same figures; kiln quantize_x top-1 96.1%, mean KL 3.3e-3, 7 of 10. A bar of
   97% / 8 of 10 is out of reach of an exact implementation on this model.
3. Batch invariance, in both modes: a prompt alone vs inside a batch of 8 sequences of different lengths (greedy
   tokens equal, logits within 1e-4) and fed whole vs 7 tokens per step (logits within 1e-4).
The reference itself is checked against llama.cpp on the same figures (test_reference_matches_llama_cpp; the
full 1,000-position check runs with `python tests/python/test_llama_parity.py`).

kiln side: the logits_driver program (KILN_BUILD_DIR/tests/logits_driver). Models: KILN_MODELS_DIR
(default ~/.cache/kiln/models); model file KILN_PARITY_MODEL (default SmolLM2-135M-Instruct.Q4_1.gguf).
Run with -s to see the measured figures.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama_ref import Model  # noqa: E402
from parity_text import PARITY_TEXT, PROMPTS  # noqa: E402

MODELS = Path(os.environ.get("KILN_MODELS_DIR") or Path.home() / ".cache/kiln/models")
MODEL_NAME = os.environ.get("KILN_PARITY_MODEL", "SmolLM2-135M-Instruct.Q4_1.gguf")
DRIVER = Path(os.environ.get("KILN_BUILD_DIR", "build")) / "tests" / "logits_driver"
THREADS = 2

N_REF_POSITIONS = 256  # teacher-forced positions compared with llama_ref
REF_REL_L2 = 1e-4  # per-position ||kiln - ref|| / ||ref||
N_REF_GREEDY = 16  # generated tokens compared with llama_ref, for the first 3 prompts
WINDOW = 544  # tokens per teacher-forced window; N_WINDOWS * WINDOW >= 1,000 positions
N_WINDOWS = 2
MIN_TOP1 = 0.95  # kiln (8-bit activations) vs llama.cpp: fraction of positions, same argmax
MIN_TOP1_EXACT = 0.95  # exact f32 kiln (and the f64 reference) vs llama.cpp
MAX_MEAN_KL = 5e-3  # vs llama.cpp: mean KL(llama.cpp || kiln), nats
NEAR_TIE = 0.5  # vs llama.cpp: a disagreement is a near tie when llama.cpp prefers its pick by <= this (logits)
N_GREEDY = 32  # vs llama.cpp: generated tokens per prompt
MIN_GREEDY_MATCH = 6  # of len(PROMPTS) prompts whose first N_GREEDY tokens must be identical
BATCH_TOL = 1e-4  # max abs logit difference for batch / chunk invariance


# ----------------------------------------------------------------------------------------------------------------
# Inputs


def model_path() -> Path:
    path = MODELS / MODEL_NAME
    if not path.exists():
        pytest.fail(f"missing test model {path} (set KILN_MODELS_DIR / KILN_PARITY_MODEL)")
    return path


def gguf_add_bos(path: Path) -> tuple[bool, int]:
    """(tokenizer.ggml.add_bos_token, bos id) from the GGUF metadata; llama.cpp's default for BPE models is off."""
    import gguf

    fields = gguf.GGUFReader(str(path)).fields
    add_bos = fields.get("tokenizer.ggml.add_bos_token")
    bos = fields.get("tokenizer.ggml.bos_token_id")
    return (bool(add_bos.contents()) if add_bos else False), (int(bos.contents()) if bos else -1)


class Inputs:
    """Token ids shared by the tests: text windows and prompts, BOS added as llama.cpp adds it for this model."""

    def __init__(self, path: Path):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        self.add_bos, self.bos = gguf_add_bos(path)
        text = self.encode(PARITY_TEXT)
        need = N_WINDOWS * WINDOW
        assert len(text) >= need, f"PARITY_TEXT has {len(text)} tokens, the tests need {need}"
        self.windows = [text[i * WINDOW : (i + 1) * WINDOW] for i in range(N_WINDOWS)]  # fresh sequences
        self.prompts = [self.encode(p) for p in PROMPTS]

    def encode(self, text: str) -> list[int]:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ([self.bos] if self.add_bos else []) + ids


# ----------------------------------------------------------------------------------------------------------------
# kiln driver


def run_driver(args: list, stdin_obj, timeout: int = 600) -> dict:
    if not DRIVER.exists():
        pytest.fail(f"missing driver {DRIVER} (build the logits_driver target; set KILN_BUILD_DIR)")
    proc = subprocess.run(
        [str(DRIVER), *map(str, args)], input=json.dumps(stdin_obj).encode(), capture_output=True, timeout=timeout
    )
    lines = [l for l in proc.stdout.decode().split("\n") if l.strip()]
    assert lines, f"logits_driver printed nothing; rc={proc.returncode} stderr={proc.stderr.decode()[-2000:]}"
    reply = json.loads(lines[-1])
    assert reply.get("ok") and proc.returncode == 0, (
        f"logits_driver {args[0]} failed: rc={proc.returncode} reply={reply} stderr={proc.stderr.decode()[-2000:]}"
    )
    return reply


def kiln_logits(seqs: list[list[int]], out: Path, chunk: int | None = None, quantize_x: bool = False) -> list[np.ndarray]:
    """kiln's logits of every token of every sequence (one batch), as float32 [len(seq), n_vocab] per sequence.
    quantize_x: matmuls on 8-bit activations (as llama.cpp computes); else exact f32."""
    args = ["logits", model_path(), out, "--threads", THREADS] + (["--quantize-x"] if quantize_x else [])
    if chunk is not None:
        args += ["--chunk", chunk]
    reply = run_driver(args, seqs)
    n_rows, n_vocab = int(reply["n_rows"]), int(reply["n_vocab"])
    assert n_rows == sum(map(len, seqs)), f"driver wrote n_rows={n_rows}, expected {sum(map(len, seqs))}"
    data = np.fromfile(out, dtype="<f4")
    assert data.size == n_rows * n_vocab, f"{out}: {data.size} floats, expected {n_rows} x {n_vocab}"
    assert np.isfinite(data).all(), "kiln logits contain inf or NaN"
    rows = data.reshape(n_rows, n_vocab)
    offsets = np.cumsum([0] + [len(s) for s in seqs])
    return [rows[offsets[i] : offsets[i + 1]] for i in range(len(seqs))]


def kiln_generate(prompts: list[list[int]], n: int, quantize_x: bool = False) -> list[list[int]]:
    reply = run_driver(["generate", model_path(), n, "--threads", THREADS] + (["--quantize-x"] if quantize_x else []),
                       prompts)
    tokens = reply["tokens"]
    assert len(tokens) == len(prompts) and all(len(t) == n for t in tokens), f"driver returned {tokens}"
    return tokens


# ----------------------------------------------------------------------------------------------------------------
# llama.cpp


class LlamaCpp:
    """llama-cpp-python on the same GGUF: all-token logits of a fresh sequence, and greedy decoding."""

    def __init__(self, path: Path, n_ctx: int):
        try:
            from llama_cpp import Llama
        except ImportError:
            pytest.fail("llama-cpp-python is not installed (pip install -r scripts/requirements-test.txt)")
        self.llm = Llama(
            model_path=str(path), n_ctx=n_ctx, n_batch=512, logits_all=True, n_threads=THREADS, verbose=False
        )

    def tokenize(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode(), add_bos=True, special=False)  # add_bos: as the vocab asks

    def logits(self, tokens: list[int]) -> np.ndarray:
        self.llm.reset()
        self.llm.eval(tokens)
        return np.array(self.llm.scores[: len(tokens)], dtype=np.float32)  # [n, n_vocab]

    def greedy(self, prompt: list[int], n: int) -> list[int]:
        self.llm.reset()
        self.llm.eval(prompt)
        out = []
        for _ in range(n):
            out.append(int(np.argmax(self.llm.scores[self.llm.n_tokens - 1])))
            if len(out) < n:
                self.llm.eval([out[-1]])
        return out


# ----------------------------------------------------------------------------------------------------------------
# Metrics


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def compare_stats(ref: np.ndarray, test: np.ndarray) -> dict:
    """Top-1 agreement, KL(ref || test) per position (float64), relative L2 per position."""
    assert ref.shape == test.shape, f"shape {test.shape} vs reference {ref.shape}"
    lp, lq = log_softmax(ref), log_softmax(test)
    kl = (np.exp(lp) * (lp - lq)).sum(axis=-1)
    r64, t64 = ref.astype(np.float64), test.astype(np.float64)
    rel = np.linalg.norm(t64 - r64, axis=-1) / np.linalg.norm(r64, axis=-1)
    ref_top, test_top = ref.argmax(-1), test.argmax(-1)
    rows = np.arange(len(ref))
    gap = ref[rows, ref_top].astype(np.float64) - ref[rows, test_top]  # [n] >= 0; 0 where the tops agree
    return {"top1": float((ref_top == test_top).mean()), "kl": kl, "rel": rel, "n": len(ref), "gap": gap}


def report(label: str, s: dict) -> str:
    line = (
        f"{label}: positions={s['n']} top1={s['top1']:.4f} mean_KL={s['kl'].mean():.3e} max_KL={s['kl'].max():.3e} "
        f"rel_L2 max={s['rel'].max():.3e} (position {int(s['rel'].argmax())}) mean={s['rel'].mean():.3e} "
        f"largest_tie_gap={s['gap'].max():.3f}"
    )
    print(line)
    return line


# ----------------------------------------------------------------------------------------------------------------
# Fixtures (module: the models load once)


@pytest.fixture(scope="module")
def inputs() -> Inputs:
    return Inputs(model_path())


@pytest.fixture(scope="module")
def ref() -> Model:
    return Model(model_path())


@pytest.fixture(scope="module")
def ref_logits(ref, inputs) -> np.ndarray:
    return ref.logits(inputs.windows[0][:N_REF_POSITIONS])  # [N_REF_POSITIONS, n_vocab] float64


@pytest.fixture(scope="module")
def llama_cpp(inputs) -> LlamaCpp:
    return LlamaCpp(model_path(), n_ctx=max(2048, WINDOW + 64))


@pytest.fixture(scope="module")
def llama_cpp_windows(llama_cpp, inputs) -> list[np.ndarray]:
    return [llama_cpp.logits(w) for w in inputs.windows]


@pytest.fixture(scope="module")
def kiln_windows(inputs, tmp_path_factory) -> list[np.ndarray]:
    """kiln's logits of all text windows, fed together as one batch."""
    return kiln_logits(inputs.windows, tmp_path_factory.mktemp("kiln") / "windows.f32")


@pytest.fixture(scope="module")
def kiln_windows_qx(inputs, tmp_path_factory) -> list[np.ndarray]:
    """The same with 8-bit activations in the matmuls, as llama.cpp computes them."""
    return kiln_logits(inputs.windows, tmp_path_factory.mktemp("kiln") / "windows_qx.f32", quantize_x=True)


# ----------------------------------------------------------------------------------------------------------------
# Tests


def test_prompt_tokens_match_llama_cpp(inputs, llama_cpp):
    """The prompts' ids (BOS rule included) are llama.cpp's own. (Both sides always get the same ids; on the long
    text llama.cpp's pre-tokenizer splits a blank line before a digit unlike Hugging Face's: no concern here.)"""
    for text, ids in zip(PROMPTS, inputs.prompts):
        assert ids == llama_cpp.tokenize(text), f"prompt {text!r}"


def test_reference_matches_llama_cpp(ref_logits, llama_cpp_windows):
    """The oracle itself: llama_ref agrees with llama.cpp on the figures kiln is held to."""
    s = compare_stats(llama_cpp_windows[0][:N_REF_POSITIONS], ref_logits)
    line = report("llama_ref vs llama.cpp", s)
    assert s["top1"] >= MIN_TOP1_EXACT and s["kl"].mean() <= MAX_MEAN_KL and s["gap"].max() <= NEAR_TIE, line


def test_kiln_matches_reference_logits(kiln_windows, ref_logits):
    s = compare_stats(ref_logits, kiln_windows[0][:N_REF_POSITIONS])
    line = report("kiln vs llama_ref", s)
    worst = int(s["rel"].argmax())
    assert s["rel"].max() <= REF_REL_L2, f"{line}; worst position {worst} exceeds {REF_REL_L2}"


def test_kiln_matches_reference_greedy(ref, inputs):
    prompts = inputs.prompts[:3]
    kiln = kiln_generate(prompts, N_REF_GREEDY)
    for i, p in enumerate(prompts):
        want = ref.greedy(p, N_REF_GREEDY)
        assert kiln[i] == want, (
            f"prompt {PROMPTS[i]!r}: kiln {kiln[i]} ({inputs.tokenizer.decode(kiln[i])!r}) vs "
            f"llama_ref {want} ({inputs.tokenizer.decode(want)!r})"
        )


def test_kiln_exact_vs_llama_cpp_teacher_forced(kiln_windows, llama_cpp_windows):
    """Exact f32 kiln (== the reference) against llama.cpp: held to the reference's own figures."""
    s = compare_stats(np.concatenate(llama_cpp_windows), np.concatenate(kiln_windows))
    line = report("kiln exact vs llama.cpp (teacher-forced)", s)
    assert s["top1"] >= MIN_TOP1_EXACT and s["kl"].mean() <= MAX_MEAN_KL, line
    assert s["gap"].max() <= NEAR_TIE, f"{line}; position {int(s['gap'].argmax())} is no near tie"


def test_kiln_matches_llama_cpp_teacher_forced(kiln_windows_qx, llama_cpp_windows):
    s = compare_stats(np.concatenate(llama_cpp_windows), np.concatenate(kiln_windows_qx))
    line = report("kiln vs llama.cpp (teacher-forced)", s)
    assert s["n"] >= 1000
    assert s["top1"] >= MIN_TOP1, line
    assert s["kl"].mean() <= MAX_MEAN_KL, line
    assert s["gap"].max() <= NEAR_TIE, f"{line}; position {int(s['gap'].argmax())} is no near tie"


def gap_at(llama_cpp: LlamaCpp, prompt: list[int], want: list[int], got: list[int], j: int) -> float:
    """How much llama.cpp prefers its token want[j] over got[j] after prompt + want[:j] (logits)."""
    last = llama_cpp.logits(prompt + want[:j])[-1]
    return float(last[want[j]] - last[got[j]])


@pytest.mark.parametrize("qx", [False, True], ids=["exact", "quantize_x"])
def test_kiln_matches_llama_cpp_greedy(inputs, llama_cpp, qx):
    kiln = kiln_generate(inputs.prompts, N_GREEDY, quantize_x=qx)
    same, lines, worst_gap = 0, [], 0.0
    for i, p in enumerate(inputs.prompts):
        want = llama_cpp.greedy(p, N_GREEDY)
        first_diff = next((j for j in range(N_GREEDY) if kiln[i][j] != want[j]), None)
        same += first_diff is None
        if first_diff is not None:
            # llama.cpp's logits for the shared prefix: kiln's pick must be within NEAR_TIE of llama.cpp's.
            gap = gap_at(llama_cpp, p, want, kiln[i], first_diff)
            worst_gap = max(worst_gap, gap)
            lines.append(
                f"  prompt {i} {PROMPTS[i]!r} differs at token {first_diff} (llama.cpp gap {gap:.3f}): "
                f"kiln {inputs.tokenizer.decode(kiln[i])!r} vs llama.cpp {inputs.tokenizer.decode(want)!r}"
            )
    mode = "quantize_x" if qx else "exact"
    print(f"kiln {mode} vs llama.cpp (greedy {N_GREEDY} tokens): identical on {same} of {len(PROMPTS)} prompts")
    print("\n".join(lines))
    assert same >= MIN_GREEDY_MATCH, "\n".join(lines)
    assert worst_gap <= NEAR_TIE, "a divergence is no near tie:\n" + "\n".join(lines)


def batch_mates(inputs) -> tuple[list[int], list[list[int]]]:
    """P (a prompt) and 7 other sequences of different lengths."""
    p = inputs.prompts[2]
    text = inputs.windows[1]
    others = [inputs.prompts[i] for i in (0, 4, 6)] + [text[:23], text[40:113], text[200:201], text[300:337]]
    assert len({len(o) for o in others} | {len(p)}) == 8, "batch mates should all have different lengths"
    return p, others


@pytest.mark.parametrize("qx", [False, True], ids=["exact", "quantize_x"])
def test_batch_invariance_logits(inputs, tmp_path, qx):
    p, others = batch_mates(inputs)
    alone = kiln_logits([p], tmp_path / "alone.f32", quantize_x=qx)[0]
    batch = others[:3] + [p] + others[3:]
    in_batch = kiln_logits(batch, tmp_path / "batch.f32", quantize_x=qx)[3]
    diff = float(np.abs(alone - in_batch).max())
    print(f"batch invariance: P ({len(p)} tokens) alone vs in a batch of 8: max abs logit diff {diff:.3e}")
    assert diff <= BATCH_TOL

    chunked = kiln_logits([p], tmp_path / "chunked.f32", chunk=7, quantize_x=qx)[0]
    diff = float(np.abs(alone - chunked).max())
    print(f"chunk invariance: P whole vs 7 tokens per step: max abs logit diff {diff:.3e}")
    assert diff <= BATCH_TOL


@pytest.mark.parametrize("qx", [False, True], ids=["exact", "quantize_x"])
def test_batch_invariance_greedy(inputs, qx):
    p, others = batch_mates(inputs)
    alone = kiln_generate([p], N_GREEDY, quantize_x=qx)[0]
    in_batch = kiln_generate(others[:3] + [p] + others[3:], N_GREEDY, quantize_x=qx)[3]
    assert alone == in_batch, f"alone {alone} vs in a batch of 8 {in_batch}"


# ----------------------------------------------------------------------------------------------------------------
# Full check of the reference alone (no kiln): python tests/python/test_llama_parity.py


def main() -> None:
    import time

    path = model_path()
    inp = Inputs(path)
    t0 = time.time()
    lcpp = LlamaCpp(path, n_ctx=max(2048, WINDOW + 64))
    lc = [lcpp.logits(w) for w in inp.windows]
    t1 = time.time()
    model = Model(path)
    t2 = time.time()
    rf = [model.logits(w) for w in inp.windows]
    t3 = time.time()
    print(f"add_bos={inp.add_bos}; llama.cpp load+eval {t1 - t0:.1f}s; ref load {t2 - t1:.1f}s; eval {t3 - t2:.1f}s")
    print("prompt ids equal llama.cpp's:", all(ids == lcpp.tokenize(p) for p, ids in zip(PROMPTS, inp.prompts)))
    report("llama_ref vs llama.cpp (teacher-forced)", compare_stats(np.concatenate(lc), np.concatenate(rf)))
    same = 0
    for i, p in enumerate(inp.prompts):
        a, b = lcpp.greedy(p, N_GREEDY), model.greedy(p, N_GREEDY)
        same += a == b
        j = next((j for j in range(N_GREEDY) if a[j] != b[j]), None)
        where = "same" if j is None else f"differs at {j}, llama.cpp gap {gap_at(lcpp, p, a, b, j):.3f}"
        print(f"prompt {i}: {where}: {inp.tokenizer.decode(b)!r}")
    print(f"llama_ref vs llama.cpp (greedy {N_GREEDY} tokens): identical on {same} of {len(PROMPTS)} prompts")


if __name__ == "__main__":
    main()
