"""ggml's own quantizers, called through ctypes from the shared library that the test venv's llama-cpp-python
ships (libggml-base): the byte-for-byte peer of kiln's row quantizers (core/quant, DTypeInfo::quantize_rows).

    rows = ggml_peer.quantize("q4_k", src_f32_2d)                 # as llama-quantize without an imatrix
    rows = ggml_peer.quantize("iq2_xs", src_f32_2d, importance)   # with per-column importance weights
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import numpy as np

# ggml type ids (= GGUF tensor type ids, = kiln's DType values).
TYPE_IDS = {
    "f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "q2_k": 10, "q3_k": 11,
    "q4_k": 12, "q5_k": 13, "q6_k": 14, "iq2_xxs": 16, "iq2_xs": 17, "iq3_xxs": 18, "iq1_s": 19,
    "iq4_nl": 20, "iq3_s": 21, "iq2_s": 22, "iq4_xs": 23, "iq1_m": 29, "bf16": 30,
}


@functools.cache
def _lib() -> ctypes.CDLL:
    import llama_cpp  # the package's lib/ folder holds libggml-base

    path = Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"
    lib = ctypes.CDLL(str(path))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.ggml_quantize_init.restype = None
    lib.ggml_quantize_init.argtypes = [ctypes.c_int]
    lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
    lib.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
    lib.ggml_row_size.restype = ctypes.c_size_t
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    return lib


def requires_importance(name: str) -> bool:
    return bool(_lib().ggml_quantize_requires_imatrix(TYPE_IDS[name]))


def quantize(name: str, src: np.ndarray, importance: np.ndarray | None = None) -> bytes:
    """ggml_quantize_chunk over the rows of a 2-d f32 array: the rows of type `name`, as bytes."""
    lib = _lib()
    t = TYPE_IDS[name]
    src = np.ascontiguousarray(src, dtype=np.float32)
    assert src.ndim == 2
    n_rows, n_per_row = src.shape
    if importance is not None:
        importance = np.ascontiguousarray(importance, dtype=np.float32)
        assert importance.shape == (n_per_row,)
    lib.ggml_quantize_init(t)  # the i-quants' grids; a no-op for the others
    out = ctypes.create_string_buffer(lib.ggml_row_size(t, n_per_row) * n_rows)
    written = lib.ggml_quantize_chunk(t, src.ctypes.data, out, 0, n_rows, n_per_row,
                                      None if importance is None else importance.ctypes.data)
    assert written == len(out.raw)
    return out.raw
