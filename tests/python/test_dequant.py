"""Parity of kiln's dtype table and reference (de)quantizers with the gguf Python package.

Every dequantizer kiln has is run on random blocks through tests/tools/dequant_driver and compared
bit for bit with gguf.quants.dequantize; every quantizer the gguf package also has is compared
byte for byte with gguf.quants.quantize. The driver binary is $KILN_BUILD_DIR/tests/dequant_driver.
"""

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from dequant_driver import driver, run_driver
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

N_BLOCKS = 4096  # blocks per type and case

# Byte offsets of the f16 scale fields of each block type (these get finite values in the
# "finite" cases so that inf/NaN scales do not hide layout errors).
F16_FIELDS = {
    "q4_0": [0],
    "q4_1": [0, 2],
    "q5_0": [0],
    "q5_1": [0, 2],
    "q8_0": [0],
    "q2_k": [80, 82],
    "q3_k": [108],
    "q4_k": [0, 2],
    "q5_k": [0, 2],
    "q6_k": [208],
    "iq4_nl": [0],
    "iq4_xs": [0],
    "tq1_0": [52],
    "tq2_0": [64],
    "mxfp4": [],  # an E8M0 exponent (byte 0): limited to e <= 252 below
    "iq2_xxs": [0],
    "iq2_xs": [0],
    "iq2_s": [0],
    "iq3_xxs": [0],
    "iq3_s": [0],
    "iq1_s": [0],
    "iq1_m": [],  # an f16 scale in the top nibbles of bytes 49, 51, 53 and 55: made finite below
}
# Types whose dequantizer must exist in kiln (the issue's list) besides the float types.
REQUIRED_DEQUANT = set(F16_FIELDS) | {"f32", "f16", "bf16"}
# Quantizers that kiln and the gguf package both have.
SHARED_QUANT = ["f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0"]


def dequantize(data: np.ndarray, qt: QT) -> np.ndarray:
    with np.errstate(all="ignore"):  # inf/NaN from arbitrary bytes are expected
        return gguf_dequantize(data, qt)


def quantize(data: np.ndarray, qt: QT) -> np.ndarray:
    with np.errstate(all="ignore"):
        return gguf_quantize(data, qt)


@pytest.fixture(scope="module")
def table() -> dict:
    r = run_driver("table")
    assert r.returncode == 0, r.stderr
    return {t["name"]: t for t in json.loads(r.stdout)}


def qtype(name: str) -> QT:
    return QT[name.upper()]


def random_f16_finite(rng: np.random.Generator, n: int) -> np.ndarray:
    """n random f16 bit patterns that are finite (subnormals and both zeros included)."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    inf_nan = (bits & 0x7C00) == 0x7C00
    bits[inf_nan] &= 0xBFFF  # clear the top exponent bit: a finite value of the same sign
    return bits


def random_blocks(name: str, type_size: int, rng: np.random.Generator, finite: bool) -> np.ndarray:
    blocks = rng.integers(0, 256, size=(N_BLOCKS, type_size), dtype=np.uint8)
    if finite:
        for off in F16_FIELDS[name]:
            blocks[:, off : off + 2] = random_f16_finite(rng, N_BLOCKS).view(np.uint8).reshape(N_BLOCKS, 2)
        if name == "mxfp4":
            blocks[:, 0] %= 253  # 2^(e-128) * 12 overflows f32 from e = 253 on
        if name == "iq1_m":
            d = random_f16_finite(rng, N_BLOCKS)
            for k in range(4):  # nibble k of d is the top nibble of the k-th uint16 of the scales (byte 48)
                byte = blocks[:, 49 + 2 * k]
                blocks[:, 49 + 2 * k] = (byte & 0x0F) | (((d >> (4 * k)) & 0x0F) << 4).astype(np.uint8)
    return blocks


def kiln_dequantize(name: str, data: bytes, tmp_path: Path) -> np.ndarray:
    src, dst = tmp_path / f"{name}.in", tmp_path / f"{name}.out"
    src.write_bytes(data)
    r = run_driver("dequantize", name, str(src), str(dst))
    assert r.returncode == 0, r.stderr
    return np.fromfile(dst, dtype=np.float32)


def kiln_quantize(name: str, values: np.ndarray, tmp_path: Path) -> np.ndarray:
    src, dst = tmp_path / f"{name}.qin", tmp_path / f"{name}.qout"
    src.write_bytes(values.astype(np.float32).tobytes())
    r = run_driver("quantize", name, str(src), str(dst))
    assert r.returncode == 0, r.stderr
    return np.fromfile(dst, dtype=np.uint8)


def assert_bits_equal(name: str, ours: np.ndarray, ref: np.ndarray, nan_aware: bool) -> None:
    ours, ref = ours.reshape(-1), ref.reshape(-1).astype(np.float32)
    assert ours.shape == ref.shape, f"{name}: {ours.shape} vs {ref.shape}"
    same = ours.view(np.uint32) == ref.view(np.uint32)
    if nan_aware:
        same |= np.isnan(ours) & np.isnan(ref)
    bad = np.flatnonzero(~same)
    assert bad.size == 0, (
        f"{name}: {bad.size} of {ours.size} elements differ; first at element {bad[0]}: "
        f"kiln {ours[bad[0]]!r} ({ours.view(np.uint32)[bad[0]]:#010x}) vs gguf {ref[bad[0]]!r} "
        f"({ref.view(np.uint32)[bad[0]]:#010x})"
    )


def test_table_matches_ggml_sizes(table):
    for qt, (block_size, type_size) in gguf.GGML_QUANT_SIZES.items():
        name = qt.name.lower()
        if qt in (QT.NVFP4, QT.Q1_0):
            continue  # newer than kiln's DType list (see dtype.h)
        assert name in table, f"{name} (id {int(qt)}) missing from kiln's table"
        t = table[name]
        assert t["id"] == int(qt), name
        assert t["block_size"] == block_size, name
        if qt == QT.Q8_1:
            # ggml's block_q8_1 is {f16 d, f16 s, int8 qs[32]} = 36 bytes (static_assert in
            # ggml-common.h); gguf-py still lists the old f32-scale size 4 + 4 + 32.
            assert type_size == 40 and t["type_size"] == 36
        else:
            assert t["type_size"] == type_size, name
    # kiln's in-memory forms (f8_e4m3, q8_64) have ids no ggml type uses and are not GGUF types.
    assert {n for n, t in table.items() if not t["gguf"]} == {"f8_e4m3", "q8_64"}
    assert len([t for t in table.values() if t["gguf"]]) == len(gguf.GGML_QUANT_SIZES) - 2


def test_required_dequantizers_present(table):
    missing = sorted(n for n in REQUIRED_DEQUANT if not table[n]["dequantize"])
    assert not missing, f"no dequantizer for {missing}"
    missing = sorted(n for n in SHARED_QUANT if not table[n]["quantize"])
    assert not missing, f"no quantizer for {missing}"


@pytest.mark.parametrize("name", sorted(F16_FIELDS))
@pytest.mark.parametrize("finite", [True, False], ids=["finite_scales", "arbitrary_bytes"])
def test_dequantize_block_types(name, finite, table, tmp_path):
    rng = np.random.default_rng([ord(c) for c in name] + [int(finite)])
    blocks = random_blocks(name, table[name]["type_size"], rng, finite)
    ours = kiln_dequantize(name, blocks.tobytes(), tmp_path)
    ref = dequantize(blocks, qtype(name))
    if finite:
        assert np.isfinite(ref).all(), f"{name}: the reference has non-finite values with finite scales"
    # arbitrary bytes: NaN payloads after arithmetic depend on the CPU, so any NaN matches any NaN
    assert_bits_equal(name, ours, ref, nan_aware=not finite)


@pytest.mark.parametrize("name", ["f32", "f16", "bf16"])
def test_dequantize_float_types(name, table, tmp_path):
    rng = np.random.default_rng([ord(c) for c in name])
    n_bytes = N_BLOCKS * 32 * table[name]["type_size"]
    raw = rng.integers(0, 256, size=n_bytes, dtype=np.uint8)
    if name == "f16":
        # every f16 bit pattern once, then random ones
        raw[: 1 << 17] = np.arange(1 << 16, dtype=np.uint16).view(np.uint8)
        ref = raw.view(np.float16).astype(np.float32)
    elif name == "bf16":
        raw[: 1 << 17] = np.arange(1 << 16, dtype=np.uint16).view(np.uint8)
        ref = dequantize(raw, QT.BF16)
    else:
        ref = dequantize(raw, QT.F32)
    ours = kiln_dequantize(name, raw.tobytes(), tmp_path)
    # pure bit manipulation: NaN payloads must survive too
    assert_bits_equal(name, ours, ref, nan_aware=False)


def random_values(rng: np.random.Generator, block_size: int) -> np.ndarray:
    """N_BLOCKS blocks of f32 test data: Gaussian blocks with scales over 12 decades, plus
    blocks that hit the rounding edges (exact quant levels and midpoints between them)."""
    scales = 10.0 ** rng.uniform(-6, 6, size=(N_BLOCKS, 1))
    x = (rng.standard_normal((N_BLOCKS, block_size)) * scales).astype(np.float32)
    # outliers and one-signed blocks
    x[1::7] = np.abs(x[1::7])
    x[2::7] = -np.abs(x[2::7])
    x[3::7, 5] *= 50
    # small integers and half-integers: quant levels and midpoints for several scales
    x[4::7] = (rng.integers(-32, 33, size=x[4::7].shape) / 2).astype(np.float32)
    x[5::7] = (rng.integers(-255, 256, size=x[5::7].shape) / 8).astype(np.float32)
    x[6] = 0.0  # an all-zero block
    x[13] = 3.25  # a constant block
    x[20, :] = 0.0
    x[20, 7] = -1e-3  # one non-zero element
    return x


@pytest.mark.parametrize("name", SHARED_QUANT)
def test_quantize_matches_gguf(name, table, tmp_path):
    rng = np.random.default_rng([ord(c) for c in name] + [7])
    block_size = max(32, table[name]["block_size"])
    x = random_values(rng, block_size)
    ours = kiln_quantize(name, x, tmp_path)
    if name == "f32":
        ref = x.view(np.uint8).reshape(-1)
    elif name == "f16":
        with np.errstate(all="ignore"):
            ref = x.astype(np.float16).view(np.uint8).reshape(-1)
    else:
        ref = quantize(x, qtype(name)).reshape(-1)
    assert ours.shape == ref.shape
    bad = np.flatnonzero(ours != ref)
    if bad.size:
        blk = bad[0] // (ref.size // N_BLOCKS)
        pytest.fail(f"{name}: {bad.size} bytes differ; first in block {blk}: input {x[blk].tolist()}")
    # the round trip through kiln's dequantizer equals gguf's dequantization of the same bytes
    back = kiln_dequantize(name, ours.tobytes(), tmp_path)
    assert_bits_equal(name, back, dequantize(ref.reshape(N_BLOCKS, -1), qtype(name)), nan_aware=False)


def test_f16_bf16_quantize_special_values(tmp_path):
    """f32 -> f16/bf16 on overflow, subnormals, ties and infinities, against numpy / gguf."""
    specials = [0.0, -0.0, np.inf, -np.inf, 65504.0, 65519.99, 65520.0, 1e30, -1e30, 2.0**-24,
                2.0**-25, 2.0**-25 * 1.0000001, 3 * 2.0**-25, 2.0**-14 - 2.0**-25, 1e-45, 1.0 + 2.0**-11,
                1.0 + 3 * 2.0**-11, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 3.4e38]
    x = np.array(specials, dtype=np.float32)
    x = np.concatenate([x, -x])
    ours = kiln_quantize("f16", x, tmp_path)
    with np.errstate(all="ignore"):
        assert (ours == x.astype(np.float16).view(np.uint8)).all()
    ours = kiln_quantize("bf16", x, tmp_path)
    assert (ours == quantize(x.reshape(1, -1), QT.BF16).reshape(-1)).all()


def test_driver_rejects_partial_blocks(tmp_path):
    src = tmp_path / "partial.bin"
    src.write_bytes(bytes(19))  # one Q4_0 block is 18 bytes
    r = run_driver("dequantize", "q4_0", str(src), str(tmp_path / "out.bin"))
    assert r.returncode == 1 and "whole blocks" in r.stderr
    r = run_driver("dequantize", "q9_9", str(src), str(tmp_path / "out.bin"))
    assert r.returncode == 1 and "unknown type" in r.stderr


def test_known_differences_from_gguf_py(tmp_path):
    """The two places where kiln follows ggml's C reference rather than gguf-py, pinned down.

    1. An all-zero block whose first element is -0.0: ggml starts its signed max at +0.0, so
       Q4_0/Q5_0 get d = 0.0 / -8 = -0.0 (and Q4_1 gets m = -0.0 from its min search); gguf-py
       picks the first element (-0.0) and writes +0.0. Both dequantize to zeros.
    2. f32 -> f16 of a signalling NaN: kiln quiets it (sets the top mantissa bit, as x86's F16C
       and ggml on x86 do); numpy keeps it signalling.
    """
    x = np.zeros((1, 32), dtype=np.float32)
    x[0, 0] = -0.0
    for name, off in [("q4_0", 0), ("q5_0", 0), ("q4_1", 2)]:
        ours = kiln_quantize(name, x, tmp_path)
        ref = quantize(x, qtype(name)).reshape(-1)
        assert ours[off : off + 2].view(np.uint16)[0] == 0x8000 and ref[off : off + 2].view(np.uint16)[0] == 0
        rest = np.ones(ours.size, dtype=bool)
        rest[off : off + 2] = False
        assert (ours[rest] == ref[rest]).all(), name
        assert (kiln_dequantize(name, ours.tobytes(), tmp_path) == 0).all()
    snan = np.array([0x7F800001, 0xFFA00000], dtype=np.uint32).view(np.float32)
    ours = kiln_quantize("f16", snan, tmp_path).view(np.uint16)
    assert ours.tolist() == [0x7E00, 0xFF00]
    with np.errstate(all="ignore"):
        assert snan.astype(np.float16).view(np.uint16).tolist() == [0x7C01, 0xFD00]
