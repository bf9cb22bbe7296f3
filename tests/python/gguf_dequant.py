"""GGUF files with the same metadata and other weights: every tensor dequantized to f32 (the `gguf` package's
dequantizers), the same weights for an engine to compute with in f32 instead of its quantized-matmul
arithmetic; or the tensors of one quantized type dequantized and quantized again to another (the `gguf`
package's quantizers), a differently quantized copy of a model."""
from pathlib import Path

import numpy as np


def _writer_with_fields(r, dst: Path):
    """A GGUFWriter for dst holding every metadata field of reader r."""
    import gguf

    arch = r.fields["general.architecture"]
    w = gguf.GGUFWriter(str(dst), arch=bytes(arch.parts[arch.data[0]]).decode())
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            sub = f.types[-1]
            if sub == gguf.GGUFValueType.STRING:
                v = [bytes(f.parts[i]).decode() for i in f.data]
            else:
                v = [f.parts[i][0].item() for i in f.data]
            w.add_key_value(f.name, v, t, sub_type=sub)
        elif t == gguf.GGUFValueType.STRING:
            w.add_key_value(f.name, bytes(f.parts[f.data[0]]).decode(), t)
        else:
            w.add_key_value(f.name, f.parts[f.data[0]][0].item(), t)
    return w


def _finish(w, dst: Path) -> Path:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def dequantize_gguf(src: Path, dst: Path) -> Path:
    import gguf
    from gguf.quants import dequantize

    r = gguf.GGUFReader(str(src))
    w = _writer_with_fields(r, dst)
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type).astype(np.float32)
        w.add_tensor(t.name, a.reshape([int(x) for x in reversed(t.shape)]),
                     raw_dtype=gguf.GGMLQuantizationType.F32)
    return _finish(w, dst)


def requantize_gguf(src: Path, dst: Path, source_type: str, target_type: str) -> Path:
    """dst: src with every tensor of type source_type (e.g. "Q4_1") dequantized and quantized to target_type
    (e.g. "Q4_0", "Q8_0"); the other tensors' bytes and all metadata unchanged (general.file_type included)."""
    import gguf
    from gguf.quants import dequantize, quantize

    source, target = gguf.GGMLQuantizationType[source_type], gguf.GGMLQuantizationType[target_type]
    r = gguf.GGUFReader(str(src))
    w = _writer_with_fields(r, dst)
    for t in r.tensors:
        if t.tensor_type == source:
            a = dequantize(t.data, t.tensor_type).astype(np.float32)
            q = quantize(a.reshape([int(x) for x in reversed(t.shape)]), target)
            w.add_tensor(t.name, q, raw_dtype=target)
        else:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    return _finish(w, dst)
