"""Tokenizers written as GGUF metadata (write_gguf_tokenizer, via tests/tools/tokenizer_export_driver).

For both test models (SmolLM2: byte-level BPE; Gemma 3: SentencePiece-style BPE), on the corpus of
tokenizer_corpus.py:
- the tokenizer.json that transformers makes from the GGUF, exported to a vocab-only GGUF, gives kiln the
  same ids as the tokenizer.json itself (kiln's from_gguf vs from_hf_json), and so does the GGUF exported
  from the original GGUF file;
- llama.cpp (llama-cpp-python, vocab_only) loads the export of each tokenizer.json and tokenizes every
  string to the ids Hugging Face `tokenizers` gives, and detokenizes them back; for SmolLM2 every token's
  text and attributes equal llama.cpp's reading of the original GGUF;
- padding to the model's embedding rows gives llama.cpp that many tokens and the same ids;
- an embedding smaller than the vocabulary is a clear error.
"""
import ctypes
import json
import subprocess
import unicodedata
from pathlib import Path

import pytest

from test_tokenizer import CORPUS, DRIVER, METASPACE, hf_tokenizer, model_path, run_driver

BUILD = DRIVER.parent
EXPORT = BUILD / "tokenizer_export_driver"
ARCH = {"smollm2": "llama", "gemma3": "gemma3"}


def export(src: Path, out: Path, *extra):
    if not EXPORT.exists():
        pytest.fail(f"missing driver {EXPORT} (build the tokenizer_export_driver target; set KILN_BUILD_DIR)")
    proc = subprocess.run([str(EXPORT), str(src), str(out), *map(str, extra)], capture_output=True, timeout=300)
    lines = [l for l in proc.stdout.decode().split("\n") if l]
    assert lines, f"export driver printed nothing; rc={proc.returncode} stderr={proc.stderr.decode()[:2000]}"
    return json.loads(lines[0])


def requests():
    return [
        {"text": s, "add_special": add, "parse_special": parse}
        for add in (True, False)
        for parse in (True, False)
        for s in CORPUS
    ]


def kiln_ids(args):
    header, results = run_driver(args, requests())
    assert header.get("ok"), header
    return [r["ids"] for r in results]


def first_diffs(a, b, reqs, n=5):
    bad = [f"{q}: {x} vs {y}" for q, x, y in zip(reqs, a, b) if x != y]
    return len(bad), bad[:n]


@pytest.fixture(scope="module", params=sorted(ARCH))
def hf_folder(request, tmp_path_factory):
    """Per model: the tokenizer transformers builds from the GGUF, saved as a folder."""
    name = request.param
    tok = hf_tokenizer(name)
    folder = tmp_path_factory.mktemp(f"hf_{name}")
    tok.save_pretrained(str(folder))
    tok.backend_tokenizer.save(str(folder / "tokenizer.json"))
    return name, folder


def test_tokenizer_json_export_keeps_kiln_ids(hf_folder, tmp_path):
    name, folder = hf_folder
    out = tmp_path / f"{name}.gguf"
    summary = export(folder, out, "--arch", ARCH[name])
    assert summary["ok"], summary
    assert summary["model"] == ("gpt2" if name == "smollm2" else "llama")
    n_bad, examples = first_diffs(kiln_ids(["load", folder]), kiln_ids(["gguf", out]), requests())
    assert n_bad == 0, f"{name}: {n_bad} differ:\n" + "\n".join(examples)


def test_gguf_export_keeps_kiln_ids(tmp_path):
    for name in ARCH:
        out = tmp_path / f"{name}.gguf"
        summary = export(model_path(name), out)
        assert summary["ok"], summary
        assert summary["arch"] == ARCH[name]
        n_bad, examples = first_diffs(kiln_ids(["gguf", model_path(name)]), kiln_ids(["gguf", out]), requests())
        assert n_bad == 0, f"{name}: {n_bad} differ:\n" + "\n".join(examples)


def llama_vocab(path: Path):
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)


def llama_piece(llm, token: int) -> bytes:
    """llama.cpp's text of one token (special tokens rendered), with room for long ones."""
    import llama_cpp

    buf = ctypes.create_string_buffer(4096)
    n = llama_cpp.llama_token_to_piece(llm._model.vocab, token, buf, len(buf), 0, True)
    assert 0 <= n <= len(buf), (token, n)
    return buf.raw[:n]


def llama_attr(llm, token: int) -> int:
    import llama_cpp

    return int(llama_cpp.llama_vocab_get_attr(llm._model.vocab, token))


def has_control_chars(s: str) -> bool:
    """llama.cpp renders the byte-level tokens of C0/C1 control characters as nothing."""
    return any(unicodedata.category(c) == "Cc" and c not in "\t\n\r" for c in s)


def hf_json_tokenizer(folder: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def test_llama_cpp_reads_export_as_hf_tokenizes(hf_folder, tmp_path):
    name, folder = hf_folder
    out = tmp_path / f"{name}.gguf"
    summary = export(folder, out, "--arch", ARCH[name])
    assert summary["ok"], summary
    assert summary["pre"] == ("smollm" if name == "smollm2" else "default")
    llm = llama_vocab(out)
    hf = hf_json_tokenizer(folder)
    assert llm.n_vocab() == hf.get_vocab_size()
    bad = []
    for s in CORPUS:
        expected = hf.encode(s, add_special_tokens=False).ids
        got = llm.tokenize(s.encode(), add_bos=False, special=True)
        if got != expected:
            bad.append(f"{s!r}: hf={expected} llama.cpp={got}")
            continue
        lossy = has_control_chars(s) or (name == "gemma3" and METASPACE in s)  # U+2581 decodes to a space
        if not lossy and (text := b"".join(llama_piece(llm, t) for t in got)) != s.encode():
            bad.append(f"{s!r}: llama.cpp detokenizes to {text!r}")
    # Gemma: the scores follow the merge ranks, so llama.cpp merges as HF does (with the original file's
    # SentencePiece scores it does not on a few strings).
    assert not bad, f"{name}: {len(bad)} of {len(CORPUS)} differ:\n" + "\n".join(bad[:5])
    # Special tokens are control tokens to llama.cpp: without parse_special they stay text.
    special = "<|im_start|>" if name == "smollm2" else "<start_of_turn>"
    sid = hf.token_to_id(special)
    assert llm.tokenize(special.encode(), add_bos=False, special=True) == [sid]
    assert sid not in llm.tokenize(special.encode(), add_bos=False, special=False)
    if name == "smollm2":
        # Every token has the text and attributes (control, normal) llama.cpp gives it in the original GGUF.
        orig = llama_vocab(model_path(name))
        assert orig.n_vocab() == llm.n_vocab()
        diff = [
            i
            for i in range(llm.n_vocab())
            if (llama_piece(llm, i), llama_attr(llm, i)) != (llama_piece(orig, i), llama_attr(orig, i))
        ]
        assert not diff, f"{len(diff)} tokens differ from the original GGUF in llama.cpp, first {diff[:10]}"


def test_padding_reaches_llama_cpp(hf_folder, tmp_path):
    name, folder = hf_folder
    if name != "smollm2":
        pytest.skip("checked on the byte-level model")
    hf = hf_json_tokenizer(folder)
    n = hf.get_vocab_size()
    out = tmp_path / "padded.gguf"
    summary = export(folder, out, "--n-vocab", n + 64)
    assert summary["ok"] and summary["n_tokens"] == n + 64, summary
    llm = llama_vocab(out)
    assert llm.n_vocab() == n + 64
    for s in CORPUS[:300]:
        assert llm.tokenize(s.encode(), add_bos=False, special=True) == hf.encode(s, add_special_tokens=False).ids
    n_bad, examples = first_diffs(kiln_ids(["load", folder]), kiln_ids(["gguf", out]), requests())
    assert n_bad == 0, "\n".join(examples)


def test_embedding_smaller_than_vocabulary_is_an_error(tmp_path):
    path = model_path("smollm2")
    summary = export(path, tmp_path / "small.gguf", "--n-vocab", 1000)
    assert not summary["ok"]
    assert "n_vocab_model = 1000" in summary["error"] and "49152" in summary["error"], summary
    assert not (tmp_path / "small.gguf").exists()
