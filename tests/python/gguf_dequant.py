"""A GGUF file with every tensor dequantized to f32 (the `gguf` package's dequantizers), metadata unchanged: the
same weights for an engine to compute with in f32 instead of its quantized-matmul arithmetic."""
from pathlib import Path

import numpy as np


def dequantize_gguf(src: Path, dst: Path) -> Path:
    import gguf
    from gguf.quants import dequantize

    r = gguf.GGUFReader(str(src))
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
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type).astype(np.float32)
        w.add_tensor(t.name, a.reshape([int(x) for x in reversed(t.shape)]),
                     raw_dtype=gguf.GGMLQuantizationType.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
