"""Hostile and careless input to the CLI: nothing is destroyed, nothing hangs, every error names what is wrong.

- `kiln convert` refuses an output that is one of its inputs (the folder's own safetensors file), or that is not a
  regular file (a FIFO, a folder, a symbolic link), before doing any work, and leaves them as they were;
- a file of the model folder that is a link leading out of the folder (chat_template.jinja -> a private file) is
  refused by `convert` and `run`, and nothing of it reaches the output;
- a model path that is a FIFO (a .gguf, or model.safetensors inside a folder) is an error, not a hang;
- the convert summary counts the tensors written when stderr is not a terminal.
Every kiln run here has a 4 GiB address space: an input that a cap misses aborts it.
The model is a tiny random-weight Llama made by transformers (tokenizer: SmolLM2's).
"""
import hashlib
import os
import resource
import shutil
import subprocess
from pathlib import Path

import pytest

import parity_lib as pl

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

KILN = Path(os.environ.get("KILN_BUILD_DIR", "build")) / "tools" / "kiln" / "kiln"


AS_LIMIT = 4 << 30  # every input here must be handled inside a 4 GiB address space (docs/limits.md)


def limit_address_space():
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def kiln(*args, timeout=60) -> subprocess.CompletedProcess:
    assert KILN.exists(), f"build kiln first ({KILN})"
    return subprocess.run([str(KILN), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          preexec_fn=limit_address_space)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def one_line_error(res: subprocess.CompletedProcess, *needles: str):
    assert res.returncode != 0, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.fixture(scope="session")
def folder(tmp_path_factory) -> Path:
    from hf_cache import hf_tokenizer

    torch.manual_seed(0)
    tok = hf_tokenizer(pl.model_file("SmolLM2-135M-Instruct.Q4_1.gguf"))
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=len(tok), max_position_embeddings=256)
    out = tmp_path_factory.mktemp("model") / "tiny"
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


@pytest.fixture
def copy(folder, tmp_path) -> Path:
    dst = tmp_path / "model"
    shutil.copytree(folder, dst)
    return dst


def test_convert_refuses_its_own_input(copy):
    weights = copy / "model.safetensors"
    before = sha(weights)
    res = kiln("convert", copy, weights)
    one_line_error(res, "is the input", "model.safetensors")
    assert sha(weights) == before
    assert not list(copy.glob("*.tmp.*"))


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink"])
def test_convert_refuses_outputs_that_are_not_regular_files(copy, tmp_path, kind):
    out = tmp_path / "out.gguf"
    victim = tmp_path / "victim"
    victim.write_text("precious")
    if kind == "fifo":
        os.mkfifo(out)
    elif kind == "directory":
        out.mkdir()
    else:
        out.symlink_to(victim)
    res = kiln("convert", copy, out)
    one_line_error(res, str(out), {"fifo": "a FIFO", "directory": "a directory", "symlink": "a symbolic link"}[kind])
    assert victim.read_text() == "precious"
    assert not list(tmp_path.glob("out.gguf.tmp.*"))


def test_convert_summary_counts_tensors(copy, tmp_path):
    import gguf

    out = tmp_path / "tiny.gguf"
    res = kiln("convert", copy, out)
    assert res.returncode == 0, res.stderr
    n = len(gguf.GGUFReader(str(out)).tensors)
    assert f", {n} tensors," in res.stderr, res.stderr
    assert not list(tmp_path.glob("tiny.gguf.tmp.*"))


@pytest.mark.parametrize("name", ["chat_template.jinja", "tokenizer.json", "config.json"])
def test_links_out_of_the_folder_are_refused(copy, tmp_path, name):
    secret = tmp_path / "id_rsa"
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n" if name == "chat_template.jinja" else "{}")
    (copy / name).unlink(missing_ok=True)
    (copy / name).symlink_to(secret)
    out = tmp_path / "out.gguf"
    res = kiln("convert", copy, out)
    one_line_error(res, name, "outside the model folder")
    assert not out.exists()
    res = kiln("run", "-m", copy, "-p", "hi", "-n", "1")
    assert res.returncode != 0 and "outside the model folder" in res.stderr, res.stderr


def test_links_inside_the_folder_are_fine(copy, tmp_path):
    (copy / "weights").mkdir()
    (copy / "model.safetensors").rename(copy / "weights" / "w.safetensors")
    (copy / "model.safetensors").symlink_to(Path("weights") / "w.safetensors")
    res = kiln("convert", copy, tmp_path / "out.gguf")
    assert res.returncode == 0, res.stderr


def test_fifo_model_paths_are_errors_not_hangs(copy, tmp_path):
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    res = kiln("run", "-m", fifo, "-p", "hi", "-n", "1", timeout=30)  # a hang fails through the timeout
    one_line_error(res, "model.gguf", "not a regular file")
    (copy / "model.safetensors").unlink()
    os.mkfifo(copy / "model.safetensors")
    res = kiln("run", "-m", copy, "-p", "hi", "-n", "1", timeout=30)
    one_line_error(res, "model.safetensors", "not a regular file")


@pytest.fixture(scope="session")
def tiny_gguf(folder, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    res = kiln("convert", folder, out)
    assert res.returncode == 0, res.stderr
    return out


def test_too_many_threads_is_named(tiny_gguf):
    res = kiln("run", "-m", tiny_gguf, "-p", "hi", "-n", "1", "-t", "40000")
    one_line_error(res, "40000 threads", "cores")


@pytest.mark.parametrize("args,needles", [
    (["-t", "-1"], ["--threads", "-1", "range"]),
    (["-c", "2147483647"], ["--ctx-size", "2147483647", "range"]),
    (["-n", "-5"], ["--n-predict", "-5", "range"]),
])
def test_out_of_range_options_are_usage_errors(tiny_gguf, args, needles):
    res = kiln("run", "-m", tiny_gguf, "-p", "hi", *args)
    assert res.returncode == 2, res.stderr
    first = res.stderr.splitlines()[0]
    assert all(n in first for n in needles), res.stderr
    assert len(res.stderr) < 200, res.stderr  # no 309-digit bound


def test_block_count_beyond_the_tensors_is_refused(tiny_gguf, copy, tmp_path):
    import json

    import gguf

    bad = tmp_path / "bad.gguf"
    shutil.copy(tiny_gguf, bad)
    r = gguf.GGUFReader(str(bad), "r+")
    r.fields["llama.block_count"].parts[-1][0] = 1 << 30
    del r
    res = kiln("run", "-m", bad, "-p", "hi", "-n", "1")
    one_line_error(res, "block_count = 1073741824", "tensors")
    cfg = json.loads((copy / "config.json").read_text())
    cfg["num_hidden_layers"] = 1 << 30
    (copy / "config.json").write_text(json.dumps(cfg))
    res = kiln("run", "-m", copy, "-p", "hi", "-n", "1")
    one_line_error(res, "block_count = 1073741824", "tensors")


def test_architecture_of_the_wrong_type_is_named(tmp_path):
    import struct

    key = b"general.architecture"
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key + struct.pack("<II", 4, 7)
    path = tmp_path / "arch.gguf"
    path.write_bytes(data)
    res = kiln("run", "-m", path, "-p", "hi", "-n", "1")
    one_line_error(res, "general.architecture")
    assert "missing" not in res.stderr, res.stderr
