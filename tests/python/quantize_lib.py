"""Inputs and the peer for the quantization tests: GGUF files written with the `gguf` package (a model's f16
copy, tiny random models, importance matrices) and llama.cpp's own quantizer (`llama_model_quantize` through
llama-cpp-python), with the same importance data kiln reads from the imatrix file.
"""
from __future__ import annotations

import ctypes
import re
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT, GGUFReader, GGUFValueType, GGUFWriter

# llama.cpp's file types (LLAMA_FTYPE_*), by llama-quantize's names.
FTYPES = {
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K_S": 11,
    "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18,
    "IQ2_XXS": 19, "IQ2_XS": 20, "Q2_K_S": 21, "IQ3_XS": 22, "IQ3_XXS": 23, "IQ1_S": 24, "IQ4_NL": 25,
    "IQ3_S": 26, "IQ3_M": 27, "IQ2_S": 28, "IQ2_M": 29, "IQ4_XS": 30, "IQ1_M": 31, "BF16": 32,
}
# File types llama-quantize refuses without an importance matrix.
NEED_IMATRIX = {"IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M", "IQ3_XXS", "IQ3_XS", "Q2_K_S"}


# ------------------------------------------------------------------------------------------------------------
# Writing GGUF files


def field_value(field):
    """A metadata field's value as GGUFWriter takes it: (value, type, element type or None)."""
    vtype = field.types[0]
    if vtype == GGUFValueType.ARRAY:
        etype = field.types[-1]
        if etype == GGUFValueType.STRING:
            values = [bytes(field.parts[i]).decode("utf-8", errors="surrogateescape") for i in field.data]
        else:
            values = [field.parts[i].tolist()[0] for i in field.data]
        return values, vtype, etype
    if vtype == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8", errors="surrogateescape"), vtype, None
    return field.parts[field.data[0]].tolist()[0], vtype, None


def write_f16_copy(src: Path, dst: Path) -> Path:
    """`src` with every tensor dequantized: weight matrices as f16, 1-d tensors as f32 (what a converter
    writes for an F16 file), general.file_type 1, the metadata otherwise unchanged."""
    from gguf.quants import dequantize

    r = GGUFReader(str(src))
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    w = GGUFWriter(str(dst), arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue
        value, vtype, etype = field_value(f)
        w.add_key_value(name, value, vtype, sub_type=etype)
    w.add_file_type(1)
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type).astype(np.float32).reshape([int(x) for x in reversed(t.shape)])
        w.add_tensor(t.name, a.astype(np.float16) if a.ndim >= 2 else a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def write_tiny_model(path: Path, arch: str, *, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, n_ff: int,
                     n_vocab: int, tied: bool, n_expert: int = 0, n_ff_exp: int = 0, n_ff_shexp: int = 0,
                     seed: int = 0, runnable: bool = False) -> Path:
    """A random-weight model (f16 matrices, f32 vectors) of a dense architecture (llama, qwen2) or qwen2moe,
    with the hyper-parameters llama.cpp loads and a byte-level vocabulary of `n_vocab` tokens. `runnable`: its
    last token is "ab" with the one merge "a b", so that kiln's tokenizer loads it and the model runs."""
    rng = np.random.default_rng(seed)
    hd = n_embd // n_head
    w = GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(1)
    if n_expert:
        w.add_expert_count(n_expert)
        w.add_expert_used_count(2)
        w.add_expert_feed_forward_length(n_ff_exp)
        w.add_expert_shared_feed_forward_length(n_ff_shexp)
    # A byte-level BPE vocabulary: the 256 bytes, then merged pairs of them; no merges (every text stays bytes).
    byte_chars = gguf_byte_chars()
    tokens = [byte_chars[b] for b in range(256)] + [f"<x{i}>" for i in range(n_vocab - 256)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    types = [1] * 256 + [4] * (n_vocab - 256)
    if runnable:
        tokens[-1], types[-1] = "ab", 1
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(["a b"] if runnable else [])
    w.add_bos_token_id(256)
    w.add_eos_token_id(257)

    def mat(rows: int, cols: int, *lead: int) -> np.ndarray:  # numpy shape: (..., rows, cols); GGUF ne0 = cols
        return (rng.standard_normal((*lead, rows, cols)) * 0.05).astype(np.float16)

    def vec(n: int, scale: float = 0.1, offset: float = 0.0) -> np.ndarray:
        return (offset + rng.standard_normal(n) * scale).astype(np.float32)

    w.add_tensor("token_embd.weight", mat(n_vocab, n_embd))
    w.add_tensor("output_norm.weight", vec(n_embd, offset=1.0))
    if not tied:
        w.add_tensor("output.weight", mat(n_vocab, n_embd))
    for i in range(n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", vec(n_embd, offset=1.0))
        w.add_tensor(p + "attn_q.weight", mat(n_head * hd, n_embd))
        w.add_tensor(p + "attn_k.weight", mat(n_head_kv * hd, n_embd))
        w.add_tensor(p + "attn_v.weight", mat(n_head_kv * hd, n_embd))
        if arch in ("qwen2", "qwen2moe"):
            w.add_tensor(p + "attn_q.bias", vec(n_head * hd))
            w.add_tensor(p + "attn_k.bias", vec(n_head_kv * hd))
            w.add_tensor(p + "attn_v.bias", vec(n_head_kv * hd))
        w.add_tensor(p + "attn_output.weight", mat(n_embd, n_head * hd))
        w.add_tensor(p + "ffn_norm.weight", vec(n_embd, offset=1.0))
        if n_expert:
            w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((n_expert, n_embd))).astype(np.float32))
            w.add_tensor(p + "ffn_gate_exps.weight", mat(n_ff_exp, n_embd, n_expert))
            w.add_tensor(p + "ffn_up_exps.weight", mat(n_ff_exp, n_embd, n_expert))
            w.add_tensor(p + "ffn_down_exps.weight", mat(n_embd, n_ff_exp, n_expert))
            w.add_tensor(p + "ffn_gate_inp_shexp.weight", vec(n_embd))
            w.add_tensor(p + "ffn_gate_shexp.weight", mat(n_ff_shexp, n_embd))
            w.add_tensor(p + "ffn_up_shexp.weight", mat(n_ff_shexp, n_embd))
            w.add_tensor(p + "ffn_down_shexp.weight", mat(n_embd, n_ff_shexp))
        else:
            w.add_tensor(p + "ffn_gate.weight", mat(n_ff, n_embd))
            w.add_tensor(p + "ffn_up.weight", mat(n_ff, n_embd))
            w.add_tensor(p + "ffn_down.weight", mat(n_embd, n_ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def gguf_byte_chars() -> list[str]:
    """GPT-2's printable stand-ins for the 256 byte values (the byte-level BPE alphabet)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def imatrix_entries(model: Path, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Random importance data for every weight matrix a matmul reads (not the token embedding):
    name -> (sums [n_mat, n_cols], counts [n_mat]), as an imatrix tool accumulates them."""
    rng = np.random.default_rng(seed)
    out = {}
    for t in GGUFReader(str(model)).tensors:
        shape = [int(x) for x in t.shape]
        if len(shape) < 2 or not t.name.endswith(".weight") or t.name == "token_embd.weight":
            continue
        if "_norm" in t.name or "ffn_gate_inp" in t.name:
            continue
        n_mat = shape[2] if len(shape) > 2 else 1
        counts = rng.integers(16, 64, n_mat).astype(np.float32)
        sums = (rng.gamma(0.5, 1.0, (n_mat, shape[0])) * counts[:, None]).astype(np.float32)
        out[t.name] = (sums, counts)
    return out


def write_imatrix(path: Path, entries: dict[str, tuple[np.ndarray, np.ndarray]], dataset: str = "calib.txt",
                  chunk_count: int = 10, chunk_size: int = 512) -> Path:
    """An imatrix GGUF file as llama-imatrix writes it: <name>.in_sum2 [n_cols, n_mat] and <name>.counts
    [1, n_mat] (f32), imatrix.datasets / chunk_count / chunk_size."""
    w = GGUFWriter(str(path), arch="")
    w.add_type("imatrix")
    w.add_array("imatrix.datasets", [dataset])
    w.add_uint32("imatrix.chunk_count", chunk_count)
    w.add_uint32("imatrix.chunk_size", chunk_size)
    for name, (sums, counts) in entries.items():
        w.add_tensor(name + ".in_sum2", sums)
        w.add_tensor(name + ".counts", counts.reshape(-1, 1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_legacy_imatrix(path: Path, entries: dict[str, tuple[np.ndarray, np.ndarray]], ncall: int = 10,
                         dataset: str = "calib.txt", chunk_count: int = 10) -> dict:
    """The same entries as a legacy .dat file (each column's mean square times ncall, a stacked weight's
    experts one after another). Returns the entries as llama-quantize then sees them: one "matrix" of every
    expert's values, count ncall."""
    import struct

    seen = {}
    with open(path, "wb") as f:
        f.write(struct.pack("<i", len(entries)))
        for name, (sums, counts) in entries.items():
            values = (sums / counts[:, None] * ncall).astype(np.float32).ravel()
            f.write(struct.pack("<i", len(name)) + name.encode())
            f.write(struct.pack("<ii", ncall, values.size) + values.tobytes())
            seen[name] = (values.reshape(1, -1), np.array([ncall], dtype=np.float32))
        f.write(struct.pack("<ii", chunk_count, len(dataset)) + dataset.encode())
    return seen


# ------------------------------------------------------------------------------------------------------------
# The peer


def llama_quantize(src: Path, dst: Path, ftype: str, *, imatrix: dict | None = None, imatrix_file: str = "",
                   dataset: str = "", chunk_count: int = 0, allow_requantize: bool = False, pure: bool = False,
                   tensor_types: list[tuple[str, int]] | None = None, output_type: int | None = None,
                   token_embd_type: int | None = None, threads: int = 2, dry_run: bool = False) -> None:
    """llama.cpp's llama_model_quantize on `src`. `imatrix`: name -> (sums, counts), passed as llama-quantize
    passes it (sums / counts per matrix, a count of 0 giving 1s) with the quantize.imatrix.* keys it adds."""
    import llama_cpp

    p = llama_cpp.llama_model_quantize_default_params()
    p.nthread = threads
    p.ftype = FTYPES[ftype]
    p.allow_requantize = allow_requantize
    p.pure = pure
    p.dry_run = dry_run
    if output_type is not None:
        p.output_tensor_type = output_type
    if token_embd_type is not None:
        p.token_embedding_type = token_embd_type
    keep = []
    if imatrix:
        arr = (llama_cpp.llama_model_imatrix_data * (len(imatrix) + 1))()
        for i, (name, (sums, counts)) in enumerate(imatrix.items()):
            c = np.round(counts).astype(np.float32)[:, None]
            values = np.where(c > 0, sums / np.where(c > 0, c, 1), 1.0).astype(np.float32).ravel()
            keep += [name.encode(), values]
            arr[i].name = keep[-2]
            arr[i].data = values.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            arr[i].size = values.size
        p.imatrix = arr
        keep.append(arr)
        kv = (llama_cpp.llama_model_kv_override * 5)()
        n = 0

        def put(key: str, tag: int, value):
            nonlocal n
            kv[n].key = key.encode()
            kv[n].tag = tag
            if tag == llama_cpp.LLAMA_KV_OVERRIDE_TYPE_STR:
                kv[n].value.val_str = value.encode()[:127]
            else:
                kv[n].value.val_i64 = value
            n += 1

        put("quantize.imatrix.file", llama_cpp.LLAMA_KV_OVERRIDE_TYPE_STR, imatrix_file)
        if dataset:
            put("quantize.imatrix.dataset", llama_cpp.LLAMA_KV_OVERRIDE_TYPE_STR, dataset)
        put("quantize.imatrix.entries_count", llama_cpp.LLAMA_KV_OVERRIDE_TYPE_INT, len(imatrix))
        if chunk_count > 0:
            put("quantize.imatrix.chunks_count", llama_cpp.LLAMA_KV_OVERRIDE_TYPE_INT, chunk_count)
        kv[n].key = b""
        p.kv_overrides = kv
        keep.append(kv)
    if tensor_types:
        tt = (llama_cpp.llama_model_tensor_override * (len(tensor_types) + 1))()
        for i, (pattern, t) in enumerate(tensor_types):
            keep.append(pattern.encode())
            tt[i].pattern = keep[-1]
            tt[i].type = t
        tt[len(tensor_types)].pattern = None
        p.tt_overrides = tt
        keep.append(tt)
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst or "").encode(), ctypes.byref(p))
    assert rc == 0, f"llama_model_quantize {ftype} failed on {src}"


def llama_plan(src: Path, ftype: str, **kw) -> list[tuple[str, str]]:
    """(name, type) of each tensor llama.cpp would write, from its dry run's log (one line per tensor, the new
    type in parentheses when it changes); `kw` as llama_quantize takes them."""
    import llama_cpp
    from llama_cpp import _logger

    text = []
    cb = llama_cpp.llama_log_callback(lambda level, t, ud: text.append(t.decode(errors="replace")))
    llama_cpp.llama_log_set(cb, ctypes.c_void_p(0))
    try:
        llama_quantize(src, None, ftype, dry_run=True, **kw)
    finally:
        llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))
    log = "".join(text)
    plan = [(m[1], (m[3] or m[2]).lower()) for m in
            re.finditer(r"\]\s+(\S+)\s+- \[[^\]]*\], type =\s+(\S+), size = [^\n]*?(?:\((\S+)\))?\n", log)]
    assert plan, log[-2000:]
    return plan


def tensor_types(path: Path) -> list[tuple[str, str]]:
    """(name, type) of each tensor, in file order; types in kiln's spelling ("q4_k")."""
    return [(t.name, t.tensor_type.name.lower()) for t in GGUFReader(str(path)).tensors]


def first_difference(a: Path, b: Path) -> str:
    """Where two GGUF files differ: the first tensor whose bytes differ, or the metadata."""
    ra, rb = GGUFReader(str(a)), GGUFReader(str(b))
    ka = [(k, str(field_value(f)[0])[:200]) for k, f in ra.fields.items() if not k.startswith("GGUF.")]
    kb = [(k, str(field_value(f)[0])[:200]) for k, f in rb.fields.items() if not k.startswith("GGUF.")]
    if ka != kb:
        return f"metadata differs: {[x for x in ka if x not in kb][:3]} vs {[x for x in kb if x not in ka][:3]}"
    for ta, tb in zip(ra.tensors, rb.tensors):
        if (ta.name, ta.tensor_type) != (tb.name, tb.tensor_type):
            return f"tensor {ta.name} {ta.tensor_type.name} vs {tb.name} {tb.tensor_type.name}"
        if ta.data.tobytes() != tb.data.tobytes():
            return f"tensor {ta.name} ({ta.tensor_type.name}) bytes differ"
    return "layout (offsets or padding) differs"
