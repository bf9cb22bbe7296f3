"""Reference forward pass of the llama architecture in numpy, read straight from a GGUF file.

Written for clarity, not speed: weights are dequantized once with the `gguf` package (float32, then float64) and
every activation is float64. It is the oracle the engine's CPU forward pass is compared against.

GGUF conventions this relies on:
- the reader lists a tensor's dims in ne order (fastest first); `gguf.quants.dequantize` returns the numpy view,
    i.e. a projection weight as [n_out, n_in], so y = x @ W.T;
- the llama converter permutes the Q/K rows so that RoPE rotates adjacent pairs (x[2i], x[2i+1]) of each head
    ("normal" mode, not NeoX's split halves);
- the output head is `output.weight` when present, else the token embedding (tied).

API: Model(path); model.logits(tokens) -> [n, n_vocab] float64; model.greedy(prompt, n) -> list[int].
model.tap, when set, is called as tap(weight_name, x) with each projection's input x [n, n_in] (importance
matrices: the sums of squares of what each weight multiplies).
"""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import gguf


def limit_blas_threads(n: int) -> bool:
    """Sets numpy's bundled OpenBLAS to n threads; False when that library is not found (then nothing changes).

    On a small shared machine two BLAS threads that get preempted spin-wait and run several times slower than one.
    """
    libs = Path(np.__file__).resolve().parent.parent / "numpy.libs"
    for lib in sorted(libs.glob("libscipy_openblas*.so")):
        setter = getattr(ctypes.CDLL(str(lib)), "scipy_openblas_set_num_threads64_", None)
        if setter is not None:
            setter(ctypes.c_int(n))
            return True
    return False


@dataclass
class HParams:
    n_layer: int  # transformer blocks
    n_embd: int  # residual width
    n_head: int  # query heads
    n_head_kv: int  # key/value heads (GQA: n_head % n_head_kv == 0)
    head_dim: int  # n_embd / n_head
    n_rot: int  # leading dims of each head that RoPE rotates (even, <= head_dim)
    eps: float  # RMSNorm epsilon
    freq_base: float  # RoPE theta base
    freq_scale: float  # linear RoPE scaling: position multiplier (1 / factor)
    n_ctx_train: int  # llama.context_length
    n_vocab: int


def _field(reader: gguf.GGUFReader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        if default is None:
            raise KeyError(f"GGUF metadata key {key!r} is missing")
        return default
    return field.contents()


def _tensor_f32(t) -> np.ndarray:
    """A GGUF tensor dequantized to float32, numpy order (reverse of ne)."""
    shape = tuple(int(d) for d in reversed(t.shape))
    if t.tensor_type == gguf.GGMLQuantizationType.F32:
        out = np.asarray(t.data, dtype=np.float32)
    else:
        out = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
    return out.reshape(shape)


class Layer:
    """One block's weights, float64. Projections are [n_out, n_in]."""

    def __init__(self, w: dict[str, np.ndarray], i: int):
        p = f"blk.{i}."
        self.attn_norm = w[p + "attn_norm.weight"]  # [n_embd]
        self.wq = w[p + "attn_q.weight"]  # [n_head * head_dim, n_embd]
        self.wk = w[p + "attn_k.weight"]  # [n_head_kv * head_dim, n_embd]
        self.wv = w[p + "attn_v.weight"]  # [n_head_kv * head_dim, n_embd]
        self.wo = w[p + "attn_output.weight"]  # [n_embd, n_head * head_dim]
        self.ffn_norm = w[p + "ffn_norm.weight"]  # [n_embd]
        self.w_gate = w[p + "ffn_gate.weight"]  # [n_ff, n_embd]
        self.w_up = w[p + "ffn_up.weight"]  # [n_ff, n_embd]
        self.w_down = w[p + "ffn_down.weight"]  # [n_embd, n_ff]


class Cache:
    """Incremental KV cache: per layer K and V of every position seen, [n_head_kv, n_pos, head_dim] float64."""

    def __init__(self, n_layer: int):
        self.k: list[np.ndarray | None] = [None] * n_layer
        self.v: list[np.ndarray | None] = [None] * n_layer
        self.n_pos = 0  # positions already stored

    def append(self, il: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.k[il] is None:
            self.k[il], self.v[il] = k, v
        else:
            self.k[il] = np.concatenate([self.k[il], k], axis=1)
            self.v[il] = np.concatenate([self.v[il], v], axis=1)
        return self.k[il], self.v[il]


class Model:
    def __init__(self, path, blas_threads: int | None = None):
        # BLAS threads: blas_threads, else $KILN_REF_THREADS, else 1 (see limit_blas_threads).
        limit_blas_threads(blas_threads or int(os.environ.get("KILN_REF_THREADS", "1")))
        reader = gguf.GGUFReader(str(path))
        arch = _field(reader, "general.architecture")
        if arch != "llama":
            raise ValueError(f"general.architecture is {arch!r}, this reference implements 'llama' only")
        n_embd = int(_field(reader, "llama.embedding_length"))
        n_head = int(_field(reader, "llama.attention.head_count"))
        head_dim = n_embd // n_head
        scaling = _field(reader, "llama.rope.scaling.type", "none")
        factor = float(_field(reader, "llama.rope.scaling.factor", 1.0))
        if scaling in ("none", "") or factor in (0.0, 1.0):
            freq_scale = 1.0
        elif scaling == "linear":
            freq_scale = 1.0 / factor
        else:
            raise NotImplementedError(f"llama.rope.scaling.type {scaling!r} is not implemented by the reference")

        weights = {t.name: _tensor_f32(t).astype(np.float64) for t in reader.tensors}
        embd = weights["token_embd.weight"]  # [n_vocab, n_embd]
        self.hp = HParams(
                n_layer=int(_field(reader, "llama.block_count")),
                n_embd=n_embd,
                n_head=n_head,
                n_head_kv=int(_field(reader, "llama.attention.head_count_kv", n_head)),
                head_dim=head_dim,
                n_rot=int(_field(reader, "llama.rope.dimension_count", head_dim)),
                eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
                freq_base=float(_field(reader, "llama.rope.freq_base", 10000.0)),
                freq_scale=freq_scale,
                n_ctx_train=int(_field(reader, "llama.context_length")),
                n_vocab=embd.shape[0],
        )
        hp = self.hp
        assert hp.n_head % hp.n_head_kv == 0 and hp.n_rot % 2 == 0 and hp.n_rot <= hp.head_dim
        self.tok_embd = embd
        self.layers = [Layer(weights, i) for i in range(hp.n_layer)]
        self.output_norm = weights["output_norm.weight"]  # [n_embd]
        self.output = weights.get("output.weight", embd)  # [n_vocab, n_embd]; tied when absent

        # RoPE inverse frequencies of pair i: base^(-2i / n_rot) * freq_scale, divided by rope_freqs (llama 3) if given.
        inv_freq = hp.freq_base ** (-np.arange(0, hp.n_rot, 2, dtype=np.float64) / hp.n_rot) * hp.freq_scale
        if "rope_freqs.weight" in weights:
            inv_freq = inv_freq / weights["rope_freqs.weight"][: hp.n_rot // 2]
        self.inv_freq = inv_freq  # [n_rot / 2]
        self.tap = None  # tap(weight name, x [n, n_in]) before each projection, when set

    # ---------------------------------------------------------------------------------------------------------------
    def _rms_norm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.hp.eps) * w

    def _rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """x [n_heads, n, head_dim], pos [n]: pairs (x[2i], x[2i+1]) of the first n_rot dims turn by pos*inv_freq[i]."""
        n_rot = self.hp.n_rot
        ang = pos[:, None].astype(np.float64) * self.inv_freq[None, :]  # [n, n_rot / 2]
        cos, sin = np.cos(ang), np.sin(ang)
        out = x.copy()
        x0, x1 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = x0 * cos - x1 * sin
        out[..., 1:n_rot:2] = x0 * sin + x1 * cos
        return out

    def _forward(self, tokens, cache: Cache) -> np.ndarray:
        """Feeds tokens at positions cache.n_pos.. and returns their final hidden states [n, n_embd] (normed)."""
        hp = self.hp
        tokens = np.asarray(tokens, dtype=np.int64)
        n = len(tokens)
        if n == 0:
            return np.zeros((0, hp.n_embd))
        if tokens.min() < 0 or tokens.max() >= hp.n_vocab:
            raise ValueError(f"token id out of range [0, {hp.n_vocab})")
        p0 = cache.n_pos
        pos = np.arange(p0, p0 + n)
        group = hp.n_head // hp.n_head_kv
        scale = 1.0 / np.sqrt(hp.head_dim)
        # Causal mask over [n queries, p0 + n keys]: query t sees keys 0..p0+t.
        mask = np.arange(p0 + n)[None, :] > pos[:, None]

        x = self.tok_embd[tokens]  # [n, n_embd]
        tap = self.tap or (lambda name, v: None)
        for il, L in enumerate(self.layers):
            p = f"blk.{il}."
            h = self._rms_norm(x, L.attn_norm)
            for w in ("attn_q", "attn_k", "attn_v"):
                tap(p + w + ".weight", h)
            q = (h @ L.wq.T).reshape(n, hp.n_head, hp.head_dim).transpose(1, 0, 2)  # [n_head, n, head_dim]
            k = (h @ L.wk.T).reshape(n, hp.n_head_kv, hp.head_dim).transpose(1, 0, 2)  # [n_head_kv, n, head_dim]
            v = (h @ L.wv.T).reshape(n, hp.n_head_kv, hp.head_dim).transpose(1, 0, 2)
            q, k = self._rope(q, pos), self._rope(k, pos)
            k_all, v_all = cache.append(il, k, v)  # [n_head_kv, p0 + n, head_dim]
            k_all = np.repeat(k_all, group, axis=0)  # query head h reads kv head h // group
            v_all = np.repeat(v_all, group, axis=0)
            s = (q @ k_all.transpose(0, 2, 1)) * scale  # [n_head, n, p0 + n]
            s = np.where(mask[None], -np.inf, s)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            o = (s @ v_all).transpose(1, 0, 2).reshape(n, hp.n_head * hp.head_dim)  # [n, n_head * head_dim]
            tap(p + "attn_output.weight", o)
            x = x + o @ L.wo.T

            h = self._rms_norm(x, L.ffn_norm)
            tap(p + "ffn_gate.weight", h)
            tap(p + "ffn_up.weight", h)
            g = h @ L.w_gate.T  # [n, n_ff]
            ff = (g / (1.0 + np.exp(-g))) * (h @ L.w_up.T)  # SiLU(gate) * up
            tap(p + "ffn_down.weight", ff)
            x = x + ff @ L.w_down.T
        cache.n_pos += n
        return self._rms_norm(x, self.output_norm)

    # ---------------------------------------------------------------------------------------------------------------
    def logits(self, tokens, chunk: int = 256) -> np.ndarray:
        """Logits [len(tokens), n_vocab] float64 of one sequence starting at position 0 (fed `chunk` tokens a step)."""
        cache = Cache(self.hp.n_layer)
        rows = []
        for i in range(0, len(tokens), chunk):
            rows.append(self._forward(tokens[i : i + chunk], cache) @ self.output.T)
        return np.concatenate(rows) if rows else np.zeros((0, self.hp.n_vocab))

    def greedy(self, prompt, n: int) -> list[int]:
        """n greedily generated ids after prompt (EOS not special), one token per step on the KV cache."""
        if len(prompt) == 0:
            raise ValueError("greedy needs a non-empty prompt")
        cache = Cache(self.hp.n_layer)
        h = self._forward(prompt, cache)[-1]
        out = []
        for _ in range(n):
            tok = int(np.argmax(h @ self.output.T))
            out.append(tok)
            if len(out) < n:
                h = self._forward([tok], cache)[-1]
        return out
