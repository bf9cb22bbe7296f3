"""Reference forward pass of Gemma 3 in numpy (float64), read from a GGUF file with the `gguf` package, written
for clarity. Teacher-forced logits of one fresh sequence: Model(path).logits(tokens) -> [n, n_vocab].

Gemma 3 as the GGUF converter stores it: RMSNorm weights already hold Gemma's "+1"; the embedding is scaled by
sqrt(n_embd); each query and key head is RMS-normalised (q_norm / k_norm) before NeoX-style RoPE (halves
rotated); attention scaled by 1/sqrt(head_dim); post-attention and post-FFN norms; GeGLU with the tanh GELU;
five of every six layers attend to a sliding window with RoPE base 10,000, the sixth globally with the model's
base. The output head is the token embedding (tied) unless output.weight exists.
"""
from __future__ import annotations

import os

import numpy as np
import gguf

from llama_ref import _field, _tensor_f32, limit_blas_threads


class Model:
    def __init__(self, path):
        limit_blas_threads(int(os.environ.get("KILN_REF_THREADS", "1")))
        r = gguf.GGUFReader(str(path))
        a = _field(r, "general.architecture")
        if a != "gemma3":
            raise ValueError(f"general.architecture is {a!r}, this reference implements 'gemma3' only")
        self.n_layer = int(_field(r, f"{a}.block_count"))
        self.n_embd = int(_field(r, f"{a}.embedding_length"))
        self.n_head = int(_field(r, f"{a}.attention.head_count"))
        self.n_head_kv = int(_field(r, f"{a}.attention.head_count_kv"))
        self.head_dim = int(_field(r, f"{a}.attention.key_length"))
        self.eps = float(_field(r, f"{a}.attention.layer_norm_rms_epsilon"))
        self.base_global = float(_field(r, f"{a}.rope.freq_base"))
        self.base_local = float(_field(r, f"{a}.rope.freq_base_swa", 10000.0))
        self.window = int(_field(r, f"{a}.attention.sliding_window"))
        self.w = {t.name: _tensor_f32(t).astype(np.float64) for t in r.tensors}

    def _norm(self, x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

    def _rope(self, x, pos, base):  # x [n, heads, hd], NeoX: pairs (i, i + hd/2)
        half = self.head_dim // 2
        inv = base ** (-np.arange(half, dtype=np.float64) * 2 / self.head_dim)
        ang = pos[:, None].astype(np.float64) * inv[None, :]  # [n, half]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1)

    def logits(self, tokens) -> np.ndarray:
        w, n, hd = self.w, len(tokens), self.head_dim
        embd = w["token_embd.weight"]  # [n_vocab, n_embd]
        x = embd[np.asarray(tokens)] * np.sqrt(np.float32(self.n_embd)).astype(np.float64)
        pos = np.arange(n)
        group = self.n_head // self.n_head_kv
        for il in range(self.n_layer):
            p = f"blk.{il}."
            sliding = il % 6 < 5
            h = self._norm(x, w[p + "attn_norm.weight"])
            q = (h @ w[p + "attn_q.weight"].T).reshape(n, self.n_head, hd)
            k = (h @ w[p + "attn_k.weight"].T).reshape(n, self.n_head_kv, hd)
            v = (h @ w[p + "attn_v.weight"].T).reshape(n, self.n_head_kv, hd)
            q = self._norm(q, w[p + "attn_q_norm.weight"])
            k = self._norm(k, w[p + "attn_k_norm.weight"])
            base = self.base_local if sliding else self.base_global
            q, k = self._rope(q, pos, base), self._rope(k, pos, base)
            allowed = pos[None, :] <= pos[:, None]  # [query, key] causal
            if sliding:
                allowed &= pos[None, :] > pos[:, None] - self.window
            out = np.empty((n, self.n_head, hd))
            for hh in range(self.n_head):
                kk, vv = k[:, hh // group], v[:, hh // group]
                s = q[:, hh] @ kk.T / np.sqrt(hd)
                s = np.where(allowed, s, -np.inf)
                s = np.exp(s - s.max(-1, keepdims=True))
                out[:, hh] = (s / s.sum(-1, keepdims=True)) @ vv
            att = out.reshape(n, -1) @ w[p + "attn_output.weight"].T
            x = x + self._norm(att, w[p + "post_attention_norm.weight"])
            h = self._norm(x, w[p + "ffn_norm.weight"])
            g = h @ w[p + "ffn_gate.weight"].T
            g = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3)))
            f = (g * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
            x = x + self._norm(f, w[p + "post_ffw_norm.weight"])
        x = self._norm(x, w["output_norm.weight"])
        head = w.get("output.weight", embd)
        return x @ head.T
