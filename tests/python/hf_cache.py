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


def hf_tokenizer(path: Path):
    """transformers' (fast) tokenizer built from the GGUF file."""
    from transformers import AutoTokenizer

    return _cached(path, "tokenizer", lambda: AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name),
                   lambda d: AutoTokenizer.from_pretrained(str(d)))


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
