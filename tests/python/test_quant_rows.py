"""kiln's row quantizers (DTypeInfo::quantize_rows) against ggml's own, byte for byte.

Every type below is quantized by tests/tools/dequant_driver (quantize-rows) and by ggml_quantize_chunk from
llama-cpp-python's libggml-base (ggml_peer.py), without importance (llama-quantize without an imatrix) and
with importance vectors (random, and with zeros), on rows drawn from many distributions: the bytes must be
identical. The dequantized result must also be close to the input (in the error the importance weighs).

ggml's bytes are its C code's as x86 compiles it. Where a legacy block's scale d is subnormal, 1 / d overflows
and ggml casts inf to an integer, which C leaves undefined: x86 gives 0, and kiln mirrors x86 (the "tiny"
rows below); ggml built for AArch64, whose conversion saturates, writes other bytes for such blocks.
"""

import json
import subprocess
from pathlib import Path

import ggml_peer
import numpy as np
import pytest
from dequant_driver import driver, quantize_rows, run_driver

TYPES = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs"]
BLOCK_BYTES = {"q4_0": (32, 18), "q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24), "q8_0": (32, 34),
               "q2_k": (256, 84), "q3_k": (256, 110), "q4_k": (256, 144), "q5_k": (256, 176),
               "q6_k": (256, 210), "iq4_nl": (32, 18), "iq4_xs": (256, 136)}
N_PER_ROW = 9 * 256  # nine super-blocks, 72 blocks of 32
# Largest relative RMS error of the round trip on Gaussian rows (typical values are about half of these).
MAX_REL_RMSE = {"q8_0": 0.01, "q6_k": 0.025, "q5_0": 0.06, "q5_1": 0.06, "q5_k": 0.05, "q4_0": 0.12,
                "q4_1": 0.12, "q4_k": 0.1, "iq4_nl": 0.12, "iq4_xs": 0.12, "q3_k": 0.25, "q2_k": 0.45}


def kiln_dequantize(name: str, data: bytes, tmp_path: Path) -> np.ndarray:
    src, dst = tmp_path / f"back.{name}", tmp_path / "back.f32"
    src.write_bytes(data)
    assert run_driver("dequantize", name, src, dst).returncode == 0
    return np.fromfile(dst, dtype=np.float32)


def make_rows(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Named groups of rows of N_PER_ROW values."""
    n = N_PER_ROW

    def normal(rows: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((rows, n)) * scale).astype(np.float32)

    rows = {}
    rows["normal"] = normal(4, 0.02)
    rows["decades"] = (rng.standard_normal((7, n)) * 10.0 ** np.arange(-7, 6, 2)[:, None]).astype(np.float32)
    heavy = rng.standard_t(2, (4, n)).astype(np.float32) * 0.01
    heavy[:, rng.integers(0, n, 40)] *= 200  # outliers
    rows["heavy_tailed"] = heavy
    rows["one_signed"] = np.abs(normal(2))
    rows["one_signed"][1] *= -1
    rows["all_zero"] = np.zeros((1, n), np.float32)
    with_zeros = normal(3)
    with_zeros[0, 32:64] = 0  # a block of 32
    with_zeros[0, 512 + 16:512 + 32] = 0  # a sub-block of 16
    with_zeros[1, 256:512] = 0  # a whole super-block
    with_zeros[2, ::2] = 0  # every other value
    rows["zero_blocks"] = with_zeros
    rows["tiny"] = normal(2, 1e-30)
    # ~1e-38: the legacy types' scale is subnormal and its inverse overflows (ggml's float-to-int casts of
    # inf: see c_float_to_int_x86 in quant_legacy.cpp); partly subnormal values
    rows["tiny"][1, :1024] *= 1e-8
    rows["constant"] = np.stack([np.full(n, 0.75, np.float32), np.full(n, -3.5, np.float32)])
    ties = [rng.integers(-32, 33, n) / 2, rng.integers(-255, 256, n) / 8]  # quant levels and midpoints
    rows["levels_and_ties"] = np.stack(ties).astype(np.float32)
    single = np.zeros((1, n), np.float32)
    single[0, 300] = -1e-3  # one non-zero value
    rows["single_value"] = single
    rows["uniform"] = rng.uniform(-1, 1, (2, n)).astype(np.float32)
    return rows


def importances(rng: np.random.Generator) -> dict[str, np.ndarray | None]:
    n = N_PER_ROW
    act = np.exp(rng.normal(0, 1.5, n)).astype(np.float32)  # like mean squared activations
    with_zeros = act.copy()
    with_zeros[rng.random(n) < 0.2] = 0  # scattered zero columns
    with_zeros[256:512] = 0  # a weightless super-block
    with_zeros[1024 + 32:1024 + 64] = 0  # a weightless block
    return {"none": None, "random": act, "with_zeros": with_zeros}


@pytest.fixture(scope="module")
def cases():
    rng = np.random.default_rng(20240517)
    rows = make_rows(rng)
    names = [name for name, x in rows.items() for _ in range(len(x))]
    return np.concatenate(list(rows.values())), names, importances(rng)


@pytest.mark.parametrize("importance_kind", ["none", "random", "with_zeros"])
@pytest.mark.parametrize("name", TYPES)
def test_quantize_rows_matches_ggml(name, importance_kind, cases, tmp_path):
    x, row_names, imps = cases
    importance = imps[importance_kind]
    ours = quantize_rows(name, x, importance, tmp_path)
    ref = ggml_peer.quantize(name, x, importance)
    assert len(ours) == len(ref)
    if ours != ref:
        a, b = np.frombuffer(ours, np.uint8), np.frombuffer(ref, np.uint8)
        bad = np.flatnonzero(a != b)
        row_bytes = len(ref) // x.shape[0]
        block_size, type_size = BLOCK_BYTES[name]
        row, off = divmod(int(bad[0]), row_bytes)
        blk = off // type_size
        pytest.fail(f"{name}, importance {importance_kind}: {bad.size} bytes differ; first in row {row} "
                    f"({row_names[row]}), block {blk} (byte {off % type_size}): kiln "
                    f"{a[bad[0]]:#04x} vs ggml {b[bad[0]]:#04x}; values "
                    f"{x[row, blk * block_size:(blk + 1) * block_size].tolist()}")
    # sanity: the result dequantizes close to the input, in the error the importance weighs (columns of zero
    # importance may take any level); rows whose scales fit f16 comfortably (f16 scales of 1e-6 are subnormal,
    # of 1e5 infinite: the formats cannot hold them)
    back = kiln_dequantize(name, ours, tmp_path).reshape(x.shape)
    w = np.ones(x.shape[1], np.float32) if importance is None else importance
    for i, kind in enumerate(row_names):
        if kind == "all_zero":
            assert (back[i] == 0).all()
        amax = np.abs(x[i]).max()
        if kind in ("normal", "uniform", "heavy_tailed", "decades") and 1e-3 < amax < 1e4:
            rel = np.sqrt(np.sum(w * (back[i] - x[i]) ** 2) / np.sum(w * x[i] ** 2))
            limit = MAX_REL_RMSE[name] * (3 if kind == "heavy_tailed" else 1)
            assert rel < limit, f"{name}, importance {importance_kind}: row {i} ({kind}) rel. RMSE {rel:.4f}"


@pytest.mark.parametrize("name", TYPES)
def test_quantize_rows_odd_block_count(name, tmp_path):
    """Rows of 13 blocks (the legacy types search 8 blocks side by side: a partial group ends each row)."""
    rng = np.random.default_rng([ord(c) for c in name])
    n = 13 * BLOCK_BYTES[name][0]
    x = (rng.standard_normal((3, n)) * 0.05).astype(np.float32)
    x[1, : n // 2] *= 40
    x[2, -32:] = 0
    importance = np.exp(rng.normal(0, 1, n)).astype(np.float32)
    importance[-48:-16] = 0
    for imp in (None, importance):
        assert quantize_rows(name, x, imp, tmp_path) == ggml_peer.quantize(name, x, imp), name


def test_table_has_row_quantizers():
    r = subprocess.run([str(driver()), "table"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    table = {t["name"]: t for t in json.loads(r.stdout)}
    for name in TYPES:
        assert table[name]["quantize_rows"], name
        assert not table[name]["requires_importance"], name
        assert ggml_peer.requires_importance(name) is False, name
