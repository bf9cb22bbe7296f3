"""Tensor parallelism on the CPU: every architecture split over 2 and 4 ranks (threads of one process exchanging
host memory, the CPU backend's collectives) computes the model that runs whole.

Random-weight tiny models made by transformers (test_hf_architectures.py's configs, resized so that 8 heads, 2
KV heads and every FFN width divide among 4 ranks: at 4 ranks each KV head is held by 2 of them), f32 folders:
1. the logits of every position of a 48-token prompt (prefilled in 3 steps) at 2 and 4 ranks against 1:
   max abs difference <= 1e-4 of the logits' scale (the partial sums of the output projection and down are
   added in another order);
2. the engine's greedy 16-token continuation at 2 ranks (`EngineOptions::tensor_parallel`): the same tokens.
"""
import json
import subprocess

import numpy as np
import pytest

import parity_lib as lp
import test_hf_architectures as ha
from parity_text import PARITY_TEXT

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

N_PROMPT = 48
N_GREEDY = 16
TP_COMMON = dict(ha.COMMON, hidden_size=64, intermediate_size=96, num_attention_heads=8, num_key_value_heads=2)


def tp_configs(vocab: int) -> dict:
    """test_hf_architectures.configs() on TP_COMMON's shapes."""
    saved, ha.COMMON = ha.COMMON, TP_COMMON
    try:
        return ha.configs(vocab)
    finally:
        ha.COMMON = saved


@pytest.fixture(scope="module", params=ha.ARCHS)
def folder(request, tmp_path_factory):
    if not ha.SMOLLM.exists():
        pytest.skip(f"missing {ha.SMOLLM} (scripts/fetch-models.sh)")
    from hf_cache import hf_tokenizer

    tok = hf_tokenizer(ha.SMOLLM)
    root = tmp_path_factory.mktemp(request.param.replace(".", "_"))
    tok_dir = root / "tokenizer"
    tok.save_pretrained(str(tok_dir))
    torch.manual_seed(4321)
    model = transformers.AutoModelForCausalLM.from_config(tp_configs(len(tok))[request.param]).eval()
    out = ha.save_folder(model, tok_dir, root / "f32", torch.float32)
    ids = tok(PARITY_TEXT)["input_ids"][:N_PROMPT]
    return dict(name=request.param, path=out, root=root, ids=ids)


def logits(f, tp: int) -> np.ndarray:
    out = f["root"] / f"tp{tp}.f32"
    reply = lp.run_driver(
        ["logits", f["path"], out, "--threads", lp.THREADS, "--chunk", N_PROMPT // 3, "--tp", tp], [f["ids"]]
    )
    return np.fromfile(out, dtype="<f4").reshape(-1, int(reply["n_vocab"]))


@pytest.mark.parametrize("tp", [2, 4])
def test_ranks_compute_the_whole_model(folder, tp):
    ref = logits(folder, 1)
    got = logits(folder, tp)
    diff = np.abs(ref - got).max()
    print(f"\n{folder['name']} over {tp} ranks: max abs {diff:.2e} (logit scale {np.abs(ref).max():.1f})")
    assert diff <= 1e-4 * max(1.0, np.abs(ref).max())
    assert (ref.argmax(axis=1) == got.argmax(axis=1)).all()


def test_engine_greedy_over_two_ranks(folder):
    def greedy(tp: int) -> list[int]:
        args = ["generate", folder["path"], N_GREEDY, "--threads", lp.THREADS, "--tp", tp]
        return lp.run_driver(args, [folder["ids"]])["tokens"][0]

    assert greedy(2) == greedy(1)


def test_a_split_that_does_not_divide_is_named(folder):
    args = [lp.DRIVER, "logits", folder["path"], folder["root"] / "tp3.f32", "--tp", "3"]
    proc = subprocess.run(list(map(str, args)), input=json.dumps([folder["ids"]]).encode(), capture_output=True,
                          timeout=300)
    assert proc.returncode == 1
    assert "tensor parallelism over 3" in proc.stdout.decode()
