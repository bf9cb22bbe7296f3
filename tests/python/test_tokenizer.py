"""Tokenizer parity with Hugging Face (transformers building the tokenizer from the same GGUF file, with the
vocabulary's own pre-tokenizer: hf_cache.py) and, for the byte-level model, with llama.cpp.

For both test models (SmolLM2: byte-level BPE; Gemma 3: SentencePiece-style BPE), on the deterministic
corpus of tokenizer_corpus.py (over 2,000 strings with Unicode edge cases):
- kiln's ids from the GGUF file equal HF's, with add_special_tokens True and False;
- with parse_special off, special tokens are plain text, as HF's split_special_tokens=True;
- decode(encode(x)) == x (BOS aside), streaming decode equals decode and never splits a character,
  and decode(skip_special) equals HF's decode(skip_special_tokens=True);
- the HF tokenizer saved as tokenizer.json (+ tokenizer_config.json) gives the same ids through kiln's
  tokenizer.json path, and load_tokenizer() of that folder does too;
- bad input (a missing or corrupt file, out-of-range ids in decode) is a clear error.
One driver process per model and mode (tokenize_driver reads JSON lines, writes JSON lines).
"""
import json
import os
import subprocess
from pathlib import Path

import pytest

from tokenizer_corpus import make_corpus

MODELS = Path(os.environ.get("KILN_MODELS_DIR") or Path.home() / ".cache/kiln/models")
MODEL_FILES = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3": "gemma-3-270m-q4_k_m.gguf"}
DRIVER = Path(os.environ.get("KILN_BUILD_DIR", "build")) / "tests" / "tokenize_driver"
METASPACE = "\u2581"

CORPUS = make_corpus()


def model_path(name: str) -> Path:
    path = MODELS / MODEL_FILES[name]
    if not path.exists():
        pytest.fail(f"missing test model {path} (set KILN_MODELS_DIR)")
    return path


def run_driver(args, requests):
    """(header, responses) of one driver run over a list of request dicts."""
    if not DRIVER.exists():
        pytest.fail(f"missing driver {DRIVER} (build the tokenize_driver target; set KILN_BUILD_DIR)")
    stdin = "".join(json.dumps(r) + "\n" for r in requests)
    proc = subprocess.run([str(DRIVER), *map(str, args)], input=stdin.encode(), capture_output=True, timeout=300)
    lines = [l for l in proc.stdout.decode().split("\n") if l]  # not splitlines(): U+2028 is text
    assert lines, f"driver printed nothing; rc={proc.returncode} stderr={proc.stderr.decode()[:2000]}"
    header = json.loads(lines[0])
    return header, [json.loads(line) for line in lines[1:]]


_HF = {}


def hf_tokenizer(name: str):
    """transformers' tokenizer built from the GGUF file (cached for the module)."""
    if name not in _HF:
        from hf_cache import hf_tokenizer as build

        _HF[name] = build(model_path(name))
    return _HF[name]


def encode_requests(add_special: bool, parse_special: bool = True):
    return [{"text": s, "add_special": add_special, "parse_special": parse_special} for s in CORPUS]


def hf_ids(tok, add_special: bool, split_special: bool = False):
    return tok(CORPUS, add_special_tokens=add_special, split_special_tokens=split_special)["input_ids"]


def mismatches(expected, results):
    bad = [(s, e, r.get("ids", r)) for s, e, r in zip(CORPUS, expected, results) if r.get("ids") != e]
    return len(bad), [f"{s!r}: expected={e} kiln={k}" for s, e, k in bad[:5]]


@pytest.fixture(scope="module", params=sorted(MODEL_FILES))
def gguf_run(request):
    """Per model: the HF tokenizer and kiln's results for add_special True/False (GGUF path)."""
    name = request.param
    tok = hf_tokenizer(name)
    reqs = encode_requests(True) + encode_requests(False) + encode_requests(False, parse_special=False)
    header, results = run_driver(["gguf", model_path(name)], reqs)
    assert header.get("ok"), header
    n = len(CORPUS)
    return name, tok, header, results[:n], results[n : 2 * n], results[2 * n :]


def test_corpus_is_large_and_deterministic():
    assert len(CORPUS) >= 2000
    assert CORPUS == make_corpus()
    assert "" in CORPUS and any("\u200d" in s for s in CORPUS) and any("<|im_start|>" in s for s in CORPUS)


def test_gguf_ids_match_hf(gguf_run):
    name, tok, header, with_special, without_special, _ = gguf_run
    assert header["n_vocab"] == len(tok)
    for add_special, results in ((True, with_special), (False, without_special)):
        n_bad, examples = mismatches(hf_ids(tok, add_special), results)
        assert n_bad == 0, f"{name} add_special={add_special}: {n_bad} of {len(CORPUS)} differ:\n" + "\n".join(examples)


def test_gguf_split_special_matches_hf(gguf_run):
    name, tok, _, _, _, unparsed = gguf_run
    n_bad, examples = mismatches(hf_ids(tok, False, split_special=True), unparsed)
    assert n_bad == 0, f"{name} parse_special=false: {n_bad} differ:\n" + "\n".join(examples)


def test_gguf_ids_match_llama_cpp(gguf_run):
    """The byte-level model's ids are llama.cpp's own (the reference for a GGUF vocabulary; SmolLM2's splits every
    digit off first), in the three modes. (Gemma 3's SentencePiece scores make llama.cpp merge differently from
    the trained tokenizer on a few strings: not compared here.)"""
    name, _, _, with_special, without_special, unparsed = gguf_run
    if name != "smollm2":
        pytest.skip("checked on the byte-level model")
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(model_path(name)), vocab_only=True, verbose=False)
    for (add, parse), results in (((True, True), with_special), ((False, True), without_special),
                                  ((False, False), unparsed)):
        expected = [llm.tokenize(s.encode(), add_bos=add, special=parse) for s in CORPUS]
        n_bad, examples = mismatches(expected, results)
        assert n_bad == 0, f"add_special={add} parse_special={parse}: {n_bad} differ:\n" + "\n".join(examples)


def test_special_ids_match_hf(gguf_run):
    name, tok, header, *_ = gguf_run
    assert header["bos"] == tok.bos_token_id
    assert header["eos"] == tok.eos_token_id
    assert tok.eos_token_id in header["eog"]


def test_roundtrip_and_stream(gguf_run):
    name, tok, _, with_special, without_special, _ = gguf_run
    spm = name == "gemma3"
    lossy = 0
    for s, r in zip(CORPUS, without_special):
        if spm and METASPACE in s:
            pass  # SentencePiece cannot tell U+2581 from an escaped space
        elif r["decoded"] != s:
            # Only where the vocabulary cannot spell a character (SmolLM2 has no token for some control
            # bytes) and HF loses it too.
            assert tok.decode(r["ids"]) == r["decoded"] != s, f"{name}: decode(encode({s!r})) = {r['decoded']!r}"
            lossy += 1
        assert r["stream"] == r["decoded"], f"{name}: stream decode of {s!r}"
        assert not r["stream_split_char"], f"{name}: a stream chunk of {s!r} ended inside a character"
    assert lossy < len(CORPUS) // 50
    for s, r in zip(CORPUS, with_special):
        assert r["stream"] == r["decoded"], f"{name}: stream decode of {s!r}"


def test_decode_skip_special_matches_hf(gguf_run):
    name, tok, _, with_special, _, _ = gguf_run
    bad = []
    for s, r in zip(CORPUS, with_special):
        expected = tok.decode(r["ids"], skip_special_tokens=True)
        if r["decoded_skip"] != expected:
            bad.append(f"{s!r}: hf={expected!r} kiln={r['decoded_skip']!r}")
    assert not bad, f"{name}: {len(bad)} decodes differ:\n" + "\n".join(bad[:5])


@pytest.fixture(scope="module", params=sorted(MODEL_FILES))
def hf_folder(request, tmp_path_factory):
    """Per model: the HF tokenizer saved as a folder (tokenizer.json + tokenizer_config.json)."""
    name = request.param
    tok = hf_tokenizer(name)
    folder = tmp_path_factory.mktemp(f"hf_{name}")
    tok.save_pretrained(str(folder))
    tok.backend_tokenizer.save(str(folder / "tokenizer.json"))
    return name, tok, folder


def test_hf_json_ids_match_hf(hf_folder):
    name, tok, folder = hf_folder
    reqs = encode_requests(True) + encode_requests(False)
    for args in (["hf", folder / "tokenizer.json", folder / "tokenizer_config.json"], ["load", folder]):
        header, results = run_driver(args, reqs)
        assert header.get("ok"), header
        n = len(CORPUS)
        for add_special, res in ((True, results[:n]), (False, results[n:])):
            n_bad, examples = mismatches(hf_ids(tok, add_special), res)
            assert n_bad == 0, f"{name} {args[0]} add_special={add_special}: {n_bad} differ:\n" + "\n".join(examples)
        for s, r in zip(CORPUS, results[n:]):
            if not (name == "gemma3" and METASPACE in s):
                # Where the vocabulary cannot spell a character, HF loses it the same way.
                assert r["decoded"] == s or r["decoded"] == tok.decode(r["ids"]), (s, r["decoded"])


def test_decode_rejects_bad_ids():
    header, results = run_driver(
        ["gguf", model_path("smollm2")],
        [{"decode": [1, 49152], "skip_special": False}, {"decode": [-1]}, {"decode": [19556, 905]}],
    )
    assert header["ok"]
    assert not results[0]["ok"] and "49152" in results[0]["error"] and "token 1" in results[0]["error"]
    assert not results[1]["ok"] and "-1" in results[1]["error"]
    assert results[2] == {"ok": True, "text": "Hello world"}


def test_bad_files_are_errors(tmp_path):
    header, _ = run_driver(["load", tmp_path / "missing.gguf"], [])
    assert not header["ok"] and "missing.gguf" in header["error"]
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(model_path("smollm2").read_bytes()[:100000])
    header, _ = run_driver(["gguf", truncated], [])
    assert not header["ok"] and "truncated.gguf" in header["error"]
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}}')
    header, _ = run_driver(["load", tmp_path], [])
    assert not header["ok"] and "merges" in header["error"]
