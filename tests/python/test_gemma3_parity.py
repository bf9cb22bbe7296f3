"""Gemma 3 (Gemma-3-270M Q4_K_M GGUF) on kiln's CPU forward pass; two fresh 544-token windows (1,088 positions), each
past the 512-token sliding window, so the local layers' window is exercised.

The exact path against oracles on identical weights:
1. gemma3_ref (numpy, float64, the `gguf` package's dequantizers), first window: relative L2 error of the logits
   <= 1e-4 at every position, the same argmax everywhere.
2. transformers in f32, the GGUF dequantized by its own loader: relative L2 <= 3e-4 at every one of the 1,088
   positions (transformers' own f32 error reaches 1.3e-4 here); greedy 32-token continuations of 5 prompts
   identical but at an f32 tie (<= 1e-2). transformers and gemma3_ref agree with each other to 3e-4.
Against llama.cpp (llama-cpp-python), run twice on the same weights:
3. on the weights dequantized to f32 (gguf_dequant.py, f32 K/V), where llama.cpp computes in f32 as kiln does:
   top-1 >= 99%, mean KL(llama.cpp || kiln) <= 1e-4 (measured 99.9%, 5e-6);
4. on the Q4_K_M file, where llama.cpp rounds activations to 8 bits (q8_K) in its quantized matmuls: kiln is no
   further from it than llama.cpp's own f32 run is (top-1 at most 1 point lower, mean KL at most 1.2x; measured:
   kiln 94.0% / 8.2e-3, llama.cpp f32 vs Q4_K_M 94.1% / 8.1e-3): the whole gap is llama.cpp's quantized arithmetic.
5. kiln's default CPU path (weights repacked at load, activations rounded to 8 bits in the matmuls) costs no more
   quality against the exact oracle (transformers f32) than llama.cpp's Q4_K_M arithmetic does, over the same
   1,088 positions (top-1 at most 1 point lower, mean KL at most 1.2x).
Run with -s for the figures.
"""
import numpy as np
import pytest

import parity_lib as pl
from gemma3_ref import Model
from gguf_dequant import dequantize_gguf

MODEL_NAME = "gemma-3-270m-q4_k_m.gguf"
WINDOW = 544
N_WINDOWS = 2
REF_REL_L2 = 1e-4
# transformers' f32 forward is itself up to 1.3e-4 from gemma3_ref's f64 logits (kiln's: 1.5e-5), at one position
# of the second window: two f32 computations are compared to within that plus kiln's own error, with room.
HF_REL_L2 = 3e-4
N_GREEDY = 32
N_GREEDY_PROMPTS = 5  # the prompts are short (no window in play): decode coverage, not statistics
MIN_TOP1_F32 = 0.99  # vs llama.cpp in f32 on the same weights
MAX_MEAN_KL_F32 = 1e-4


@pytest.fixture(scope="session")
def path():
    return pl.model_file(MODEL_NAME)


@pytest.fixture(scope="session")
def inputs(path):
    inp = pl.Inputs(path, WINDOW, N_WINDOWS)
    assert inp.add_bos and inp.windows[0][0] == inp.bos
    assert WINDOW > 512  # the sliding window
    return inp


@pytest.fixture(scope="session")
def kiln_windows(path, inputs, tmp_path_factory) -> list[np.ndarray]:
    return pl.kiln_logits(path, inputs.windows, tmp_path_factory.mktemp("kiln") / "windows.f32")


@pytest.fixture(scope="session")
def kiln_windows_qx(path, inputs, tmp_path_factory) -> list[np.ndarray]:
    """The same on the default path: 8-bit activations in the matmuls, as llama.cpp computes them."""
    return pl.kiln_logits(path, inputs.windows, tmp_path_factory.mktemp("kiln") / "windows_qx.f32", quantize_x=True)


@pytest.fixture(scope="session")
def hf(path) -> pl.Transformers:
    return pl.Transformers(path)


@pytest.fixture(scope="session")
def hf_windows(hf, inputs) -> list[np.ndarray]:
    return [hf.logits(w) for w in inputs.windows]


@pytest.fixture(scope="session")
def llama_windows(path, inputs, tmp_path_factory) -> dict[str, np.ndarray]:
    """llama.cpp's logits of the windows on the Q4_K_M file ("q") and on its weights dequantized to f32 ("f32");
    one instance at a time (each holds logits for its whole context)."""
    out = {}
    for kind in ("q", "f32"):
        if kind == "f32":
            file = dequantize_gguf(path, tmp_path_factory.mktemp("f32") / "gemma3-f32.gguf")
            llama = pl.LlamaCpp(file, n_ctx=1024, kv_f32=True)
        else:
            llama = pl.LlamaCpp(path, n_ctx=1024)
        out[kind] = np.concatenate([llama.logits(w) for w in inputs.windows])
        del llama
        if kind == "f32":
            file.unlink()
    return out


def test_gemma3_matches_reference(path, inputs, kiln_windows, hf_windows):
    ref = Model(path).logits(inputs.windows[0])
    s = pl.compare_stats(ref, kiln_windows[0])
    line = pl.report("gemma3 kiln vs gemma3_ref", s)
    assert s["rel"].max() <= REF_REL_L2, line
    assert s["top1"] == 1.0, line
    s = pl.compare_stats(ref, hf_windows[0])
    line = pl.report("gemma3 transformers vs gemma3_ref (the oracles agree)", s)
    assert s["rel"].max() <= HF_REL_L2, line


def test_gemma3_matches_transformers(path, inputs, kiln_windows, hf, hf_windows):
    s = pl.compare_stats(np.concatenate(hf_windows), np.concatenate(kiln_windows))
    line = pl.report("gemma3 kiln vs transformers f32", s)
    assert s["n"] >= 1000
    assert s["rel"].max() <= HF_REL_L2, line
    assert s["gap"].max() <= pl.F32_TIE, line
    prompts = inputs.prompts[:N_GREEDY_PROMPTS]
    kiln = pl.kiln_generate(path, prompts, N_GREEDY)
    want = [hf.greedy(p, N_GREEDY) for p in prompts]
    div = pl.greedy_divergences(hf.logits, prompts, want, kiln)
    print(f"gemma3 kiln vs transformers f32 (greedy {N_GREEDY} tokens): identical on {len(want) - len(div)} of "
          f"{len(want)} prompts; divergences (prompt, token, gap): {div}")
    assert all(g <= pl.F32_TIE for _, _, g in div), div


def test_gemma3_matches_llama_cpp_teacher_forced(kiln_windows, llama_windows):
    kiln = np.concatenate(kiln_windows)
    f32 = pl.compare_stats(llama_windows["f32"], kiln)
    line_f32 = pl.report("gemma3 kiln vs llama.cpp f32, same weights", f32)
    spread = pl.compare_stats(llama_windows["f32"], llama_windows["q"])
    line_self = pl.report("gemma3 llama.cpp f32 vs llama.cpp Q4_K_M (its own spread)", spread)
    q = pl.compare_stats(llama_windows["q"], kiln)
    line_q = pl.report("gemma3 kiln vs llama.cpp Q4_K_M", q)
    lines = "\n".join([line_f32, line_self, line_q])
    assert f32["n"] >= 1000
    assert f32["top1"] >= MIN_TOP1_F32 and f32["kl"].mean() <= MAX_MEAN_KL_F32, lines
    assert pl.within_spread(q, spread), lines


def test_gemma3_fast_path_costs_no_more_than_llama_cpp(kiln_windows_qx, llama_windows, hf_windows):
    """The default path against the exact oracle, beside llama.cpp's quantized arithmetic against the same oracle."""
    exact = np.concatenate(hf_windows)
    ours = pl.compare_stats(exact, np.concatenate(kiln_windows_qx))
    theirs = pl.compare_stats(exact, llama_windows["q"])
    line = (pl.report("gemma3 kiln quantize_x vs transformers f32", ours) + "\n"
            + pl.report("gemma3 llama.cpp Q4_K_M vs transformers f32", theirs))
    assert ours["n"] >= 1000
    assert ours["top1"] >= theirs["top1"] - pl.TOP1_SLACK, line
    assert ours["kl"].mean() <= pl.KL_RATIO * theirs["kl"].mean(), line
