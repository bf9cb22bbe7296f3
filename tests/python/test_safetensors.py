"""Parity of kiln's safetensors reader and Hugging Face config loader with the Python packages.

Files written by the `safetensors` package (numpy and torch APIs; single files and sharded folders
with an index json, including a sharded checkpoint saved by `transformers`) are read through
tests/tools/safetensors_driver and must give identical names, dtypes, shapes and bytes. A tiny model
folder saved by `transformers` must parse to the values of its config objects; pickled checkpoints
must be refused. The driver binary is $KILN_BUILD_DIR/tests/safetensors_driver.
"""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file as np_save_file
from safetensors.torch import load_file as torch_load_file
from safetensors.torch import save_file as torch_save_file

TORCH_DTYPE_NAMES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}
# safetensors dtype -> kiln DType name (None: recognised, no plain kiln type).
KILN_DTYPES = {"F64": "f64", "F32": "f32", "F16": "f16", "BF16": "bf16", "I64": "i64", "I32": "i32",
               "I16": "i16", "I8": "i8", "U8": None, "BOOL": None, "F8_E4M3": None, "F8_E5M2": None}


def driver() -> Path:
    build = os.environ.get("KILN_BUILD_DIR")
    assert build, "KILN_BUILD_DIR is not set (ctest sets it)"
    path = Path(build) / "tests" / "safetensors_driver"
    assert path.exists(), f"{path} is missing: build the safetensors_driver target"
    return path


def run(mode: str, path: Path) -> dict:
    p = subprocess.run([str(driver()), mode, str(path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, f"safetensors_driver {mode} {path} failed: {p.stderr}"
    return json.loads(p.stdout)


def run_error(mode: str, path: Path) -> str:
    p = subprocess.run([str(driver()), mode, str(path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, f"expected an error from safetensors_driver {mode} {path}, got: {p.stdout[:200]}"
    return p.stderr


def expected_tensors(files: list[Path]) -> dict:
    """name -> (dtype name, shape, bytes), read back by the safetensors package itself."""
    out = {}
    for f in files:
        for name, t in torch_load_file(str(f)).items():
            assert name not in out
            raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
            out[name] = (TORCH_DTYPE_NAMES[t.dtype], list(t.shape), raw)
    return out


def check_same(kiln: dict, expected: dict) -> None:
    got = {t["name"]: t for t in kiln["tensors"]}
    assert sorted(got) == sorted(expected)
    for name, (dtype, shape, raw) in expected.items():
        t = got[name]
        assert t["dtype"] == dtype, name
        assert t["kiln_dtype"] == KILN_DTYPES[dtype], name
        assert t["shape"] == shape, name
        assert bytes.fromhex(t["hex"]) == raw, name


def test_single_file_numpy(tmp_path):
    rng = np.random.default_rng(7)
    arrays = {
        "w.f32": rng.standard_normal((3, 5)).astype(np.float32),
        "w.f16": rng.standard_normal(7).astype(np.float16),
        "w.f64": rng.standard_normal((2, 2)).astype(np.float64),
        "ids.i64": rng.integers(-2**62, 2**62, size=(2, 3, 4), dtype=np.int64),
        "ids.i32": rng.integers(-2**31, 2**31, size=(9,), dtype=np.int32),
        "ids.i16": rng.integers(-2**15, 2**15, size=(3,), dtype=np.int16),
        "q.i8": rng.integers(-128, 128, size=(4, 4), dtype=np.int8),
        "q.u8": rng.integers(0, 256, size=(5,), dtype=np.uint8),
        "mask": rng.integers(0, 2, size=(6,)).astype(bool),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }
    path = tmp_path / "model.safetensors"
    np_save_file(arrays, str(path), metadata={"format": "np", "note": "kiln test"})
    kiln = run("file", path)
    check_same(kiln, expected_tensors([path]))
    for name, a in arrays.items():  # and against numpy's own bytes
        t = next(t for t in kiln["tensors"] if t["name"] == name)
        assert bytes.fromhex(t["hex"]) == a.tobytes(), name
    assert kiln["metadata"] == {"format": "np", "note": "kiln test"}
    # The data section is tiled in order: offsets ascending means names in data order.
    assert len(kiln["tensors"]) == len(arrays)


def test_bf16_and_fp8_with_torch(tmp_path):
    g = torch.Generator().manual_seed(3)
    tensors = {
        "a.bf16": torch.randn(4, 6, generator=g).to(torch.bfloat16),
        "b.bf16": torch.randn(33, generator=g).to(torch.bfloat16),
        "c.e4m3": torch.randn(8, 2, generator=g).to(torch.float8_e4m3fn),
        "d.e5m2": torch.randn(5, generator=g).to(torch.float8_e5m2),
        "e.f32": torch.randn(2, 3, 4, generator=g),
        "f.i64": torch.arange(10, dtype=torch.int64),
    }
    path = tmp_path / "bf16.safetensors"
    torch_save_file(tensors, str(path))
    check_same(run("file", path), expected_tensors([path]))


def test_sharded_with_index(tmp_path):
    rng = np.random.default_rng(11)
    shards = {
        "model-00001-of-00002.safetensors": {
            "embed": rng.standard_normal((10, 4)).astype(np.float32),
            "layer.0.w": rng.standard_normal((4, 4)).astype(np.float16),
        },
        "model-00002-of-00002.safetensors": {
            "layer.1.w": rng.standard_normal((4, 4)).astype(np.float16),
            "positions": np.arange(12, dtype=np.int64),
        },
    }
    weight_map = {}
    for shard, arrays in shards.items():
        np_save_file(arrays, str(tmp_path / shard))
        weight_map.update({name: shard for name in arrays})
    total = sum(a.nbytes for arrays in shards.values() for a in arrays.values())
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    kiln = run("dir", tmp_path)
    assert kiln["n_shards"] == 2
    check_same(kiln, expected_tensors([tmp_path / s for s in shards]))

    # The index names a tensor that its shard lacks.
    weight_map["missing.w"] = "model-00002-of-00002.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    err = run_error("dir", tmp_path)
    assert "lacks tensor \"missing.w\"" in err
    # ... or a shard that is not there.
    del weight_map["missing.w"]
    weight_map["layer.1.w"] = "model-00003-of-00003.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert "model-00003-of-00003.safetensors" in run_error("dir", tmp_path)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A tiny random Llama saved by transformers in several shards, with tokenizer and generation config."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = tmp_path_factory.mktemp("tiny_llama")
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=96, max_position_embeddings=128, rms_norm_eps=1e-5,
                         rope_theta=50000.0, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=[2, 3], temperature=0.6, do_sample=True)
    model.save_pretrained(str(out), max_shard_size="20KB")

    vocab = {f"t{i}": i for i in range(96)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="t1", eos_token="t2", unk_token="t0")
    fast.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    fast.save_pretrained(str(out))
    return out, config


def test_transformers_sharded_checkpoint(hf_folder):
    folder, _ = hf_folder
    shards = sorted(folder.glob("*.safetensors"))
    assert (folder / "model.safetensors.index.json").exists() and len(shards) > 1
    kiln = run("dir", folder)
    assert kiln["n_shards"] == len(shards)
    check_same(kiln, expected_tensors(shards))
    assert {t["dtype"] for t in kiln["tensors"]} == {"BF16"}


def test_transformers_config_folder(hf_folder):
    folder, config = hf_folder
    got = run("config", folder)
    assert got["model_type"] == "llama"
    assert got["architecture"] == "LlamaForCausalLM"
    for key in ["hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "vocab_size", "max_position_embeddings", "head_dim", "tie_word_embeddings"]:
        assert got[key] == getattr(config, key), key
    assert got["rms_norm_eps"] == pytest.approx(config.rms_norm_eps, rel=1e-12)
    raw = json.loads((folder / "config.json").read_text())
    theta = raw.get("rope_theta", raw.get("rope_parameters", {}).get("rope_theta"))
    assert theta == 50000.0 and got["rope_theta"] == theta
    assert "rope_scaling" not in got
    tok = got["tokenizer"]
    assert tok["chat_templates"]["default"].startswith("{% for m in messages %}")
    assert tok["bos_token"] == "t1" and tok["eos_token"] == "t2"
    gen = got["generation"]
    assert gen["eos_token_ids"] == [2, 3] and gen["bos_token_id"] == 1
    assert gen["temperature"] == pytest.approx(0.6) and gen["do_sample"] is True


def test_bad_config_value_named(tmp_path):
    raw = {"model_type": "llama", "hidden_size": "sixty-four", "num_attention_heads": -4}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    got = run("config", tmp_path)
    assert "\"hidden_size\"" in got["hidden_size"]["error"] and "sixty-four" in got["hidden_size"]["error"]
    assert "-4" in got["num_attention_heads"]["error"]
    (tmp_path / "config.json").write_text('{"model_type": "llama",\n "hidden_size": 64,,\n}')
    assert "config.json:2:" in run_error("config", tmp_path)


def test_pickles_refused(tmp_path):
    state = {"w": torch.zeros(3)}
    torch.save(state, str(tmp_path / "pytorch_model.bin"))
    err = run_error("dir", tmp_path)
    assert "pytorch_model.bin" in err and "does not load pickles" in err and "safetensors" in err
    # A torch.save file under a .safetensors name is recognised by its content.
    torch.save(state, str(tmp_path / "renamed.safetensors"))
    assert "does not load pickles" in run_error("file", tmp_path / "renamed.safetensors")


def test_corrupted_package_file_refused(tmp_path):
    path = tmp_path / "x.safetensors"
    np_save_file({"a": np.ones(4, np.float32), "b": np.ones(2, np.float32)}, str(path))
    data = bytearray(path.read_bytes())
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    header["b"]["data_offsets"] = [8, 16]  # overlaps "a" at [0, 16)
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + bytes(data[8 + n:]))
    assert "overlaps" in run_error("file", path)
