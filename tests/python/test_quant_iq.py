"""kiln's i-quant row quantizers (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) against ggml's own,
byte for byte: tests/tools/dequant_driver quantize-rows vs ggml_quantize_chunk (tests/python/ggml_peer.py), on
rows of several distributions, with and without importance weights.
"""

import json
import subprocess

import ggml_peer
import numpy as np
import pytest
from dequant_driver import driver, quantize_rows

TYPES = ["iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m"]
KINDS = ["normal", "outliers", "skewed", "zero_rows"]
WEIGHTS = ["uniform", "sparse", "none"]
N_PER_ROW = 512  # two super-blocks: importance weights index columns across blocks
N_ROWS = 12


def rows(kind: str, rng: np.random.Generator) -> np.ndarray:
    """N_ROWS x N_PER_ROW f32 rows. Values within a row are distinct (IQ1's search sorts them, and ggml's
    qsort order for equal values is the C library's)."""
    shape = (N_ROWS, N_PER_ROW)
    if kind == "normal":
        x = rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 1, size=(N_ROWS, 1))
    elif kind == "outliers":
        x = rng.standard_t(3, shape) * 0.02
        hit = rng.random(shape) < 0.01
        x[hit] *= 60
    elif kind == "skewed":  # one-signed sub-blocks, uniform magnitudes, a few near-zero sub-blocks
        x = rng.uniform(0.1, 1.0, shape)
        x[:, ::3] *= -1
        x[1::2, 64:96] *= 1e-9  # below the IQ3_XXS / IQ2_S / IQ1_M thresholds, not IQ1_S's
        x[2::3, 128:160] = -np.abs(x[2::3, 128:160])
        x[3::4, 300:316] *= 1e-13  # below IQ1_S's threshold too
    elif kind == "zero_rows":
        x = rng.standard_normal(shape)
        x[::3] = 0.0  # whole rows of zeros
        x[1::3, :256] = 0.0  # a zero super-block next to a normal one
    else:
        raise ValueError(kind)
    return x.astype(np.float32)


def importance_for(kind: str, rng: np.random.Generator) -> np.ndarray:
    if kind == "uniform":
        return rng.uniform(0.05, 3.0, N_PER_ROW).astype(np.float32)
    if kind == "sparse":  # an imatrix of a rarely active layer: many zero columns
        w = rng.exponential(1.0, N_PER_ROW)
        w[rng.random(N_PER_ROW) < 0.3] = 0.0
        return w.astype(np.float32)
    raise ValueError(kind)


def assert_same(name: str, ours: bytes, ref: bytes, x: np.ndarray) -> None:
    a, b = np.frombuffer(ours, dtype=np.uint8), np.frombuffer(ref, dtype=np.uint8)
    assert a.shape == b.shape, f"{name}: {a.size} bytes vs ggml's {b.size}"
    bad = np.flatnonzero(a != b)
    if bad.size:
        row_bytes = a.size // x.shape[0]
        row, off = divmod(int(bad[0]), row_bytes)
        pytest.fail(f"{name}: {bad.size} of {a.size} bytes differ; first in row {row} ({KINDS[row // N_ROWS]} "
                    f"data) at byte {off}")


def test_requires_importance_is_ggmls():
    out = subprocess.run([str(driver()), "table"], capture_output=True, text=True, check=True).stdout
    table = {t["name"]: t for t in json.loads(out)}
    for name in ggml_peer.TYPE_IDS:
        assert table[name]["requires_importance"] == ggml_peer.requires_importance(name), name


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("weights", WEIGHTS)
def test_quantize_rows_match_ggml(name, weights, tmp_path):
    if weights == "none" and ggml_peer.requires_importance(name):
        pytest.skip("ggml requires importance weights for this type")
    rng = np.random.default_rng([TYPES.index(name), WEIGHTS.index(weights)])
    x = np.concatenate([rows(kind, rng) for kind in KINDS])  # N_ROWS rows of each kind, in KINDS order
    importance = None if weights == "none" else importance_for(weights, rng)
    ours = quantize_rows(name, x, importance, tmp_path)
    assert_same(name, ours, ggml_peer.quantize(name, x, importance), x)


@pytest.mark.parametrize("name", [t for t in TYPES if not ggml_peer.requires_importance(t)])
def test_quantize_rows_without_importance_differ_from_with(name, tmp_path):
    """The importance weights reach the search: a strongly non-uniform importance changes the bytes."""
    rng = np.random.default_rng(7)
    x = rows("normal", rng)
    importance = np.where(np.arange(N_PER_ROW) % 2 == 0, 100.0, 0.01).astype(np.float32)
    assert quantize_rows(name, x, importance, tmp_path) != quantize_rows(name, x, None, tmp_path)


def test_driver_refuses_missing_importance(tmp_path):
    x = np.ones((1, 256), dtype=np.float32)
    src = tmp_path / "in.bin"
    src.write_bytes(x.tobytes())
    for name in TYPES:
        r = subprocess.run([str(driver()), "quantize-rows", name, str(src), str(tmp_path / "o.bin"), "256"],
                           capture_output=True, text=True, timeout=60)
        assert (r.returncode != 0) == ggml_peer.requires_importance(name), name
