#!/usr/bin/env python3
"""Writes a GGUF file whose weight matrices are random quantized blocks, typed as llama.cpp's Q4_K_M (or Q4_0)
mix types them, from a GGUF file of the same model in any type (its metadata, tensor names and shapes; its 1-D
tensors copied as f32). For measuring decode speed on those types where no quantizer for them is at hand: the
values mean nothing (quants any bytes, f16 scales and minimums positive normals in 2^-9 .. 2^-8), the bytes
read per token are such a file's.

    random_kquant_gguf.py FROM.gguf TO.gguf [--mix q4_k_m|q4_0] [--seed N]

Types, q4_k_m: the output head and token embedding Q6_K and Q4_K; in each layer, V and down Q6_K in the layers
llama.cpp gives more bits (the first and last eighth, and every third between), Q4_K otherwise; every other
matrix Q4_K. q4_0: the output head Q6_K, every other matrix Q4_0. Matrices whose rows are not whole blocks of
their type stay as they are in FROM.
"""

import argparse
import re
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

Q4_0, Q4_K, Q6_K = GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K
# Elements and bytes of a block, and the offsets of its f16 scales within it.
BLOCK = {Q4_0: (32, 18, (0,)), Q4_K: (256, 144, (0, 2)), Q6_K: (256, 210, (208,))}
MIXES = {"q4_k_m": 15, "q4_0": 2}  # LLAMA_FTYPE_MOSTLY_*


def more_bits(layer: int, n_layers: int) -> bool:
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def kquant_type(name: str, n_layers: int, mix: str) -> GGMLQuantizationType:
    if name == "output.weight":
        return Q6_K
    if mix == "q4_0":
        return Q4_0
    m = re.match(r"blk\.(\d+)\.(attn_v|ffn_down)\.weight$", name)
    if m and more_bits(int(m.group(1)), n_layers):
        return Q6_K
    return Q4_K


def random_blocks(qtype: GGMLQuantizationType, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    _, size, scales = BLOCK[qtype]
    data = np.frombuffer(rng.bytes(n_blocks * size), dtype=np.uint8).reshape(n_blocks, size).copy()
    for at in scales:
        bits = (0x1800 + rng.integers(0, 0x400, n_blocks)).astype("<u2")
        data[:, at : at + 2] = bits.view(np.uint8).reshape(n_blocks, 2)
    return data


def field_value(field):
    """A metadata field's value as GGUFWriter takes it, and its type (and, for arrays, the element type)."""
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--mix", choices=sorted(MIXES), default="q4_k_m")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    reader = GGUFReader(args.src)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    n_layers = int(reader.fields[f"{arch}.block_count"].parts[-1][0])
    writer = GGUFWriter(args.dst, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue
        value, vtype, etype = field_value(field)
        if vtype == GGUFValueType.ARRAY:
            writer.add_key_value(name, value, vtype, sub_type=etype)
        else:
            writer.add_key_value(name, value, vtype)
    writer.add_file_type(MIXES[args.mix])
    counts = {}
    for t in reader.tensors:
        shape = [int(d) for d in t.shape]  # ne0 first
        qtype = kquant_type(t.name, n_layers, args.mix)
        elems, size, _ = BLOCK[qtype]
        if len(shape) >= 2 and shape[0] % elems == 0:
            n_blocks = int(np.prod(shape)) // elems
            data = random_blocks(qtype, n_blocks, rng)
            # GGUFWriter takes quantized data as bytes rows: [rows..., bytes of a row].
            data = data.reshape(*reversed(shape[1:]), (shape[0] // elems) * size)
            writer.add_tensor(t.name, data, raw_dtype=qtype)
            counts[qtype.name] = counts.get(qtype.name, 0) + 1
        elif len(shape) == 1:
            kind = t.tensor_type.name
            values = None
            if kind in ("F32", "F16"):
                values = t.data.astype(np.float32)
            elif kind == "BF16":
                values = (np.asarray(t.data).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
            if values is None:
                print(f"{t.name}: a 1-D tensor of type {t.tensor_type.name}", file=sys.stderr)
                return 1
            writer.add_tensor(t.name, values)
            counts["F32"] = counts.get("F32", 0) + 1
        else:
            writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
            counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"{args.dst}: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
