"""Shared by the whole-model parity tests: kiln's logits driver, the oracles and the peer, and the statistics.

Oracles that do not move (the exact path is held to these, greedy continuations included):
- llama_ref / gemma3_ref: independent numpy float64 forward passes on the weights the `gguf` package dequantizes;
- Transformers: transformers in f32 on the same GGUF file, dequantized by transformers' own GGUF loader.
The peer, llama.cpp (llama-cpp-python), is built from source for the machine at hand, and its rounding (8-bit
activations in quantized matmuls, SIMD accumulation order) changes with that build. Against it the tests assert
only what holds for any build: agreement on the same weights dequantized to f32, and, on quantized files,
statistics whose margins come from llama.cpp's spread across its own precision modes (f32 vs quantized).

Paths: KILN_BUILD_DIR (the build tree: tests/logits_driver), KILN_MODELS_DIR (default ~/.cache/kiln/models).
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

MODELS = Path(os.environ.get("KILN_MODELS_DIR") or Path.home() / ".cache/kiln/models")
DRIVER = Path(os.environ.get("KILN_BUILD_DIR", "build")) / "tests" / "logits_driver"
THREADS = 2  # kiln, llama.cpp and torch threads (ctest gives each heavy Python test both cores)

# llama.cpp's own spread bounds kiln: kiln's agreement with llama.cpp's quantized run may fall below llama.cpp's
# agreement with itself (its f32 run vs its quantized run) by at most TOP1_SLACK, and its mean KL may exceed
# llama.cpp's own by KL_RATIO. A kiln mode that rounds activations itself carries noise independent of
# llama.cpp's, which adds (KL(a||b) ~ KL(a||exact) + KL(exact||b)): such a mode gets ROUNDED_KL_RATIO.
TOP1_SLACK = 0.01
KL_RATIO = 1.2
ROUNDED_KL_RATIO = 2.0
F32_TIE = 1e-2  # logits: two f32 computations of the same weights may pick different tokens only where this close


def model_file(name: str) -> Path:
    path = MODELS / name
    if not path.exists():
        pytest.fail(f"missing test model {path} (scripts/fetch-models.sh; set KILN_MODELS_DIR)")
    return path


def gguf_add_bos(path: Path) -> tuple[bool, int]:
    """(tokenizer.ggml.add_bos_token, bos id) from the GGUF metadata; llama.cpp's default for BPE models is off."""
    import gguf

    fields = gguf.GGUFReader(str(path)).fields
    add_bos = fields.get("tokenizer.ggml.add_bos_token")
    bos = fields.get("tokenizer.ggml.bos_token_id")
    return (bool(add_bos.contents()) if add_bos else False), (int(bos.contents()) if bos else -1)


class Inputs:
    """Token ids shared by the tests: fresh text windows and prompts, BOS added as llama.cpp adds it."""

    def __init__(self, path: Path, window: int, n_windows: int):
        from hf_cache import hf_tokenizer
        from parity_text import PARITY_TEXT, PROMPTS

        self.tokenizer = hf_tokenizer(path)
        self.add_bos, self.bos = gguf_add_bos(path)
        text = self.encode(PARITY_TEXT)
        assert len(text) >= window * n_windows, f"PARITY_TEXT has {len(text)} tokens, the tests need {window * n_windows}"
        self.windows = [text[i * window : (i + 1) * window] for i in range(n_windows)]
        self.texts = PROMPTS
        self.prompts = [self.encode(p) for p in PROMPTS]

    def encode(self, text: str) -> list[int]:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ([self.bos] if self.add_bos else []) + ids


# ----------------------------------------------------------------------------------------------------------------
# kiln (tests/tools/logits_driver.cpp)


def run_driver(args: list, stdin_obj, timeout: int = 900) -> dict:
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


def kiln_logits(model: Path, seqs: list[list[int]], out: Path, chunk: int | None = None,
                quantize_x: bool = False) -> list[np.ndarray]:
    """kiln's logits of every token of every sequence (all in one batch), float32 [len(seq), n_vocab] each.
    quantize_x: matmuls on 8-bit activations (`kiln run --quantize-activations`); else exact f32."""
    args = ["logits", model, out, "--threads", THREADS] + (["--quantize-x"] if quantize_x else [])
    if chunk is not None:
        args += ["--chunk", chunk]
    reply = run_driver(args, seqs)
    n_rows, n_vocab = int(reply["n_rows"]), int(reply["n_vocab"])
    assert n_rows == sum(map(len, seqs)), f"driver wrote n_rows={n_rows}, expected {sum(map(len, seqs))}"
    data = np.fromfile(out, dtype="<f4")
    out.unlink()
    assert data.size == n_rows * n_vocab, f"{out}: {data.size} floats, expected {n_rows} x {n_vocab}"
    assert np.isfinite(data).all(), "kiln logits contain inf or NaN"
    rows = data.reshape(n_rows, n_vocab)
    offsets = np.cumsum([0] + [len(s) for s in seqs])
    return [rows[offsets[i] : offsets[i + 1]] for i in range(len(seqs))]


def kiln_generate(model: Path, prompts: list[list[int]], n: int, quantize_x: bool = False) -> list[list[int]]:
    """Greedy, exactly n tokens per prompt (EOS ignored), all prompts submitted to one engine at once."""
    reply = run_driver(["generate", model, n, "--threads", THREADS] + (["--quantize-x"] if quantize_x else []),
                       prompts)
    tokens = reply["tokens"]
    assert len(tokens) == len(prompts) and all(len(t) == n for t in tokens), f"driver returned {tokens}"
    return tokens


# ----------------------------------------------------------------------------------------------------------------
# The oracle transformers, and the peer llama.cpp


class Transformers:
    """transformers in f32 on a GGUF file that its own GGUF loader dequantizes: logits and greedy decoding."""

    def __init__(self, path: Path):
        import torch

        from hf_cache import hf_model

        torch.set_num_threads(THREADS)
        self.torch = torch
        self.model = hf_model(path)
        self.model.generation_config.eos_token_id = None  # exactly n tokens, as kiln_generate
        self.model.generation_config.pad_token_id = 0

    def logits(self, tokens: list[int]) -> np.ndarray:
        with self.torch.no_grad():
            return self.model(self.torch.tensor([tokens])).logits[0].float().numpy()  # [n, n_vocab]

    def greedy(self, prompt: list[int], n: int) -> list[int]:
        with self.torch.no_grad():
            out = self.model.generate(self.torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n,
                                      do_sample=False)
        return out[0, len(prompt):].tolist()


class LlamaCpp:
    """llama-cpp-python on a GGUF file: all-token logits of a fresh sequence, and greedy decoding.
    kv_f32: f32 K/V instead of llama.cpp's default f16, so that an f32 file is computed in f32 throughout."""

    def __init__(self, path: Path, n_ctx: int, kv_f32: bool = False):
        try:
            from llama_cpp import Llama
        except ImportError:
            pytest.fail("llama-cpp-python is not installed (pip install -r scripts/requirements-test.txt)")
        kv = {"type_k": 0, "type_v": 0} if kv_f32 else {}  # 0: GGML_TYPE_F32
        self.llm = Llama(model_path=str(path), n_ctx=n_ctx, n_batch=512, logits_all=True, n_threads=THREADS,
                         verbose=False, **kv)

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
# Statistics


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def compare_stats(ref: np.ndarray, test: np.ndarray, chunk: int = 64) -> dict:
    """ref vs test logits [n, n_vocab], float64 arithmetic in chunks of rows (vocabularies reach 262,144):
    top1 (fraction of rows with the same argmax), per row: kl = KL(ref || test) in nats, rel = ||test - ref|| /
    ||ref||, gap = how much ref prefers its argmax over test's (logits; 0 where they agree)."""
    assert ref.shape == test.shape, f"shape {test.shape} vs reference {ref.shape}"
    kl, rel, gap, same = [], [], [], 0
    for i in range(0, len(ref), chunk):
        r64, t64 = ref[i : i + chunk].astype(np.float64), test[i : i + chunk].astype(np.float64)
        rows = np.arange(len(r64))
        ref_top, test_top = r64.argmax(-1), t64.argmax(-1)
        diff = t64 - r64
        rel.append(np.sqrt(np.einsum("ij,ij->i", diff, diff) / np.einsum("ij,ij->i", r64, r64)))
        gap.append(r64[rows, ref_top] - r64[rows, test_top])
        same += int((ref_top == test_top).sum())
        # KL(p || q) = sum p (lp - lq); lp - lq = -diff - lse(r) + lse(t), with lse the log-sum-exp of each row.
        r64 -= r64[rows, ref_top][:, None]
        t64 -= t64[rows, test_top][:, None]
        p = np.exp(r64)
        z = p.sum(axis=-1)
        lse_t = np.log(np.exp(t64).sum(axis=-1))
        kl.append(np.einsum("ij,ij->i", p, r64 - t64) / z - np.log(z) + lse_t)
    return {"top1": same / len(ref), "kl": np.concatenate(kl), "rel": np.concatenate(rel), "n": len(ref),
            "gap": np.concatenate(gap)}


def report(label: str, s: dict) -> str:
    line = (
        f"{label}: positions={s['n']} top1={s['top1']:.4f} mean_KL={s['kl'].mean():.3e} max_KL={s['kl'].max():.3e} "
        f"rel_L2 max={s['rel'].max():.3e} (position {int(s['rel'].argmax())}) mean={s['rel'].mean():.3e} "
        f"largest_tie_gap={s['gap'].max():.3f}"
    )
    print(line)
    return line


def within_spread(s: dict, spread: dict, kl_ratio: float = KL_RATIO) -> bool:
    """s (kiln vs llama.cpp's quantized run) is no further from llama.cpp than llama.cpp's f32 run is (spread)."""
    return s["top1"] >= spread["top1"] - TOP1_SLACK and s["kl"].mean() <= kl_ratio * spread["kl"].mean()


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), None)


def greedy_divergences(logits_of, prompts: list[list[int]], want: list[list[int]], got: list[list[int]]):
    """For each prompt whose continuation `got` leaves `want`: (prompt index, token index, gap), gap being how much
    the model that produced `want` (logits_of: tokens -> [n, n_vocab]) prefers its token there over got's."""
    out = []
    for i, (p, w, g) in enumerate(zip(prompts, want, got)):
        j = first_difference(w, g)
        if j is not None:
            last = logits_of(p + w[:j])[-1]
            out.append((i, j, float(last[w[j]] - last[g[j]])))
    return out
