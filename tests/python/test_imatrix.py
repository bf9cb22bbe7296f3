"""`kiln imatrix` and the importance-matrix files.

- the sums of squares, counts and input ranges (largest |x|) it collects for every projection of SmolLM2 (2 chunks of
  128 tokens of a license text) match an independent computation: the same weights dequantized by the `gguf` package, run through the numpy
  float64 reference (llama_ref) whose tap sees each projection's input; its perplexity matches the reference's too;
- the file has llama.cpp's imatrix GGUF layout (keys, their types, tensor names, order, shapes and types), read with
  the `gguf` package;
- a legacy .dat file, written here from the format, reads back with llama-imatrix's scaling (values and counts
  times the chunk size), and GGUF files combine by adding their sums and counts;
- `--full`'s Gram matrices match the reference's X^T X, and `kiln quantize --method gptq` with them writes the same
  types, which llama.cpp loads, with a lower output error over the calibration inputs than plain rounding's;
- truncated, garbage and inconsistent files are one-line errors naming the file and what is wrong, and leave no
  output behind; the output never replaces an input.
"""
from __future__ import annotations

import os
import struct
import subprocess
from pathlib import Path

import gguf
import numpy as np
import pytest

MODELS = Path(os.environ.get("KILN_MODELS_DIR") or Path.home() / ".cache/kiln/models")
SMOL = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
KILN = Path(os.environ.get("KILN_BUILD_DIR", "build")) / "tools" / "kiln" / "kiln"
TEXT = Path("/usr/share/common-licenses/GPL-3")  # any text of a few thousand tokens
CHUNK, CHUNKS = 128, 2
PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def kiln(*args) -> subprocess.CompletedProcess:
    assert KILN.exists(), f"build kiln first ({KILN})"
    if not SMOL.exists():
        pytest.fail(f"missing test model {SMOL} (set KILN_MODELS_DIR)")
    env = dict(os.environ, KILN_MODELS_DIR=str(MODELS))
    return subprocess.run([str(KILN), *map(str, args)], capture_output=True, text=True, env=env, timeout=300)


def field(r: gguf.GGUFReader, key: str):
    f = r.fields.get(key)
    return None if f is None else f.contents()


def read_imatrix(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{weight: (in_sum2 [n_mat, n_cols], counts [n_mat])} of an imatrix GGUF file."""
    r = gguf.GGUFReader(str(path))
    t = {x.name: x for x in r.tensors}
    out = {}
    for name in t:
        if name.endswith(".in_sum2"):
            w = name[: -len(".in_sum2")]
            s, c = t[name], t[w + ".counts"]
            n_cols = int(s.shape[0])
            out[w] = (np.asarray(s.data, np.float32).reshape(-1, n_cols), np.asarray(c.data, np.float32).reshape(-1))
    return out


@pytest.fixture(scope="module")
def collected(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("imatrix") / "smol.imatrix.gguf"
    r = kiln("imatrix", "-m", SMOL, "-f", TEXT, "-o", out, "-c", CHUNK, "--chunks", CHUNKS, "--exact", "-t", 2)
    assert r.returncode == 0, r.stderr
    return out, r.stdout


@pytest.fixture(scope="module")
def reference() -> tuple[dict[str, np.ndarray], float, dict[str, np.ndarray], dict[str, float]]:
    """Per projection the f64 sums of squares of its input over the chunks, the chunks' perplexity (each
    chunk's second half scored, as llama-imatrix does), per projection its inputs' Gram matrix X^T X and their
    largest magnitude, from the numpy reference on the same tokens."""
    from hf_cache import hf_tokenizer
    from llama_ref import Model

    tokens = hf_tokenizer(SMOL)(TEXT.read_text(), add_special_tokens=False)["input_ids"]  # SmolLM2 adds no BOS
    model = Model(SMOL)
    sums: dict[str, np.ndarray] = {}
    grams: dict[str, np.ndarray] = {}
    amax: dict[str, float] = {}

    def tap(name, x):
        sums[name] = sums.get(name, 0) + (x * x).sum(axis=0)
        grams[name] = grams.get(name, 0) + x.T.astype(np.float64) @ x.astype(np.float64)
        amax[name] = max(amax.get(name, 0.0), float(np.abs(x).max()))

    model.tap = tap
    nll = []
    for c in range(CHUNKS):
        chunk = tokens[c * CHUNK : (c + 1) * CHUNK]
        logits = model.logits(chunk)
        for j in range(CHUNK // 2, CHUNK - 1):
            row = logits[j] - logits[j].max()
            nll.append(np.log(np.exp(row).sum()) - row[chunk[j + 1]])
    return sums, float(np.exp(np.mean(nll))), grams, amax


def test_layout_is_llama_cpp_s(collected):
    path, _ = collected
    r = gguf.GGUFReader(str(path))
    assert field(r, "general.type") == "imatrix"
    assert field(r, "imatrix.datasets") == [str(TEXT)]
    assert field(r, "imatrix.chunk_count") == CHUNKS and field(r, "imatrix.chunk_size") == CHUNK
    for key in ("imatrix.chunk_count", "imatrix.chunk_size"):
        assert r.fields[key].types == [gguf.GGUFValueType.UINT32], key
    assert r.fields["imatrix.datasets"].types == [gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING]
    n_layer = field(gguf.GGUFReader(str(SMOL)), "llama.block_count")
    weights = sorted(f"blk.{l}.{p}.weight" for l in range(n_layer) for p in PROJECTIONS)
    # llama-imatrix's order: by weight name, each weight's sums then its counts (then kiln's ranges, which
    # llama.cpp's reader skips). No output head (tied, and not asked for), no embedding.
    assert [t.name for t in r.tensors] == [f"{w}{s}" for w in weights for s in (".in_sum2", ".counts", ".in_amax")]
    for t in r.tensors:
        assert t.tensor_type == gguf.GGMLQuantizationType.F32, t.name
        if t.name.endswith(".counts"):
            assert list(t.shape) == [1] and float(t.data[0]) == CHUNK * CHUNKS, t.name
        elif t.name.endswith(".in_amax"):
            assert list(t.shape) == [1] and float(t.data[0]) > 0, t.name
        else:
            n_in = 1536 if ".ffn_down." in t.name else 576
            assert list(t.shape) == [n_in], t.name


def test_sums_match_the_reference(collected, reference):
    path, _ = collected
    got = read_imatrix(path)
    want, _, _, _ = reference
    assert set(got) == set(want)
    worst = max(np.linalg.norm(got[w][0][0] - want[w]) / np.linalg.norm(want[w]) for w in want)
    # kiln's exact path in f32 against float64: ~1e-6 (measured: 1e-6 in the worst of the 210 tensors).
    assert worst < 1e-4, worst


def test_ranges_match_the_reference(collected, reference):
    path, _ = collected
    r = gguf.GGUFReader(str(path))
    got = {t.name[: -len(".in_amax")]: float(t.data[0]) for t in r.tensors if t.name.endswith(".in_amax")}
    _, _, _, want = reference
    assert set(got) == set(want)
    worst = max(abs(got[w] - want[w]) / want[w] for w in want)
    assert worst < 1e-4, worst


def test_perplexity_matches_the_reference(collected, reference):
    _, stdout = collected
    _, ppl, _, _ = reference
    assert stdout.startswith("[1]") and "[2]" in stdout, stdout
    final = float(stdout.split("Final estimate: PPL = ")[1].split()[0])
    assert abs(final - ppl) / ppl < 1e-3, (final, ppl)


def test_the_fast_path_collects_the_same(tmp_path, reference):
    out = tmp_path / "fast.gguf"
    r = kiln("imatrix", "-m", SMOL, "-f", TEXT, "-o", out, "-c", CHUNK, "--chunks", CHUNKS, "--no-ppl", "-t", 2)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    got, (want, _, _, _) = read_imatrix(out), reference
    errors = [np.linalg.norm(got[w][0][0] - want[w]) / np.linalg.norm(want[w]) for w in want]
    # Activations rounded to 8 bits in every matmul (measured: 3% in the worst tensor, 0.6% on average).
    assert max(errors) < 0.08 and np.mean(errors) < 0.015, (max(errors), np.mean(errors))


# ---- --full: the Gram matrices GPTQ rounds with ----


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("imatrix-full") / "smol.full.gguf"
    r = kiln("imatrix", "-m", SMOL, "-f", TEXT, "-o", out, "-c", CHUNK, "--chunks", CHUNKS, "--exact", "--full",
             "--no-ppl", "-t", 2)
    assert r.returncode == 0, r.stderr
    return out


def test_full_grams_match_the_reference(full, reference):
    """Each weight's "<weight>.in_gram" f32 [n, n] is X^T X over the same rows as its sums: the reference's
    within f32 summation, its diagonal the sums of squares; llama.cpp's reader (the gguf package here) sees
    the usual sums and counts beside them."""
    want_sums, _, want, _ = reference
    r = gguf.GGUFReader(str(full))
    t = {x.name: x for x in r.tensors}
    sums = read_imatrix(full)
    assert set(sums) == set(want_sums)
    worst = 0.0
    for w, g in want.items():
        got = t[w + ".in_gram"]
        assert got.tensor_type == gguf.GGMLQuantizationType.F32, w
        n = g.shape[0]
        assert list(got.shape) == [n, n], w
        m = np.asarray(got.data, np.float32).reshape(n, n).astype(np.float64)
        worst = max(worst, np.linalg.norm(m - g) / np.linalg.norm(g))
        assert np.allclose(np.diag(m), sums[w][0][0], rtol=1e-4, atol=1e-3), w
        assert np.array_equal(m, m.T), w  # summed in the same order both ways
    assert worst < 1e-4, worst


def test_full_files_combine_only_with_full(full, collected, tmp_path):
    """--in-file with Gram matrices: combined with --full, the Gram matrices come through as they are (the
    collection's are added to them once, at the end); without --full, or a file without them under --full, the
    Gram matrices would cover other tokens than the sums, so each is refused naming why."""
    plain, _ = collected
    out = tmp_path / "out.gguf"
    r = kiln("imatrix", "--in-file", full, "-o", out, "--full")
    assert r.returncode == 0, r.stderr
    got = {x.name: np.asarray(x.data) for x in gguf.GGUFReader(str(out)).tensors}
    want = {x.name: np.asarray(x.data) for x in gguf.GGUFReader(str(full)).tensors}
    assert set(got) == set(want) and all(np.array_equal(got[n], want[n]) for n in want)
    r = kiln("imatrix", "--in-file", full, "-o", tmp_path / "a.gguf")
    assert r.returncode != 0 and "holds Gram matrices" in r.stderr, r.stderr
    r = kiln("imatrix", "--in-file", plain, "-o", tmp_path / "b.gguf", "--full")
    assert r.returncode != 0 and "has no Gram matrix" in r.stderr, r.stderr
    assert not (tmp_path / "a.gguf").exists() and not (tmp_path / "b.gguf").exists()


@pytest.mark.parametrize("ftype", ["Q4_K_M", "IQ4_XS"])  # IQ4_XS: iq4_nl for SmolLM2's 576-wide rows
def test_gptq_rounds_with_the_grams(full, tmp_path, ftype):
    """kiln quantize --method gptq: the same GGUF types, llama.cpp reads the file, and for each weight its
    output error over the calibration inputs, tr((W - Q) H (W - Q)^T), is below plain rounding's with the same
    importance matrix, in most tensors and in total."""
    from gguf.quants import dequantize

    plain, gptq = tmp_path / "plain.gguf", tmp_path / "gptq.gguf"
    for out, extra in ((plain, []), (gptq, ["--method", "gptq"])):
        r = kiln("quantize", "--allow-requantize", "--imatrix", full, *extra, SMOL, out, ftype, "-t", 2)
        assert r.returncode == 0, r.stderr
    assert "rounded by GPTQ" in r.stderr, r.stderr
    src = {x.name: x for x in gguf.GGUFReader(str(SMOL)).tensors}
    pt = {x.name: x for x in gguf.GGUFReader(str(plain)).tensors}
    gt = {x.name: x for x in gguf.GGUFReader(str(gptq)).tensors}
    assert [(n, x.tensor_type) for n, x in pt.items()] == [(n, x.tensor_type) for n, x in gt.items()]
    grams = {x.name[: -len(".in_gram")]: x for x in gguf.GGUFReader(str(full)).tensors
             if x.name.endswith(".in_gram")}

    def weights(t):
        return dequantize(t.data, t.tensor_type).reshape(-1, int(t.shape[0])).astype(np.float64)

    better, total_plain, total_gptq = 0, 0.0, 0.0
    names = sorted(grams)[::7]  # every seventh weight: all projections, most layers
    for name in names:
        n = int(grams[name].shape[0])
        h = np.asarray(grams[name].data, np.float32).reshape(n, n).astype(np.float64)
        w = weights(src[name])
        e_plain = np.einsum("ij,jk,ik->", w - weights(pt[name]), h, w - weights(pt[name]))
        e_gptq = np.einsum("ij,jk,ik->", w - weights(gt[name]), h, w - weights(gt[name]))
        better += e_gptq < e_plain
        total_plain, total_gptq = total_plain + e_plain, total_gptq + e_gptq
    # Measured: 30 of 30 lower, 0.10x in total (256 calibration rows of up to 1536 columns: H has low rank,
    # and GPTQ's error on the rows it was given falls far below rounding's).
    assert better >= 0.9 * len(names), (better, len(names))
    assert total_gptq < 0.9 * total_plain, (total_gptq, total_plain)
    import llama_cpp  # the peer loads and evaluates the file

    llm = llama_cpp.Llama(str(gptq), n_ctx=64, verbose=False)
    out = llm("The capital of France is", max_tokens=4, temperature=0)
    assert out["choices"][0]["text"].strip(), out


def test_gptq_falls_back_on_a_singular_hessian(full, tmp_path):
    """Undampened (--gptq-damp 0), the Gram matrices of 256 calibration tokens are singular (576 and 1536
    columns): every tensor GPTQ would round is rounded as without --method instead, each named in a note, and
    the file is the one --imatrix alone writes, byte for byte."""
    plain, gptq = tmp_path / "plain.gguf", tmp_path / "gptq.gguf"
    r = kiln("quantize", "--allow-requantize", "--imatrix", full, SMOL, plain, "Q4_K_M", "-t", 2)
    assert r.returncode == 0, r.stderr
    r = kiln("quantize", "--allow-requantize", "--imatrix", full, "--method", "gptq", "--gptq-damp", "0", SMOL,
             gptq, "Q4_K_M", "-t", 2)
    assert r.returncode == 0, r.stderr
    notes = [x for x in r.stderr.splitlines() if "quantize: note:" in x]
    assert len(notes) == 7 * 30, r.stderr[-2000:]  # q, k, v, output, gate, up, down in each of 30 layers
    assert any("tensor 'blk.0.attn_q.weight'" in x for x in notes), notes[:3]
    assert all("not positive definite" in x and "rounded without GPTQ" in x for x in notes), notes[:3]
    assert plain.read_bytes() == gptq.read_bytes()


def test_gptq_errors_name_what_is_missing(full, tmp_path, collected):
    out = tmp_path / "out.gguf"
    cases = [
        ([], "needs --imatrix with Gram matrices"),
        (["--imatrix", collected[0]], "has no Gram matrices"),
        (["--imatrix", full, "--method", "obq"], "--method obq"),
        (["--imatrix", full, "--gptq-damp", "-1"], "--gptq-damp"),
    ]
    for extra, says in cases:
        method = [] if "--method" in extra else ["--method", "gptq"]
        r = kiln("quantize", "--allow-requantize", *method, *extra, SMOL, out, "Q4_K_M")
        assert r.returncode != 0 and says in r.stderr, (extra, r.stderr)
        assert not out.exists()


# ---- a mixture of experts: per-expert sums by the routing ----


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """A random-weight Qwen2-MoE (5 experts, top 2, a sigmoid-gated shared expert) as a Hugging Face folder with
    SmolLM2's tokenizer, and per weight its inputs' sums of squares and counts in transformers (f32) over the
    same chunks: hooks on every projection, the router and the experts (whose routing they see)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from hf_cache import hf_tokenizer

    tok = hf_tokenizer(SMOL)
    torch.manual_seed(1234)
    cfg = transformers.Qwen2MoeConfig(
        hidden_size=72, intermediate_size=100, num_hidden_layers=2, num_attention_heads=9, num_key_value_heads=3,
        max_position_embeddings=512, initializer_range=0.1, vocab_size=len(tok), num_experts=5,
        num_experts_per_tok=2, moe_intermediate_size=40, shared_expert_intermediate_size=56)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    folder = tmp_path_factory.mktemp("moe") / "qwen2moe"
    model.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))

    sums: dict[str, list] = {}  # name -> [sum2 [n_mat, n_cols], counts [n_mat]]

    def add(name, x, mat=0, n_mat=1):
        x = x.detach().double().reshape(-1, x.shape[-1]).numpy()
        e = sums.setdefault(name, [np.zeros((n_mat, x.shape[1])), np.zeros(n_mat)])
        e[0][mat] += (x * x).sum(axis=0)
        e[1][mat] += x.shape[0]

    def experts_hook(layer):
        def hook(mod, args, out):
            x, ids = args[0], args[1]  # [n_tokens, n_embd], [n_tokens, n_used]
            for e in range(mod.gate_up_proj.shape[0]):
                rows = x[(ids == e).nonzero()[:, 0]]
                gate, up = torch.nn.functional.linear(rows, mod.gate_up_proj[e]).chunk(2, dim=-1)
                add(f"blk.{layer}.ffn_gate_exps.weight", rows, e, 5)
                add(f"blk.{layer}.ffn_up_exps.weight", rows, e, 5)
                add(f"blk.{layer}.ffn_down_exps.weight", torch.nn.functional.silu(gate) * up, e, 5)
        return hook

    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate": "ffn_gate_inp",
             "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
             "mlp.shared_expert.down_proj": "ffn_down_shexp", "mlp.shared_expert_gate": "ffn_gate_inp_shexp"}
    model.lm_head.register_forward_hook(lambda m, args, out: add("output.weight", args[0]))
    for name, mod in model.named_modules():
        parts = name.split(".")  # model.layers.N.<rest>
        if len(parts) < 4 or parts[1] != "layers":
            continue
        rest, layer = ".".join(parts[3:]), int(parts[2])
        if rest == "mlp.experts":
            mod.register_forward_hook(experts_hook(layer))
        elif rest in names:
            gguf_name = f"blk.{layer}.{names[rest]}.weight"
            mod.register_forward_hook(lambda m, args, out, n=gguf_name: add(n, args[0]))
    tokens = tok(TEXT.read_text(), add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        for c in range(CHUNKS):
            model(torch.tensor([tokens[c * 64 : (c + 1) * 64]]))
    return folder, sums


def test_moe_sums_are_per_expert(moe, tmp_path):
    folder, want = moe
    out = tmp_path / "moe.gguf"
    r = kiln("imatrix", "-m", folder, "-f", TEXT, "-o", out, "-c", 64, "--chunks", CHUNKS, "--exact", "-t", 2)
    assert r.returncode == 0, r.stderr
    got = read_imatrix(out)
    assert set(got) == set(want) - {"output.weight"}  # the output head only when asked for
    worst = 0.0
    for name, (sum2, counts) in want.items():
        if name == "output.weight":
            continue
        g_sum2, g_counts = got[name]
        np.testing.assert_array_equal(g_counts, counts, err_msg=name)  # the routing, expert by expert
        for e in range(len(counts)):
            if counts[e] == 0:
                assert not g_sum2[e].any(), name  # an expert no token reached: 0 and 0, as llama-imatrix
            else:
                err = np.linalg.norm(g_sum2[e] - sum2[e]) / np.linalg.norm(sum2[e])
                assert err < 1e-4, (name, e, err)
                worst = max(worst, err)
    counts0 = want["blk.0.ffn_up_exps.weight"][1]
    print(f"\nmoe: {len(want)} weights, expert counts of layer 0 {counts0}, worst {worst:.1e}")
    r = gguf.GGUFReader(str(out))
    shapes = {t.name: list(t.shape) for t in r.tensors}
    assert shapes["blk.0.ffn_down_exps.weight.in_sum2"] == [40, 5]
    assert shapes["blk.0.ffn_down_exps.weight.counts"] == [1, 5]
    assert shapes["blk.1.ffn_gate_inp_shexp.weight.in_sum2"] == [72]
    # --process-output: the head's input, every row of every chunk.
    out = tmp_path / "head.gguf"
    r = kiln("imatrix", "-m", folder, "-f", TEXT, "-o", out, "-c", 64, "--chunks", CHUNKS, "--exact", "-t", 2,
             "--process-output")
    assert r.returncode == 0, r.stderr
    (g_sum2, g_counts), (sum2, counts) = read_imatrix(out)["output.weight"], want["output.weight"]
    np.testing.assert_array_equal(g_counts, counts)
    assert np.linalg.norm(g_sum2 - sum2) / np.linalg.norm(sum2) < 1e-4


# ---- legacy .dat files and combining ----


def write_legacy(path: Path, entries: dict[str, tuple[int, np.ndarray]], trailer: tuple[int, str] | None):
    """llama-imatrix's legacy format: i32 count; per entry i32 name length, name, i32 ncall, i32 nval, nval f32;
    then optionally i32 chunk count, i32 dataset length, dataset."""
    b = struct.pack("<i", len(entries))
    for name, (ncall, values) in entries.items():
        b += struct.pack("<i", len(name)) + name.encode() + struct.pack("<ii", ncall, len(values))
        b += np.asarray(values, "<f4").tobytes()
    if trailer is not None:
        b += struct.pack("<ii", trailer[0], len(trailer[1])) + trailer[1].encode()
    path.write_bytes(b)


LEGACY = {
    "blk.0.attn_q.weight": (3, np.array([0.5, 1.5, 3.0, 6.0])),
    "blk.0.ffn_down_exps.weight": (2, np.arange(1, 7, dtype=np.float32)),  # 2 experts x 3 columns, flat
}


@pytest.mark.parametrize("trailer", [(3, "calibration.txt"), None])
def test_legacy_file_reads_back(tmp_path, trailer):
    dat, out = tmp_path / "old.dat", tmp_path / "new.gguf"
    write_legacy(dat, LEGACY, trailer)
    r = kiln("imatrix", "--in-file", dat, "-o", out, "-c", 64)
    assert r.returncode == 0, r.stderr
    rd = gguf.GGUFReader(str(out))
    assert field(rd, "imatrix.datasets") == ([trailer[1]] if trailer else [])
    assert field(rd, "imatrix.chunk_size") == 64 and field(rd, "imatrix.chunk_count") == 3
    got = read_imatrix(out)
    assert set(got) == set(LEGACY)
    for name, (ncall, values) in LEGACY.items():
        sums, counts = got[name]
        # llama-imatrix --in-file: a call stood for chunk_size rows; sum / count is the value / ncall that
        # llama-quantize takes from the legacy file.
        np.testing.assert_allclose(sums.reshape(-1), values * 64, rtol=1e-6)
        np.testing.assert_array_equal(counts, [ncall * 64])


def test_files_combine(tmp_path, collected):
    path, _ = collected
    out = tmp_path / "twice.gguf"
    r = kiln("imatrix", "--in-file", path, "--in-file", path, "-o", out, "-c", CHUNK)
    assert r.returncode == 0, r.stderr
    a, b = read_imatrix(path), read_imatrix(out)
    for w in a:
        np.testing.assert_allclose(b[w][0], 2 * a[w][0], rtol=1e-6)
        np.testing.assert_array_equal(b[w][1], 2 * a[w][1])
    rd = gguf.GGUFReader(str(out))
    assert field(rd, "imatrix.datasets") == [str(TEXT)] * 2 and field(rd, "imatrix.chunk_count") == 2 * CHUNKS


# ---- bad files ----


def gguf_imatrix(path: Path, tensors: dict[str, np.ndarray], keys: bool = True, type_: str = "imatrix"):
    w = gguf.GGUFWriter(str(path), arch="unused")
    w.kv_data[0].pop("general.architecture", None)  # an imatrix file has no architecture
    w.add_string("general.type", type_)
    if keys:
        w.add_array("imatrix.datasets", ["x.txt"])
        w.add_uint32("imatrix.chunk_count", 1)
        w.add_uint32("imatrix.chunk_size", 8)
    for name, v in tensors.items():
        w.add_tensor(name, np.asarray(v, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def bad_files(tmp: Path, collected_path: Path) -> list[tuple[Path, str]]:
    """(file, what its error says) pairs."""
    cases = []

    def add(name: str, data: bytes, says: str):
        p = tmp / name
        p.write_bytes(data)
        cases.append((p, says))

    good = collected_path.read_bytes()
    add("cut.gguf", good[: len(good) // 2], "")
    add("garbage.dat", bytes(range(7, 250)) * 4, "")
    add("empty.dat", b"", "empty")
    legacy = tmp / "whole.dat"
    write_legacy(legacy, LEGACY, (3, "calibration.txt"))
    whole = legacy.read_bytes()
    add("cut_values.dat", whole[:40], "truncated")
    add("cut_trailer.dat", whole[:-3], "past the end")
    add("zero.dat", struct.pack("<i", 0), "0 entries")
    cases.append((SMOL, 'general.type is "model"'))
    specs = {
        "zero_count.gguf": ({"a.weight.in_sum2": [1.0, 2.0], "a.weight.counts": [0.0]}, True, "count 0"),
        "lonely.gguf": ({"a.weight.in_sum2": [1.0, 2.0]}, True, "has no a.weight.counts"),
        "shape.gguf": ({"a.weight.in_sum2": [1.0, 2.0], "a.weight.counts": [1.0, 1.0]}, True, "2 values"),
        "nan.gguf": ({"a.weight.in_sum2": [1.0, np.nan], "a.weight.counts": [1.0]}, True, "nan"),
        "no_keys.gguf": ({"a.weight.in_sum2": [1.0, 2.0], "a.weight.counts": [1.0]}, False, "imatrix.chunk_count"),
        # --full's Gram matrices: [n, n] beside their sums, finite.
        "gram_shape.gguf": ({"a.weight.in_sum2": [1.0, 2.0], "a.weight.counts": [1.0],
                             "a.weight.in_gram": [1.0, 0.0, 2.0]}, True, "expected f32 [2, 2]"),
        "gram_alone.gguf": ({"a.weight.in_sum2": [1.0, 2.0], "a.weight.counts": [1.0],
                             "b.weight.in_gram": np.eye(2)}, True, "b.weight.in_gram has no b.weight.in_sum2"),
        "gram_nan.gguf": ({"a.weight.in_sum2": [1.0, 2.0], "a.weight.counts": [1.0],
                           "a.weight.in_gram": [[1.0, np.nan], [np.nan, 2.0]]}, True, "nan"),
    }
    for name, (tensors, keys, says) in specs.items():
        gguf_imatrix(tmp / name, tensors, keys)
        cases.append((tmp / name, says))
    return cases


def test_bad_files_are_clear_errors(tmp_path, collected):
    path, _ = collected
    out = tmp_path / "out.gguf"
    for bad, says in bad_files(tmp_path, path):
        r = kiln("imatrix", "--in-file", bad, "-o", out)
        assert r.returncode != 0, bad
        err = r.stderr.strip()
        assert err.startswith("kiln imatrix: error:") and "\n" not in err, err
        assert str(bad) in err and says.lower() in err.lower(), (says, err)
        assert not out.exists(), bad
        assert not list(tmp_path.glob("out.gguf*")), bad  # no temporary file left either


def test_output_is_never_an_input(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(TEXT.read_text())
    r = kiln("imatrix", "-m", SMOL, "-f", text, "-o", text, "-c", CHUNK, "--chunks", 1)
    assert r.returncode != 0 and "text.txt" in r.stderr, r.stderr
    assert text.read_text() == TEXT.read_text()
    short = tmp_path / "short.txt"
    short.write_text("A few words.")
    r = kiln("imatrix", "-m", SMOL, "-f", short, "-o", tmp_path / "o.gguf", "-c", CHUNK)
    assert r.returncode != 0 and "tokens" in r.stderr and "short.txt" in r.stderr, r.stderr
