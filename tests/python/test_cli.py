"""The kiln CLI as a user runs it.

- `kiln inspect` on both test models shows what the `gguf` package reads from them: architecture, the
  hyper-parameters, vocabulary size, BOS/EOS tokens, the chat template, and (with --tensors) every tensor's
  type, shape and byte count;
- bad input (a missing file, a truncated file, a file that is not GGUF, an unknown flag) ends in a one-line
  error naming what is wrong and a nonzero exit status, never a crash;
- `kiln tokenize` prints the same ids as the Hugging Face tokenizer built from the same GGUF file;
- `kiln run` streams only the text to stdout and its speeds to stderr, a seed fixes the text, `kiln chat` holds a
  conversation read from stdin, and a missing file, an unknown architecture or a prompt too long for the context
  is a one-line error; `--regex`, `--json-schema` and `--grammar` constrain the output to their language;
- `kiln perplexity` gives the perplexity that llama.cpp's measure gives from llama.cpp's own logits on the same
  file and tokens, and a missing, unreadable or too short text is a one-line error.
"""
import os
import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import gguf

MODELS = Path(os.environ.get("KILN_MODELS_DIR") or Path.home() / ".cache/kiln/models")
SMOL = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA = MODELS / "gemma-3-270m-q4_k_m.gguf"
KILN = Path(os.environ.get("KILN_BUILD_DIR", "build")) / "tools" / "kiln" / "kiln"


def require(path: Path) -> Path:
    if not path.exists():
        pytest.fail(f"missing test model {path} (set KILN_MODELS_DIR)")
    return path


def kiln(*args, input=None) -> subprocess.CompletedProcess:
    assert KILN.exists(), f"build kiln first ({KILN})"
    env = dict(os.environ, KILN_MODELS_DIR=str(MODELS))
    return subprocess.run([str(KILN), *map(str, args)], capture_output=True, text=True, env=env, input=input,
                          timeout=120)


def field(r: gguf.GGUFReader, key: str):
    f = r.fields.get(key)
    return None if f is None else f.contents()


def section(out: str, title: str) -> str:
    """The lines of one section of the inspect output, from its title line to the next blank line."""
    m = re.search(rf"^{re.escape(title)}.*?(?=^\s*$|\Z)", out, re.S | re.M)
    assert m, f"no '{title}' section in:\n{out}"
    return m.group(0)


def display(v) -> str:
    if isinstance(v, float):
        return repr(float(np.float32(v))) if v != int(v) else str(int(v))
    return str(v)


@pytest.mark.parametrize("model", [SMOL, GEMMA], ids=["smollm2", "gemma3"])
def test_inspect_matches_gguf_package(model):
    r = gguf.GGUFReader(require(model))
    res = kiln("inspect", "--tensors", model)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    arch = field(r, "general.architecture")
    assert re.search(rf"^architecture:\s+{arch}$", out, re.M)
    assert f"{len(r.tensors)} tensors" in out

    # Every hyper-parameter key of the architecture, with its value.
    hp = section(out, "hyper-parameters:")
    for key, f in r.fields.items():
        if key.startswith(arch + ".") and len(f.types) == 1:
            v = f.contents()
            m = re.search(rf"^\s+{re.escape(key)}\s+(\S+)$", hp, re.M)
            assert m, f"{key} missing from hyper-parameters"
            got = m.group(1)
            if isinstance(v, float):
                assert float(got) == pytest.approx(v, rel=1e-6), key
            else:
                assert got == str(v), key

    tokens = field(r, "tokenizer.ggml.tokens")
    tok = section(out, "tokenizer:")
    assert f"{len(tokens)} tokens" in tok
    bos, eos = field(r, "tokenizer.ggml.bos_token_id"), field(r, "tokenizer.ggml.eos_token_id")
    assert f"bos {bos} '{tokens[bos]}'" in tok and f"eos {eos} '{tokens[eos]}'" in tok

    template = field(r, "tokenizer.chat_template")
    if template is None:
        assert re.search(r"^chat template:\s+none$", out, re.M)
    else:
        assert f"chat template ({len(template.encode())} bytes):\n{template}\n" in out

    rows = {}
    for line in section(out, "tensors (").splitlines()[2:]:
        name, dtype, rest = line.split(None, 2)
        rows[name] = (dtype, rest)
    assert len(rows) == len(r.tensors)
    for t in r.tensors:
        dtype, rest = rows[t.name]
        assert dtype == t.tensor_type.name.lower(), t.name
        shape = "[" + ", ".join(str(int(d)) for d in t.shape) + "]"
        assert rest.startswith(shape), (t.name, rest, shape)


def test_inspect_default_model_and_summary():
    require(SMOL)
    res = kiln("inspect")
    assert res.returncode == 0, res.stderr
    assert str(SMOL) in res.stdout
    summary = section(res.stdout, "tensors (")
    counts = sum(int(m) for m in re.findall(r"^\s+\S+\s+(\d+) tensors", summary, re.M))
    assert counts == len(gguf.GGUFReader(SMOL).tensors)


def one_line_error(res: subprocess.CompletedProcess, *needles: str):
    assert res.returncode not in (0, -6, -11), (res.returncode, res.stderr)  # an error, not a crash
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])


def test_inspect_bad_input(tmp_path):
    one_line_error(kiln("inspect", tmp_path / "nope.gguf"), "not found", "nope.gguf")
    data = require(SMOL).read_bytes()
    trunc = tmp_path / "trunc.gguf"
    trunc.write_bytes(data[:1000])
    one_line_error(kiln("inspect", trunc), "trunc.gguf", "offset")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"PK\x03\x04" + data[4:4096])
    one_line_error(kiln("inspect", junk), "junk.gguf", "magic", "not a GGUF file")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert kiln("inspect", empty).returncode != 0


def test_usage_errors():
    assert kiln().returncode == 2
    assert kiln("inspect", "--bogus").returncode == 2
    assert kiln("frobnicate").returncode == 2
    res = kiln("--help")
    assert res.returncode == 0
    for sub in ("inspect", "tokenize"):
        assert re.search(rf"^\s+{sub}\s", res.stdout, re.M), res.stdout
    assert kiln("--version").stdout.startswith("kiln ")


@pytest.mark.parametrize("model", [SMOL, GEMMA], ids=["smollm2", "gemma3"])
def test_tokenize_matches_hf(model):
    from hf_cache import hf_tokenizer

    tok = hf_tokenizer(require(model))
    text = "<|im_start|>user\nHello, wörld! 你好 😀 1234567<|im_end|>\n"
    expected = tok(text)["input_ids"]
    res = kiln("tokenize", "-m", model, "--ids", text)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[" + ", ".join(map(str, expected)) + "]"
    assert res.stderr.strip() == f"{len(expected)} tokens"
    # Standard input, no BOS, special tokens as text.
    res = kiln("tokenize", "-m", model, "--ids", "--no-bos", "--no-parse-special", "-", input=text)
    plain = tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    assert res.stdout.strip() == "[" + ", ".join(map(str, plain)) + "]"
    # The table view: one "id -> 'piece'" line per token.
    res = kiln("tokenize", "-m", model, "Hello")
    rows = res.stdout.strip().splitlines()
    assert [int(r.split("->")[0]) for r in rows] == tok("Hello")["input_ids"]


def test_tokenize_bad_input(tmp_path):
    one_line_error(kiln("tokenize", "-m", tmp_path / "nope.gguf", "hi"), "nope.gguf")
    assert kiln("tokenize", "-m", require(SMOL), "--ids", "--pieces", "hi").returncode == 2
    assert kiln("tokenize", "-m", SMOL).returncode == 2


# --- kiln run / kiln chat -------------------------------------------------------------------------------------


def test_run_greedy_matches_generate_and_reports_speed():
    require(SMOL)
    res = kiln("run", "-m", SMOL, "-p", "The capital of France is", "-n", "12", "--temp", "0")
    assert res.returncode == 0, res.stderr
    assert "Paris" in res.stdout
    # stderr: counts, prefill and decode speeds, load time.
    assert re.search(r"prompt:\s+\d+ tokens \(0 cached\) in \d+ ms, [\d.]+ tokens/s", res.stderr), res.stderr
    assert re.search(r"decode:\s+12 tokens in \d+ ms, [\d.]+ tokens/s \(finish: length\)", res.stderr), res.stderr
    assert re.search(r"load \d+ ms", res.stderr)
    # Where it ran, and what it holds there.
    assert re.search(r" on (cpu, \d+ threads|cuda:\d+): .*weights [\d.]+ GiB( \([\d.]+ GiB (repacked|on the device)\))?, "
                     r"KV cache [\d.]+ GiB, scratch (?!0\.0 )[\d.]+ MiB", res.stderr), res.stderr
    # Generated text only on stdout.
    assert "tokens/s" not in res.stdout


def test_run_device_errors():
    # A device this build or machine cannot give is a one-line error naming it; -d cpu always runs.
    require(SMOL)
    res = kiln("run", "-m", SMOL, "-d", "tpu", "-p", "Hi", "-n", "1")
    one_line_error(res, "tpu", "cpu")
    res = kiln("run", "-m", SMOL, "-d", "cuda:x", "-p", "Hi", "-n", "1")
    one_line_error(res, "cuda:x")
    res = kiln("run", "-m", SMOL, "-d", "cpu", "--exact", "-p", "Hi", "-n", "1", "--temp", "0")
    assert res.returncode == 0, res.stderr
    res = kiln("run", "-m", SMOL, "--exact", "--quantize-activations", "-p", "Hi")
    assert res.returncode != 0
    # Offloading layers (-ngl, llama.cpp's spelling) asks for a GPU: an error on -d cpu; on a machine without
    # one, the default device runs everything on the CPU and says so.
    res = kiln("run", "-m", SMOL, "-d", "cpu", "-ngl", "3", "-p", "Hi", "-n", "1")
    one_line_error(res, "gpu_layers = 3", "cpu")
    res = kiln("run", "-m", SMOL, "--gpu-layers", "-2", "-p", "Hi", "-n", "1")
    assert res.returncode == 2 and "--gpu-layers" in res.stderr
    if "cuda" not in kiln("run", "-m", SMOL, "-p", "Hi", "-n", "1", "--temp", "0").stderr:
        res = kiln("run", "-m", SMOL, "-ngl", "3", "-p", "Hi", "-n", "1", "--temp", "0")
        assert res.returncode == 0 and "gpu_layers = 3 is ignored" in res.stderr, res.stderr


def test_run_tensor_parallel():
    # -tp N (vLLM's spelling): on the CPU, N ranks of one process; the default model's 9 heads and 3 KV heads
    # split over 3. Counts that do not divide, partial offload and devices that cannot be named are one-line
    # errors naming what is wrong.
    require(SMOL)
    res = kiln("run", "-m", SMOL, "-d", "cpu", "-tp", "3", "-p", "Hi", "-n", "4", "--temp", "0")
    assert res.returncode == 0, res.stderr
    assert "tensor parallel over 3" in res.stderr, res.stderr
    one_line_error(kiln("run", "-m", SMOL, "-d", "cpu", "-tp", "2", "-p", "Hi", "-n", "1"), "2")
    one_line_error(kiln("run", "-m", SMOL, "-d", "cuda:x", "-tp", "2", "-p", "Hi", "-n", "1"), "cuda:x")
    one_line_error(kiln("run", "-m", SMOL, "-tp", "2", "-ngl", "3", "-p", "Hi", "-n", "1"),
                   "tensor_parallel = 2", "gpu_layers = 3")
    res = kiln("run", "-m", SMOL, "-tp", "0", "-p", "Hi", "-n", "1")
    assert res.returncode == 2 and "--tensor-parallel" in res.stderr, res.stderr


def test_run_into_a_pipe_writes_the_text_exactly():
    # Into a pipe (or a file), stdout is the generated text and nothing else: the first 12 greedy tokens are a
    # prefix of the first 24 (a newline added after the text would break that unless the model wrote one).
    require(SMOL)
    args = ("run", "-m", SMOL, "-p", "The capital of France is", "--temp", "0")
    short, long = kiln(*args, "-n", "12"), kiln(*args, "-n", "24")
    assert short.returncode == 0 and long.returncode == 0, short.stderr + long.stderr
    assert long.stdout.startswith(short.stdout), (short.stdout, long.stdout)
    assert len(long.stdout) > len(short.stdout)


def test_run_same_seed_same_text():
    require(SMOL)
    args = ("run", "-m", SMOL, "-p", "Once upon a time", "-n", "24", "--temp", "1.0", "--top-k", "0", "--top-p", "1",
            "--min-p", "0")
    a = kiln(*args, "--seed", "7")
    b = kiln(*args, "--seed", "7")
    c = kiln(*args, "--seed", "8")
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout
    assert a.stdout != c.stdout


def test_run_kv_memory():
    require(SMOL)
    # A size that is not one is a usage error that quotes it.
    for bad in ("12Q", "-1G", "0", "1.G", "G"):
        res = kiln("run", "-m", SMOL, "-p", "hi", "--kv-memory", bad)
        assert res.returncode == 2, (bad, res.stderr)
        assert f'"{bad}" is not a size' in res.stderr, res.stderr
    assert "--kv-memory" in kiln("run", "--help").stdout
    # Too small for one block (16 tokens x 30 layers x K,V x 3 heads x 64 x f32 = 720 KiB).
    one_line_error(kiln("run", "-m", SMOL, "-p", "hi", "--kv-memory", "100K"), "holds no KV block", "737280 bytes")
    # Room for the request: the same greedy text as the default pool.
    args = ("run", "-m", SMOL, "-p", "The capital of France is", "-n", "12", "--temp", "0")
    base, small = kiln(*args), kiln(*args, "--kv-memory", "1.5M")  # 2 blocks: 32 tokens
    assert small.returncode == 0, small.stderr
    assert small.stdout == base.stdout
    # A request that outgrows the whole pool ends with an error naming it.
    res = kiln("run", "-m", SMOL, "-p", "The capital of France is", "-n", "40", "--temp", "0", "--ignore-eos",
               "--kv-memory", "1M")
    assert res.returncode == 1, res.stderr
    assert "the KV cache holds 16 tokens (1 x 16-token blocks)" in res.stderr and "--kv-memory" in res.stderr, res.stderr


def test_chat_holds_three_turns_from_stdin():
    require(SMOL)
    turns = "My name is Alice.\nWhat is 2+2?\nWhat is my name?\n"
    # The exact path: whether this 135M model's greedy answer holds a "4" is a near-tie that the rounding of
    # 8-bit activations (the default, as in llama.cpp) decides either way; the turns and the cache are the point.
    res = kiln("chat", "-m", SMOL, "--temp", "0", "-n", "32", "--exact", input=turns)
    assert res.returncode == 0, res.stderr
    assert "4" in res.stdout
    # One speed summary per turn; each turn's prompt holds the whole conversation so far, and the part already
    # computed in the previous turn comes from the prefix cache.
    prompts = [(int(n), int(c)) for n, c in re.findall(r"prompt:\s+(\d+) tokens \((\d+) cached\)", res.stderr)]
    decoded = [int(n) for n in re.findall(r"decode:\s+(\d+) tokens", res.stderr)]
    assert len(prompts) == 3 and len(decoded) == 3, res.stderr
    assert prompts[0][1] == 0
    for k in (1, 2):
        assert prompts[k][0] > prompts[k - 1][0] + decoded[k - 1] - 2, prompts
        assert prompts[k][1] >= 16, prompts  # at least one whole block reused
    # /reset forgets the conversation: the question is asked with an empty history again.
    res = kiln("chat", "-m", SMOL, "--temp", "0", "-n", "8", input="My name is Alice.\n/reset\nMy name is Alice.\n")
    assert res.returncode == 0, res.stderr
    prompts = [int(n) for n in re.findall(r"prompt:\s+(\d+) tokens", res.stderr)]
    assert len(prompts) == 2 and prompts[0] == prompts[1], res.stderr


def test_run_bad_input(tmp_path):
    one_line_error(kiln("run", "-m", tmp_path / "nope.gguf", "-p", "hi"), "nope.gguf")
    # An architecture kiln does not know: the error lists the supported ones.
    data = bytearray(require(SMOL).read_bytes())
    i = data.find(b"general.architecture")
    assert i > 0
    j = data.find(b"llama", i)
    data[j : j + 5] = b"zzzzz"
    odd = tmp_path / "odd.gguf"
    odd.write_bytes(bytes(data))
    one_line_error(kiln("run", "-m", odd, "-p", "hi"), "zzzzz", "supported: llama")
    # A prompt longer than the context.
    one_line_error(kiln("run", "-m", SMOL, "-c", "16", "-p", "word " * 40), "context is 16")
    # Bad sampling parameters are named.
    one_line_error(kiln("run", "-m", SMOL, "-p", "hi", "--top-p", "1.5"), "top_p")
    assert kiln("run", "-m", SMOL).returncode == 2  # -p is required


def test_run_structured_output(tmp_path):
    require(SMOL)
    help_text = kiln("run", "--help").stdout
    for flag in ("--json-schema", "--grammar", "--regex"):
        assert flag in help_text
    # --regex: the whole output matches, and ends there (finish stop).
    res = kiln("run", "-m", SMOL, "--chat", "-p", "Give me a product code.", "--temp", "0", "-n", "32",
               "--regex", "[0-9]{3}-[a-z]{2,5}")
    assert res.returncode == 0, res.stderr
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2,5}", res.stdout), repr(res.stdout)
    assert "finish: stop" in res.stderr, res.stderr
    # --json-schema FILE: JSON that the schema accepts, sampled.
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                                                  "age": {"type": "integer", "minimum": 0}},
                                  "required": ["name", "age"], "additionalProperties": False}))
    res = kiln("run", "-m", SMOL, "--chat", "-p", "Describe a person as JSON.", "--temp", "0.8", "-s", "3", "-n",
               "64", "--json-schema", schema)
    assert res.returncode == 0, res.stderr
    person = json.loads(res.stdout)
    assert set(person) == {"name", "age"} and isinstance(person["name"], str) and person["age"] >= 0, person
    # --grammar FILE (GBNF).
    grammar = tmp_path / "yes_no.gbnf"
    grammar.write_text('root ::= "yes" | "no"\n')
    res = kiln("run", "-m", SMOL, "--chat", "-p", "Is the sky blue?", "--temp", "0", "--grammar", grammar)
    assert res.returncode == 0, res.stderr
    assert res.stdout in ("yes", "no"), repr(res.stdout)
    # One constraint at most; a bad one is a one-line error naming it.
    res = kiln("run", "-m", SMOL, "-p", "hi", "--grammar", grammar, "--regex", "a+")
    assert res.returncode == 2 and "excludes" in res.stderr, res.stderr
    one_line_error(kiln("run", "-m", SMOL, "-p", "hi", "--regex", "(ab"), "regex")
    bad = tmp_path / "bad.gbnf"
    bad.write_text("root ::= undefined-rule\n")
    one_line_error(kiln("run", "-m", SMOL, "-p", "hi", "--grammar", bad), "undefined-rule")
    assert kiln("run", "-m", SMOL, "-p", "hi", "--json-schema", tmp_path / "none.json").returncode == 2


# --- kiln perplexity --------------------------------------------------------------------------------------------


def llama_cpp_perplexity(model: Path, tokens: list[int], n_ctx: int, n_chunks: int) -> float:
    """llama-perplexity's measure computed from llama-cpp-python's logits: the text's tokens cut into chunks of
    n_ctx, each starting with BOS when the model adds one, the tokens after position n_ctx / 2 of each scored
    given the chunk before them."""
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(model), n_ctx=n_ctx, n_batch=n_ctx, logits_all=True, n_threads=2,
                          verbose=False)
    adds_bos = len(llm.tokenize(b"", add_bos=True)) > 0
    first, nll = n_ctx // 2, []
    for c in range(n_chunks):
        chunk = tokens[c * n_ctx : (c + 1) * n_ctx]
        if adds_bos:
            chunk[0] = llm.token_bos()
        llm.reset()
        llm.eval(chunk)
        logits = np.array(llm.scores[:n_ctx], dtype=np.float64)
        logits -= logits.max(axis=1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        nll += [-logp[j, chunk[j + 1]] for j in range(first, n_ctx - 1)]
    return float(np.exp(np.mean(nll)))


def test_perplexity_matches_llama_cpp(tmp_path):
    """kiln perplexity against the same measure from llama.cpp's logits, on the same GGUF file and tokens (kiln's,
    which are llama.cpp's own). Both engines round activations to 8 bits on the CPU, so the two agree closely but
    not bit for bit (27.58 and 27.79 here); a slip in what is scored moves it far more (each row scored against its own token: 68,263; the
    chunks' first halves: 31.94)."""
    require(SMOL)
    from parity_text import PARITY_TEXT

    text = tmp_path / "text.txt"
    text.write_text(PARITY_TEXT)
    res = kiln("perplexity", "-m", SMOL, "-f", text, "-c", "128", "--chunks", "4", "-t", "2", "-d", "cpu", "-o",
               "json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    tok = kiln("tokenize", "-m", SMOL, "--ids", "-", input=PARITY_TEXT)
    assert tok.returncode == 0, tok.stderr
    tokens = json.loads(tok.stdout)
    assert out["text_tokens"] == len(tokens)
    assert out["chunks"] == 4 and out["ctx"] == 128 and out["scored_tokens"] == 4 * 63
    assert len(out["chunk_ppl"]) == 4 and out["chunk_ppl"][-1] == out["ppl"]
    ref = llama_cpp_perplexity(SMOL, tokens, 128, 4)
    assert 1 < ref < 100, ref  # real text on a real model
    assert out["ppl"] == pytest.approx(ref, rel=0.02), (out["ppl"], ref)
    assert 0 < out["ppl_error"] < out["ppl"]
    # The exact path measures the same text within the rounding's cost, and the text form prints the running
    # perplexity after each chunk, then the estimate.
    exact = kiln("perplexity", "-m", SMOL, "-f", text, "-c", "128", "--chunks", "2", "-t", "2", "-d", "cpu",
                 "--exact")
    assert exact.returncode == 0, exact.stderr
    m = re.fullmatch(r"\[1\]([\d.]+),\[2\]([\d.]+)\nFinal estimate: PPL = ([\d.]+) \+/- ([\d.]+)\n", exact.stdout)
    assert m, exact.stdout
    assert float(m.group(2)) == float(m.group(3)) == pytest.approx(out["chunk_ppl"][1], rel=0.02)
    assert "2 chunks of 128 tokens" in exact.stderr and "the last 63 of each scored" in exact.stderr


def test_perplexity_bad_input(tmp_path):
    one_line_error(kiln("perplexity", "-m", SMOL, "-f", tmp_path / "nope.txt"), "nope.txt")
    one_line_error(kiln("perplexity", "-m", SMOL, "-f", tmp_path), "not a regular file")
    short = tmp_path / "short.txt"
    short.write_text("A few words.")
    one_line_error(kiln("perplexity", "-m", SMOL, "-f", short, "-c", "64", "-d", "cpu"), "short.txt",
                   "fewer than one chunk of 64")
    assert kiln("perplexity", "-m", SMOL).returncode == 2  # -f is required
    assert kiln("perplexity", "-m", SMOL, "-f", short, "-c", "2").returncode == 2
    assert kiln("perplexity", "-m", SMOL, "-f", short, "-o", "xml").returncode == 2


# --- kiln bench -------------------------------------------------------------------------------------------------


def test_bench_json_rows():
    require(SMOL)
    res = kiln("bench", "-m", SMOL, "-p", "8,16", "-n", "4", "-r", "2", "-t", "1", "--batch", "2", "--pg", "6,3",
               "-d", "cpu", "-o", "json")
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    assert [r["test"] for r in rows] == ["pp8", "pp16", "tg4", "tg4@bs2", "pp6+tg3@bs2"]
    assert (rows[4]["n_prompt"], rows[4]["n_gen"], rows[4]["batch"]) == (6, 3, 2)
    for r in rows:
        assert r["backend"] == "cpu" and r["threads"] == 1 and r["n_params"] > 100e6 and r["size_bytes"] > 0
        assert len(r["samples"]) == 2 and all(v > 0 for v in r["samples"]), r
        assert r["tokens_per_s"] == pytest.approx(sum(r["samples"]) / 2)
    assert rows[3]["batch"] == 2 and rows[0]["n_prompt"] == 8 and rows[2]["n_gen"] == 4
    md = kiln("bench", "-m", SMOL, "-p", "8", "-n", "0", "-r", "1", "-t", "1", "-d", "cpu")
    assert md.returncode == 0, md.stderr
    assert re.search(r"\| cpu \| 1 \| pp8 \| [\d.]+ ± [\d.]+ \|", md.stdout), md.stdout


def test_bench_prompt_file_with_speculation(tmp_path):
    """--prompt-file: the generation test starts from the text (named in the test), and with --spec the rows carry
    the drafts made and kept over the timed repetitions; the markdown table gains their columns."""
    require(SMOL)
    text = tmp_path / "repeat.txt"
    text.write_text("Repeat exactly: one two three four five six seven eight. one two three four five six seven\n")
    res = kiln("bench", "-m", SMOL, "-p", "0", "-n", "24", "-r", "2", "-t", "1", "-d", "cpu", "--prompt-file", text,
               "--spec", "ngram", "--draft-always", "-o", "json")
    assert res.returncode == 0, res.stderr
    [row] = json.loads(res.stdout)
    assert row["test"] == "tg24 after repeat.txt"
    assert row["spec_draft_tokens"] > 0 and 0 <= row["spec_accepted_tokens"] <= row["spec_draft_tokens"], row
    assert 0 < row["spec_drafts"] <= row["spec_draft_tokens"]
    md = kiln("bench", "-m", SMOL, "-p", "0", "-n", "16", "-r", "1", "-t", "1", "-d", "cpu", "--prompt-file", text,
              "--chat", "--draft-model", SMOL, "--draft-p-min", "0", "--draft-always")
    assert md.returncode == 0, md.stderr
    assert "| drafts kept | tokens/verify |" in md.stdout, md.stdout
    assert re.search(r"\| tg16 after repeat.txt \| [\d.]+ ± [\d.]+ \| 100.0% \| [\d.]+ \|", md.stdout), md.stdout


def test_bench_depth():
    """--depth D: the generation test decodes after a D-token prompt (untimed), named "tgN @ dD"; the KV cache
    type applies."""
    require(SMOL)
    res = kiln("bench", "-m", SMOL, "-p", "0", "-n", "4", "-r", "1", "-t", "1", "-d", "cpu", "--depth", "300",
               "--kv-type", "q8_0", "-o", "json")
    assert res.returncode == 0, res.stderr
    [row] = json.loads(res.stdout)
    assert row["test"] == "tg4 @ d300" and row["tokens_per_s"] > 0, row


def test_run_draft_model_errors(tmp_path):
    """A draft model whose vocabulary is not the model's, and --spec draft without one, are refused naming why."""
    require(SMOL)
    require(GEMMA)
    one_line_error(kiln("run", "-m", SMOL, "-p", "hi", "-n", "2", "-d", "cpu", "--draft-model", GEMMA),
                   "draft model", "262144 tokens", "tokenizer")
    one_line_error(kiln("run", "-m", SMOL, "-p", "hi", "-n", "2", "-d", "cpu", "--spec", "draft"),
                   "needs a draft model")


def test_bench_bad_options():
    for args in (["-o", "xml"], ["-r", "0"], ["-p", "-3"], ["--batch", "0"], ["--exact", "--quantize-activations"],
                 ["--pg", "8"], ["--pg", "8,0"], ["--depth", "-1"], ["--depth", "8", "--prompt-file", "README.md"]):
        res = kiln("bench", "-m", SMOL, *args)
        assert res.returncode != 0, args
