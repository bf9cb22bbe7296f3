"""Gemma 3 (Gemma-3-270M Q4_K_M GGUF) on kiln's CPU forward pass.

1. kiln vs gemma3_ref (numpy, float64, the same dequantized weights) over one 544-token window — past the
   512-token sliding window, so the local layers' window is exercised: relative L2 error of the logits <= 1e-4 at
   every position, same argmax everywhere.
2. kiln (on the Q4_K_M file) vs llama.cpp (llama-cpp-python), teacher-forced over 1,088 positions, with llama.cpp
   run twice on the same weights:
   a. on the Q4_K_M file, where llama.cpp rounds activations to 8 bits (q8_K) in its quantized matmuls:
      top-1 >= 92%, mean KL(llama.cpp || kiln) <= 1e-2 (measured 94.0%, 8.2e-3);
   b. on the same weights dequantized to f32 (gguf_dequant.py), where llama.cpp computes in f32 as kiln does:
      top-1 >= 97%, mean KL <= 5e-3 (measured 99.9%, 5.3e-6).
   llama.cpp against itself (a vs b) measures 94.1% and 8.1e-3: the whole gap in (a) is llama.cpp's quantized
   arithmetic, and kiln's agreement in (a) may not fall below llama.cpp's own by more than one point.
Statistics are computed in chunks of positions: the vocabulary has 262,144 entries. Run with -s for the figures.
"""
import os
from pathlib import Path

import numpy as np
import pytest

import test_llama_parity as lp
from gemma3_ref import Model
from gguf_dequant import dequantize_gguf

MODEL = Path(os.environ.get("KILN_MODELS_DIR") or Path.home() / ".cache/kiln/models") / "gemma-3-270m-q4_k_m.gguf"
REF_REL_L2 = 1e-4
MIN_TOP1 = 0.92  # vs llama.cpp's quantized arithmetic
MAX_MEAN_KL = 1e-2
MIN_TOP1_F32 = 0.97  # vs llama.cpp in f32 on the same weights
MAX_MEAN_KL_F32 = 5e-3


def kiln_window_logits(tokens: list[int], out: Path) -> np.ndarray:
    reply = lp.run_driver(["logits", MODEL, out, "--threads", lp.THREADS], [tokens])
    n_vocab = int(reply["n_vocab"])
    data = np.fromfile(out, dtype="<f4").reshape(-1, n_vocab)
    assert data.shape[0] == len(tokens) and np.isfinite(data).all()
    return data


def chunked_stats(ref: np.ndarray, test: np.ndarray, chunk: int = 64) -> dict:
    same, kl, rel = 0, [], []
    for i in range(0, len(ref), chunk):
        s = lp.compare_stats(ref[i : i + chunk], test[i : i + chunk])
        same += round(s["top1"] * s["n"])
        kl.append(s["kl"])
        rel.append(s["rel"])
    return {"top1": same / len(ref), "kl": np.concatenate(kl), "rel": np.concatenate(rel), "n": len(ref)}


@pytest.fixture(scope="module")
def inputs():
    if not MODEL.exists():
        pytest.fail(f"missing test model {MODEL} (scripts/fetch-models.sh)")
    inp = lp.Inputs(MODEL)
    assert inp.add_bos and inp.windows[0][0] == inp.bos
    return inp


def test_gemma3_matches_reference(inputs, tmp_path):
    window = inputs.windows[0]
    assert len(window) > 512
    ref = Model(MODEL).logits(window)
    test = kiln_window_logits(window, tmp_path / "w.f32")
    s = chunked_stats(ref, test)
    line = (f"gemma3 kiln vs gemma3_ref: positions={s['n']} top1={s['top1']:.4f} rel_L2 max={s['rel'].max():.3e} "
            f"(position {int(s['rel'].argmax())}) mean={s['rel'].mean():.3e}")
    print(line)
    assert s["rel"].max() <= REF_REL_L2, line
    assert s["top1"] == 1.0, line


def llama_cpp_logits(path: Path, windows) -> list[np.ndarray]:
    llama = lp.LlamaCpp(path, n_ctx=max(1024, lp.WINDOW + 64))
    out = [llama.logits(w) for w in windows]
    del llama
    return out


def aggregate(refs, tests) -> tuple[int, float, float]:
    stats = [chunked_stats(r, t) for r, t in zip(refs, tests)]
    n = sum(s["n"] for s in stats)
    top1 = sum(s["top1"] * s["n"] for s in stats) / n
    return n, top1, float(np.concatenate([s["kl"] for s in stats]).mean())


def test_gemma3_matches_llama_cpp_teacher_forced(inputs, tmp_path):
    kiln = [kiln_window_logits(w, tmp_path / f"w{i}.f32") for i, w in enumerate(inputs.windows)]
    quantized = llama_cpp_logits(MODEL, inputs.windows)
    f32 = llama_cpp_logits(dequantize_gguf(MODEL, tmp_path / "gemma3-f32.gguf"), inputs.windows)
    n, top1_q, kl_q = aggregate(quantized, kiln)
    _, top1_f, kl_f = aggregate(f32, kiln)
    _, top1_self, kl_self = aggregate(f32, quantized)
    line = (f"gemma3 teacher-forced, {n} positions: kiln vs llama.cpp Q4_K_M top1={top1_q:.4f} mean_KL={kl_q:.3e}; "
            f"kiln vs llama.cpp f32 (same weights) top1={top1_f:.4f} mean_KL={kl_f:.3e}; "
            f"llama.cpp f32 vs llama.cpp Q4_K_M top1={top1_self:.4f} mean_KL={kl_self:.3e}")
    print(line)
    assert n >= 1000
    assert top1_f >= MIN_TOP1_F32 and kl_f <= MAX_MEAN_KL_F32, line
    assert top1_q >= MIN_TOP1 and kl_q <= MAX_MEAN_KL, line
    assert top1_q >= top1_self - 0.01, line
