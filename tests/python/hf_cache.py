"""transformers' tokenizer and model built from a GGUF file by transformers' own GGUF loader, kept on disk.

Building them is slow (Gemma 3's 262,144-token vocabulary takes ~30 s to convert, its weights as long to read), and
several test files need the same ones. The first process to need one builds it from the GGUF file and saves it with
save_pretrained; later ones load that copy, which is the same tokenizer / the same dequantized weights. A copy is
keyed by the file's name, size and mtime and by the transformers version, so a new model file or a new
transformers builds it afresh. Location: ${XDG_CACHE_HOME:-~/.cache}/kiln/test-cache (KILN_TEST_CACHE overrides).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

CACHE = Path(os.environ.get("KILN_TEST_CACHE")
             or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kiln" / "test-cache")


def _cached(path: Path, what: str, build, load):
    """load(dir) of the saved copy of build() (an object with save_pretrained), building and saving it if needed."""
    import transformers

    st = path.stat()
    d = CACHE / f"{path.name}-{st.st_size}-{int(st.st_mtime)}-transformers-{transformers.__version__}-{what}"
    if (d / ".complete").exists():
        return load(d)
    obj = build()
    tmp = d.with_name(f"{d.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    obj.save_pretrained(str(tmp))
    (tmp / ".complete").touch()
    try:
        tmp.rename(d)  # atomic: a concurrent process either sees no copy or a complete one
    except OSError:  # another process saved it first
        shutil.rmtree(tmp, ignore_errors=True)
    return obj


# GGUF pre-tokenizer names whose vocabularies split every digit off before GPT-2's regex: their tokenizer.json
# has Digits(individual_digits) then ByteLevel, and llama.cpp splits so. transformers' GGUF loader leaves the
# digit split out.
DIGIT_SPLIT_PRE = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone"}


def _gguf_pre(path: Path) -> str:
    from gguf import GGUFReader

    field = GGUFReader(str(path)).fields.get("tokenizer.ggml.pre")
    return field.contents() if field is not None else ""


def _with_trained_pre_tokenizer(tok, path: Path):
    """tok with the pre-tokenizer its vocabulary was trained with where transformers' GGUF loader drops a step."""
    if _gguf_pre(path) in DIGIT_SPLIT_PRE:
        from tokenizers import pre_tokenizers

        tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    return tok


def hf_tokenizer(path: Path):
    """transformers' (fast) tokenizer built from the GGUF file, with the vocabulary's own pre-tokenizer (a
    SmolLM vocabulary splits digits, as its tokenizer.json and llama.cpp do)."""
    from transformers import AutoTokenizer

    def build():
        return _with_trained_pre_tokenizer(AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name), path)

    return _cached(path, "tokenizer", build,
                   lambda d: _with_trained_pre_tokenizer(AutoTokenizer.from_pretrained(str(d)), path))


def hf_model(path: Path):
    """transformers' causal LM with the GGUF file's weights dequantized by transformers' GGUF loader, in f32."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    def build():
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
        # The weights are plain f32 tensors once loaded; the GGUF "quantizer" left attached would refuse to save.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        return model

    logging.disable_progress_bar()
    return _cached(path, "model-f32", build,
                   lambda d: AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32)).eval()
