"""GGUF parity with the reference `gguf` Python package.

- kiln's writer output (gguf_driver roundtrip) reads back in gguf.GGUFReader with the same
  metadata values/types and tensor bytes as the original model;
- a file written by gguf.GGUFWriter with every value type (nested arrays included) reads in kiln
  (gguf_driver dump) with the same keys, types and values;
- kiln's dump of the real models agrees with GGUFReader key by key;
- a corrupted file is rejected by the driver with an error naming the file.
"""
import json
import math
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import gguf

MODELS = Path(os.environ.get("KILN_MODELS_DIR") or Path.home() / ".cache/kiln/models")
SMOL = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA = MODELS / "gemma-3-270m-q4_k_m.gguf"
DRIVER = Path(os.environ.get("KILN_BUILD_DIR", "build")) / "tests" / "gguf_driver"

KILN_TYPE = {
    gguf.GGUFValueType.UINT8: "uint8", gguf.GGUFValueType.INT8: "int8",
    gguf.GGUFValueType.UINT16: "uint16", gguf.GGUFValueType.INT16: "int16",
    gguf.GGUFValueType.UINT32: "uint32", gguf.GGUFValueType.INT32: "int32",
    gguf.GGUFValueType.FLOAT32: "float32", gguf.GGUFValueType.BOOL: "bool",
    gguf.GGUFValueType.STRING: "string", gguf.GGUFValueType.ARRAY: "array",
    gguf.GGUFValueType.UINT64: "uint64", gguf.GGUFValueType.INT64: "int64",
    gguf.GGUFValueType.FLOAT64: "float64",
}


def require(path: Path) -> Path:
    if not path.exists():
        pytest.fail(f"missing test model {path} (set KILN_MODELS_DIR)")
    return path


def dump(path: Path) -> dict:
    assert DRIVER.exists(), f"build gguf_driver first ({DRIVER})"
    out = subprocess.run([str(DRIVER), "dump", str(path)], capture_output=True, check=True)
    return json.loads(out.stdout)


def reader_fields(r: gguf.GGUFReader) -> dict:
    return {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}


def field_value(f):
    v = f.contents()
    if isinstance(v, float) and f.types[0] == gguf.GGUFValueType.FLOAT32:
        v = float(np.float32(v))
    return v


def same(a, b) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    return a == b


def test_kiln_writer_output_reads_in_gguf_package(tmp_path):
    src = require(SMOL)
    out = tmp_path / "rt.gguf"
    subprocess.run([str(DRIVER), "roundtrip", str(src), str(out)], check=True)
    a, b = gguf.GGUFReader(src), gguf.GGUFReader(out)
    fa, fb = reader_fields(a), reader_fields(b)
    assert list(fa) == list(fb)
    for key in fa:
        assert fa[key].types == fb[key].types, key
        assert same(field_value(fa[key]), field_value(fb[key])), key
    assert len(a.tensors) == len(b.tensors) > 100
    for ta, tb in zip(a.tensors, b.tensors):
        assert ta.name == tb.name
        assert ta.tensor_type == tb.tensor_type, ta.name
        assert list(ta.shape) == list(tb.shape), ta.name
        assert ta.data.tobytes() == tb.data.tobytes(), ta.name
        assert tb.data_offset % 32 == 0


def test_gguf_package_file_with_every_type_reads_in_kiln(tmp_path):
    T = gguf.GGUFValueType
    path = tmp_path / "all.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    values = {  # key -> (kiln type name, value, elem type or None)
        "t.u8": ("uint8", 250, None), "t.i8": ("int8", -100, None),
        "t.u16": ("uint16", 65000, None), "t.i16": ("int16", -30000, None),
        "t.u32": ("uint32", 4000000000, None), "t.i32": ("int32", -2000000000, None),
        "t.u64": ("uint64", 2**63 + 5, None), "t.i64": ("int64", -(2**62) - 3, None),
        "t.f32": ("float32", float(np.float32(0.1)), None), "t.f64": ("float64", 0.1, None),
        "t.bool": ("bool", True, None), "t.str": ("string", "héllo ✓ 🙂", None),
        "t.arr_u64": ("array", [1, 2**64 - 1], "uint64"),
        "t.arr_f32": ("array", [float(np.float32(x)) for x in (0.5, -1.25, 3e-8)], "float32"),
        "t.arr_bool": ("array", [True, False, True], "bool"),
        "t.arr_str": ("array", ["a", "", "ü"], "string"),
        "t.nested": ("array", [[1, -2], [3], [4, 5, 6]], "array"),
        "t.nested_str": ("array", [["x", "y"], ["z"]], "array"),
    }
    add = {"uint8": w.add_uint8, "int8": w.add_int8, "uint16": w.add_uint16, "int16": w.add_int16,
           "uint32": w.add_uint32, "int32": w.add_int32, "uint64": w.add_uint64, "int64": w.add_int64,
           "float32": w.add_float32, "float64": w.add_float64, "bool": w.add_bool, "string": w.add_string}
    sub = {"uint64": T.UINT64, "float32": T.FLOAT32, "bool": T.BOOL, "string": T.STRING, "array": T.ARRAY}
    for key, (ty, val, elem) in values.items():
        if ty == "array":
            w.add_key_value(key, val, T.ARRAY, sub_type=sub[elem])
        else:
            add[ty](key, val)
    rng = np.random.default_rng(0)
    tensors = {"a": rng.standard_normal((3, 8)).astype(np.float32),
               "b": rng.standard_normal(5).astype(np.float16)}
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    d = dump(path)
    md = {e["key"]: e for e in d["metadata"]}
    assert md["general.architecture"]["value"] == "llama"
    for key, (ty, val, elem) in values.items():
        assert md[key]["type"] == ty, key
        assert same(md[key]["value"], val), (key, md[key]["value"], val)
        if elem is not None:
            assert md[key]["elem_type"] == elem, key
    ts = {t["name"]: t for t in d["tensors"]}
    assert ts["a"]["shape"] == [8, 3] and ts["a"]["type"] == "f32" and ts["a"]["n_bytes"] == 96
    assert ts["b"]["shape"] == [5] and ts["b"]["type"] == "f16" and ts["b"]["n_bytes"] == 10
    raw = path.read_bytes()
    for name, arr in tensors.items():
        start = d["data_offset"] + ts[name]["offset"]
        assert raw[start:start + arr.nbytes] == arr.tobytes(), name


@pytest.mark.parametrize("model", [SMOL, GEMMA], ids=["smollm2", "gemma3"])
def test_kiln_dump_matches_gguf_reader(model):
    d = dump(require(model))
    r = gguf.GGUFReader(model)
    fields = reader_fields(r)
    assert [e["key"] for e in d["metadata"]] == list(fields)
    for e in d["metadata"]:
        f = fields[e["key"]]
        assert e["type"] == KILN_TYPE[f.types[0]], e["key"]
        if e["type"] == "array":
            assert e["elem_type"] == KILN_TYPE[f.types[-1]], e["key"]
        assert same(e["value"], field_value(f)), e["key"]
    assert [t["name"] for t in d["tensors"]] == [t.name for t in r.tensors]
    for t, rt in zip(d["tensors"], r.tensors):
        assert t["shape"] == [int(x) for x in rt.shape], t["name"]
        assert t["type"] == rt.tensor_type.name.lower(), t["name"]
        assert t["n_bytes"] == rt.n_bytes, t["name"]
        assert d["data_offset"] + t["offset"] == rt.data_offset, t["name"]


def test_driver_rejects_corrupt_file(tmp_path):
    bad = tmp_path / "bad.gguf"
    head = bytearray(require(SMOL).read_bytes()[:4096])
    head[4:8] = (7).to_bytes(4, "little")
    bad.write_bytes(bytes(head))
    out = subprocess.run([str(DRIVER), "dump", str(bad)], capture_output=True, text=True)
    assert out.returncode == 1
    assert str(bad) in out.stderr and "version" in out.stderr
