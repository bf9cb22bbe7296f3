"""Every supported architecture, as a random-weight tiny model made by transformers from a config in this file.

For each architecture (odd head counts, GQA ratio 3, a 49,152-token vocabulary: SmolLM2's tokenizer, saved into
every folder):
1. kiln on the Hugging Face folder (f32 safetensors) vs transformers in f32 over a 64-token prompt: max abs logit
   difference <= 1e-3;
2. greedy 32-token continuations of that prompt: identical (kiln's engine vs transformers' generate);
   (phi3 uses LongRoPE's short factors, phi3-long its long ones: the sequence, and the context kiln serves, are
   past original_max_position_embeddings);
3. `kiln convert` to GGUF (weights as stored, f32): kiln on the GGUF gives the same logits (<= 1e-5);
4. a BF16 copy of the folder: kiln vs transformers in f32 on the same bf16-rounded weights, <= 1e-3 (agreement to
   bf16 precision: the only difference from the f32 model is the rounding of the weights);
5. the converted GGUF in llama.cpp (llama-cpp-python): the same greedy continuation as kiln. Mistral is left out
   there: llama.cpp's "llama" architecture ignores a sliding window.
Plus: `kiln convert --type q8_0` read back by the `gguf` package and by kiln, an unsupported class named with the
supported ones, the shape of the converted file's metadata, and FP8 with GPTQ of an MoE folder (experts rounded to
nearest).
Weights are drawn with a larger spread than training init (initializer_range 0.1) so that logits are not near
ties everywhere, which a random model at 0.02 would be. Run with -s for the figures.
"""
import copy
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import parity_lib as lp
from parity_text import PARITY_TEXT

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

KILN = Path(os.environ.get("KILN_BUILD_DIR", "build")) / "tools" / "kiln" / "kiln"
SMOLLM = lp.MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
N_PROMPT = 64
N_GREEDY = 32
LOGIT_TOL = 1e-3
GGUF_TOL = 1e-5

COMMON = dict(
    hidden_size=72,
    intermediate_size=100,
    num_hidden_layers=2,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=512,
    initializer_range=0.1,
    rms_norm_eps=1e-5,
)


def configs(vocab: int) -> dict:
    T = transformers
    c = dict(COMMON, vocab_size=vocab)
    return {
        "llama": T.LlamaConfig(**c),
        "llama3.2": T.LlamaConfig(
            **c,
            tie_word_embeddings=True,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
        "mistral": T.MistralConfig(**c, sliding_window=16),
        "qwen2": T.Qwen2Config(**c, tie_word_embeddings=True),
        "qwen2.5-yarn": T.Qwen2Config(
            **c,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 1000000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        ),
        "qwen3": T.Qwen3Config(**c, head_dim=16),
        "gemma3": T.Gemma3TextConfig(
            **dict(c, num_hidden_layers=7), head_dim=16, query_pre_attn_scalar=16, sliding_window=16
        ),
        "phi3": T.Phi3Config(
            **dict(c, max_position_embeddings=16384),
            pad_token_id=0,
            original_max_position_embeddings=4096,
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": [1.0 + 0.05 * i for i in range(4)],
                "long_factor": [2.0 + 0.5 * i for i in range(4)],
                "original_max_position_embeddings": 4096,
            },
        ),
        "phi3-long": T.Phi3Config(
            **dict(c, max_position_embeddings=512),
            pad_token_id=0,
            original_max_position_embeddings=32,
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": [1.0 + 0.05 * i for i in range(4)],
                "long_factor": [2.0 + 0.5 * i for i in range(4)],
                "original_max_position_embeddings": 32,
            },
        ),
        "mixtral": T.MixtralConfig(**c, num_local_experts=5, num_experts_per_tok=2),
        "qwen2moe": T.Qwen2MoeConfig(
            **c, num_experts=5, num_experts_per_tok=2, moe_intermediate_size=40, shared_expert_intermediate_size=56
        ),
        "qwen3moe": T.Qwen3MoeConfig(
            **c, head_dim=16, num_experts=5, num_experts_per_tok=2, moe_intermediate_size=40, norm_topk_prob=True
        ),
    }


ARCHS = ["llama", "llama3.2", "mistral", "qwen2", "qwen2.5-yarn", "qwen3", "gemma3", "phi3", "phi3-long", "mixtral",
         "qwen2moe", "qwen3moe"]
NOT_IN_LLAMA_CPP = {"mistral": "llama.cpp's llama architecture has no sliding window"}


def run_kiln(*args, expect_ok=True) -> subprocess.CompletedProcess:
    if not KILN.exists():
        pytest.fail(f"missing {KILN} (build the kiln target; set KILN_BUILD_DIR)")
    proc = subprocess.run([str(KILN), *map(str, args)], capture_output=True, text=True, timeout=600)
    if expect_ok:
        assert proc.returncode == 0, f"kiln {args} failed: {proc.stderr[-2000:]}"
    return proc


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    if not SMOLLM.exists():
        pytest.skip(f"missing {SMOLLM} (scripts/fetch-models.sh)")
    from hf_cache import hf_tokenizer

    out = tmp_path_factory.mktemp("tokenizer")
    tok = hf_tokenizer(SMOLLM)
    tok.save_pretrained(str(out))
    return out, tok


def save_folder(model, tok_dir: Path, out: Path, dtype) -> Path:
    copy.deepcopy(model).to(dtype).save_pretrained(str(out))
    for f in tok_dir.iterdir():
        if f.name.startswith("tokenizer") or f.name in ("special_tokens_map.json", "chat_template.jinja"):
            shutil.copy(f, out / f.name)
    return out


def hf_logits(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def kiln_logits(model_path: Path, ids: list[int], out: Path, extra=()) -> np.ndarray:
    reply = lp.run_driver(["logits", model_path, out, "--threads", lp.THREADS, *extra], [ids])
    return np.fromfile(out, dtype="<f4").reshape(-1, int(reply["n_vocab"]))


@pytest.fixture(scope="module", params=ARCHS)
def arch(request, tokenizer_dir, tmp_path_factory):
    tok_dir, tok = tokenizer_dir
    name = request.param
    torch.manual_seed(1234)
    cfg = configs(len(tok))[name]
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    root = tmp_path_factory.mktemp(name.replace(".", "_"))
    folder = save_folder(model, tok_dir, root / "f32", torch.float32)
    ids = tok(PARITY_TEXT)["input_ids"][:N_PROMPT]
    assert len(ids) == N_PROMPT
    return dict(name=name, model=model, folder=folder, root=root, ids=ids, tok_dir=tok_dir)


def test_folder_logits_match_transformers(arch):
    ref = hf_logits(arch["model"], arch["ids"])
    got = kiln_logits(arch["folder"], arch["ids"], arch["root"] / "kiln.f32")
    diff = np.abs(ref - got).max()
    print(f"\n{arch['name']}: kiln folder vs transformers f32, max abs {diff:.2e} (logit scale {np.abs(ref).max():.1f})")
    assert diff <= LOGIT_TOL
    arch["kiln_logits"] = got


def hf_greedy(model, ids: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=N_GREEDY, do_sample=False, min_new_tokens=N_GREEDY)
    return out[0, len(ids):].tolist()


def test_greedy_matches_transformers(arch):
    ref = hf_greedy(arch["model"], arch["ids"])
    got = lp.run_driver(["generate", arch["folder"], N_GREEDY, "--threads", lp.THREADS], [arch["ids"]])["tokens"][0]
    arch["kiln_greedy"] = got
    assert got == ref, f"{arch['name']}: first difference at {next(i for i in range(N_GREEDY) if got[i] != ref[i])}"


def test_converted_gguf_gives_the_same_logits(arch):
    out = arch["root"] / "model.gguf"
    run_kiln("convert", arch["folder"], out)
    got = kiln_logits(out, arch["ids"], arch["root"] / "gguf.f32")
    ref = kiln_logits(arch["folder"], arch["ids"], arch["root"] / "kiln2.f32")
    diff = np.abs(ref - got).max()
    print(f"\n{arch['name']}: converted GGUF vs folder, max abs {diff:.2e}")
    assert diff <= GGUF_TOL
    arch["gguf"] = out


def test_layers_split_over_two_backends_give_the_same_logits(arch):
    """Partial offload's path on two CPU backends: the first half of the layers on one, the rest and the head on
    another (the RoPE factors and a tied head copied to it), the prompt in 3 steps: the same bits as one."""
    half = arch["model"].config.num_hidden_layers // 2
    chunked = ("--chunk", N_PROMPT // 3 + 1)
    ref = kiln_logits(arch["folder"], arch["ids"], arch["root"] / "one.f32", chunked)
    got = kiln_logits(arch["folder"], arch["ids"], arch["root"] / "split.f32", (*chunked, "--split", half))
    assert np.array_equal(ref, got), f"{arch['name']}: max abs {np.abs(ref - got).max():.2e}"


def rounded_copy_diff(model, tok_dir: Path, root: Path, ids: list[int], dtype) -> tuple[float, float]:
    """kiln on a `dtype` copy of the folder vs transformers in f32 on the same rounded weights, and vs the
    unrounded model: (max abs, max abs)."""
    name = str(dtype).split(".")[-1]
    folder = save_folder(model, tok_dir, root / name, dtype)
    rounded = copy.deepcopy(model)  # the same weights rounded to dtype, f32 arithmetic (RoPE buffers untouched)
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.to(dtype).to(torch.float32))
    ref = hf_logits(rounded, ids)
    got = kiln_logits(folder, ids, root / f"{name}.f32")
    orig = hf_logits(model, ids)
    return np.abs(ref - got).max(), np.abs(orig - got).max()


def test_bf16_copy_agrees_to_bf16_precision(arch):
    diff, drift = rounded_copy_diff(arch["model"], arch["tok_dir"], arch["root"], arch["ids"], torch.bfloat16)
    print(f"\n{arch['name']}: BF16 folder vs transformers on the rounded weights, max abs {diff:.2e} "
          f"(vs the f32 model: {drift:.2e})")
    assert diff <= LOGIT_TOL


def test_converted_gguf_greedy_in_llama_cpp(arch):
    if arch["name"] in NOT_IN_LLAMA_CPP:
        pytest.skip(NOT_IN_LLAMA_CPP[arch["name"]])
    pytest.importorskip("llama_cpp")
    out = arch["root"] / "llama_cpp.gguf"
    run_kiln("convert", arch["folder"], out)
    llama = lp.LlamaCpp(out, n_ctx=256, kv_f32=True)  # f32 weights and K/V: llama.cpp computes as kiln does
    got = llama.greedy(arch["ids"], N_GREEDY)
    kiln = lp.run_driver(["generate", out, N_GREEDY, "--threads", lp.THREADS], [arch["ids"]])["tokens"][0]
    # Identical, but for a divergence at an f32 tie (llama.cpp's SIMD summation order moves with its build).
    div = lp.greedy_divergences(llama.logits, [arch["ids"]], [got], [kiln])
    assert all(gap <= lp.F32_TIE for _, _, gap in div), f"{arch['name']}: llama.cpp {got} vs kiln {kiln}: {div}"


def q8_folder(tokenizer_dir, out: Path, config_class, seed: int):
    """A random model of 96-wide rows (q8_0 blocks; its 100-wide FFN rows are not) saved in f32 at `out`."""
    tok_dir, tok = tokenizer_dir
    torch.manual_seed(seed)
    cfg = config_class(**dict(COMMON, hidden_size=96, num_attention_heads=6, num_key_value_heads=2),
                       vocab_size=len(tok))
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    return model, save_folder(model, tok_dir, out, torch.float32)


def test_q8_0_conversion_reads_back(tokenizer_dir, tmp_path):
    gguf = pytest.importorskip("gguf")
    tok = tokenizer_dir[1]
    model, folder = q8_folder(tokenizer_dir, tmp_path / "f32", transformers.Qwen2Config, 7)
    out = tmp_path / "q8.gguf"
    run_kiln("convert", folder, out, "--type", "q8_0")
    r = gguf.GGUFReader(str(out))
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types["token_embd.weight"] == "Q8_0" and types["blk.0.attn_norm.weight"] == "F32"
    assert types["blk.0.ffn_down.weight"] == "F16"  # 100-wide rows: not a multiple of 32
    fields = {f.name for f in r.fields.values()}
    for key in ("general.architecture", "qwen2.block_count", "tokenizer.ggml.model", "tokenizer.ggml.tokens",
                "tokenizer.ggml.merges", "tokenizer.ggml.pre"):
        assert key in fields, key
    ids = tok(PARITY_TEXT)["input_ids"][:N_PROMPT]
    ref = hf_logits(model, ids)
    got = kiln_logits(out, ids, tmp_path / "q8.f32")
    rel = np.linalg.norm(ref - got) / np.linalg.norm(ref)
    print(f"\nq8_0 conversion: relative L2 of the logits {rel:.2e}")
    assert rel < 2e-2


def test_q8_0_conversion_is_the_same_on_any_threads(tokenizer_dir, tmp_path):
    """The cast splits a tensor's rows over threads (the embedding's ~49k rows over several): the file's bytes
    do not depend on how many; a thread count out of range is an error that names the bound."""
    folder = q8_folder(tokenizer_dir, tmp_path / "f32", transformers.LlamaConfig, 11)[1]
    outs = [tmp_path / f"q8-t{n}.gguf" for n in (1, 3)]
    for n, out in zip((1, 3), outs):
        run_kiln("convert", folder, out, "--type", "q8_0", "-t", n)
    assert outs[0].read_bytes() == outs[1].read_bytes()
    proc = run_kiln("convert", folder, tmp_path / "x.gguf", "--type", "q8_0", "-t", 100000, expect_ok=False)
    assert proc.returncode != 0 and "threads: the count must be in [0, " in proc.stderr, proc.stderr
    assert not (tmp_path / "x.gguf").exists()


def test_quantize_of_a_folder_is_the_quantize_of_its_conversion(tokenizer_dir, tmp_path):
    """`kiln quantize` on a folder writes the file it writes from the folder's `kiln convert` GGUF (Q4_K_M: its
    96-wide rows fall back from q4_k/q6_k to q5_0/q8_0)."""
    folder = q8_folder(tokenizer_dir, tmp_path / "f32", transformers.Qwen2Config, 5)[1]
    run_kiln("convert", folder, tmp_path / "f32.gguf")
    run_kiln("quantize", folder, tmp_path / "from-folder.gguf", "Q4_K_M")
    run_kiln("quantize", tmp_path / "f32.gguf", tmp_path / "from-gguf.gguf", "Q4_K_M")
    assert (tmp_path / "from-folder.gguf").read_bytes() == (tmp_path / "from-gguf.gguf").read_bytes()


def test_fp8_gptq_of_a_moe_folder(tokenizer_dir, tmp_path):
    """`kiln quantize FOLDER OUT FP8 --method gptq` on a Qwen2-MoE folder: attention and shared-expert projections
    rounded by GPTQ, the routed experts (whose stacked importance entries hold no Gram matrix) rounded to nearest
    as without --method and counted on their own line; kiln runs the folder. With --gptq-damp 0 and 16
    calibration tokens (Gram matrices of rank 16 < 96 columns) no Hessian is positive definite: each weight is
    rounded to nearest with a note, the plain folder's codes."""
    safetensors_torch = pytest.importorskip("safetensors.torch")
    tok_dir, tok = tokenizer_dir
    torch.manual_seed(3)
    cfg = transformers.Qwen2MoeConfig(**dict(COMMON, hidden_size=96, num_attention_heads=6, num_key_value_heads=2),
                                      vocab_size=len(tok), num_experts=5, num_experts_per_tok=2,
                                      moe_intermediate_size=64, shared_expert_intermediate_size=64)
    folder = save_folder(transformers.AutoModelForCausalLM.from_config(cfg).eval(), tok_dir, tmp_path / "f32",
                         torch.float32)
    text = Path("/usr/share/common-licenses/GPL-2")
    full, tiny = tmp_path / "full.imatrix.gguf", tmp_path / "tiny.imatrix.gguf"
    run_kiln("imatrix", "-m", folder, "-f", text, "-o", full, "-c", 64, "--chunks", 4, "--no-ppl", "--full", "-t", 2)
    run_kiln("imatrix", "-m", folder, "-f", text, "-o", tiny, "-c", 16, "--chunks", 1, "--no-ppl", "--full", "-t", 2)
    plain, gptq, singular = tmp_path / "plain", tmp_path / "gptq", tmp_path / "singular"
    run_kiln("quantize", folder, plain, "FP8", "-t", 2)
    res = run_kiln("quantize", folder, gptq, "FP8", "--imatrix", full, "--method", "gptq", "-t", 2)
    assert "44 weights in FP8 (14 rounded by GPTQ on cpu" in res.stderr, res.stderr
    assert "no Gram matrix per expert): 30" in res.stderr, res.stderr
    res = run_kiln("quantize", folder, singular, "FP8", "--imatrix", tiny, "--method", "gptq", "--gptq-damp", 0,
                   "--fp8-activations", "dynamic", "-t", 2)
    assert "(0 rounded by GPTQ" in res.stderr and res.stderr.count("not positive definite") == 14, res.stderr
    want = safetensors_torch.load_file(str(plain / "model.safetensors"))
    got = safetensors_torch.load_file(str(gptq / "model.safetensors"))
    got_singular = safetensors_torch.load_file(str(singular / "model.safetensors"))
    assert set(got_singular) == set(want)
    for name, w in want.items():
        if w.dtype != torch.float8_e4m3fn:
            continue
        same = torch.equal(got[name].view(torch.uint8), w.view(torch.uint8))
        assert same == (".experts." in name), name
        assert torch.equal(got_singular[name].view(torch.uint8), w.view(torch.uint8)), name
    run_kiln("run", "-m", gptq, "-p", "Hello", "-n", 4, "--temp", 0, "-t", 2, "-d", "cpu")


def test_unsupported_architecture_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["FooForCausalLM"], "model_type": "foo"}))
    proc = run_kiln("convert", tmp_path, tmp_path / "x.gguf", expect_ok=False)
    assert proc.returncode != 0
    assert "FooForCausalLM" in proc.stderr and "Qwen2ForCausalLM" in proc.stderr and "LlamaForCausalLM" in proc.stderr


def test_bad_convert_type_is_an_error(tmp_path):
    proc = run_kiln("convert", tmp_path, tmp_path / "x.gguf", "--type", "q3_x", expect_ok=False)
    assert proc.returncode != 0 and "q3_x" in proc.stderr


@pytest.fixture(scope="module")
def small_llama(tokenizer_dir, tmp_path_factory):
    tok_dir, tok = tokenizer_dir
    torch.manual_seed(3)
    model = transformers.AutoModelForCausalLM.from_config(configs(len(tok))["llama"]).eval()
    folder = save_folder(model, tok_dir, tmp_path_factory.mktemp("small") / "f32", torch.float32)
    return model, folder, tok


def test_sharded_folder_gives_the_same_logits(small_llama, tmp_path):
    model, folder, tok = small_llama
    sharded = tmp_path / "sharded"
    copy.deepcopy(model).save_pretrained(str(sharded), max_shard_size="2MB")
    assert (sharded / "model.safetensors.index.json").exists()
    for f in folder.iterdir():
        if f.name.startswith("tokenizer"):
            shutil.copy(f, sharded / f.name)
    ids = tok(PARITY_TEXT)["input_ids"][:16]
    a = kiln_logits(folder, ids, tmp_path / "a.f32")
    b = kiln_logits(sharded, ids, tmp_path / "b.f32")
    assert np.array_equal(a, b)


def test_f16_copy_agrees_to_f16_precision(small_llama, tmp_path):
    model, folder, tok = small_llama
    ids = tok(PARITY_TEXT)["input_ids"][:N_PROMPT]
    diff, drift = rounded_copy_diff(model, folder, tmp_path, ids, torch.float16)
    print(f"\nF16 folder vs transformers on the rounded weights, max abs {diff:.2e} (vs the f32 model: {drift:.2e})")
    assert diff <= LOGIT_TOL


def test_kiln_run_on_a_folder(small_llama):
    _, folder, _ = small_llama
    proc = run_kiln("run", "-m", folder, "-p", "The sea", "-n", "8", "--temp", "0", "--ignore-eos")
    assert proc.stdout.strip(), proc.stderr
    proc = run_kiln("run", "-m", folder, "-p", "Hello", "-n", "4", "--temp", "0", "--chat")
    assert "prompt" in proc.stderr


def rewrite_safetensors(src: Path, dst: Path, edit) -> None:
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(src / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize(
    "case,edit,expect",
    [
        ("missing", lambda t: t.pop("model.layers.1.mlp.up_proj.weight"), "blk.1.ffn_up.weight is missing"),
        ("misshapen", lambda t: t.update({"model.layers.0.self_attn.k_proj.weight": torch.zeros(8, 72)}),
         "blk.0.attn_k.weight has 8 rows"),
        ("unknown", lambda t: t.update({"model.layers.0.mlp.extra.weight": torch.zeros(4, 4)}),
         "model.layers.0.mlp.extra.weight has no GGUF name"),
        ("int", lambda t: t.update({"model.norm.weight": torch.zeros(72, dtype=torch.int32)}), "I32"),
    ],
)
def test_bad_folders_are_named_errors(small_llama, tmp_path, case, edit, expect):
    _, folder, _ = small_llama
    bad = tmp_path / case
    rewrite_safetensors(folder, bad, edit)
    proc = run_kiln("run", "-m", bad, "-p", "x", "-n", "1", expect_ok=False)
    assert proc.returncode != 0 and expect in proc.stderr, proc.stderr
    proc = run_kiln("convert", bad, tmp_path / "out.gguf", expect_ok=False)
    assert proc.returncode != 0 and expect in proc.stderr, proc.stderr
    assert not (tmp_path / "out.gguf").exists()


def test_gemma3_multimodal_folder_runs_its_text_model(tmp_path):
    """Gemma3ForConditionalGeneration: the text model runs (language_model.* tensors); the vision tower and
    projector are left out."""
    T = transformers
    torch.manual_seed(5)
    text = T.Gemma3TextConfig(**dict(COMMON, num_hidden_layers=2), vocab_size=1000, head_dim=16,
                              query_pre_attn_scalar=16, sliding_window=16)
    vision = T.SiglipVisionConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                                  image_size=28, patch_size=14)
    cfg = T.Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4,
                         image_token_index=999, boi_token_index=997, eoi_token_index=998)
    model = T.Gemma3ForConditionalGeneration(cfg).eval()
    model.save_pretrained(str(tmp_path / "mm"))
    ids = list(range(2, 2 + N_PROMPT))
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([ids])).logits[0].numpy()
    got = kiln_logits(tmp_path / "mm", ids, tmp_path / "mm.f32")
    assert np.abs(ref - got).max() <= LOGIT_TOL


def test_embedding_padded_past_the_vocabulary(tokenizer_dir, tmp_path):
    """HF models often have more embedding rows than tokens (Qwen: 151,936 rows, 151,665 tokens): kiln samples
    only real tokens, and `kiln convert` pads the GGUF token list so llama.cpp accepts the file."""
    gguf = pytest.importorskip("gguf")
    tok_dir, tok = tokenizer_dir
    torch.manual_seed(11)
    cfg = configs(len(tok) + 7)["qwen2"]
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    ids = tok(PARITY_TEXT)["input_ids"][:16]
    with torch.no_grad():  # padding rows along the last hidden state: they win the full argmax
        h = model(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0, -1]
        model.lm_head.weight[len(tok):] = 10 * h
        assert int(model(torch.tensor([ids])).logits[0, -1].argmax()) >= len(tok)
    folder = save_folder(model, tok_dir, tmp_path / "f32", torch.float32)
    got = lp.run_driver(["generate", folder, 8, "--threads", lp.THREADS], [ids])["tokens"][0]
    assert all(0 <= t < len(tok) for t in got), got
    out = tmp_path / "padded.gguf"
    run_kiln("convert", folder, out)
    r = gguf.GGUFReader(str(out))
    tokens = r.fields["tokenizer.ggml.tokens"]
    assert len(tokens.data) == len(tok) + 7
    assert bytes(tokens.parts[tokens.data[-1]]).decode() == f"[PAD{len(tok) + 6}]"
    pytest.importorskip("llama_cpp")
    lp.LlamaCpp(out, n_ctx=64).greedy(ids, 2)  # loads and runs
