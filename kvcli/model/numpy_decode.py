"""A fused CPU path for the most latency-bound step: one sequence decoding one token.

At batch 1 the weights stream at memory bandwidth (~25 ms per step for SmolLM2-135M), but the
~40 element-wise torch ops per layer cost ~5-10 us each in dispatch, another ~18 ms per step.
On 576-element vectors NumPy's per-op cost is ~1-2 us, so this path runs the whole layer stack
in NumPy on zero-copy views of the same weights and the same paged KV cache. It is used only
where it is equivalent op for op: float32 on CPU, no q/k norm, no sliding window. Anything
else (and every batch of more than one row) takes the torch path. With an int8 KV cache
(``--kv-cache-dtype int8``) each layer's K/V write and attention are the native int8 kernels'
(native_int8.py), called on zero-copy torch views: the same codes and kernels a batched step
uses, the rest of the layer in NumPy as for float32.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from kvcli.model.blas_threads import AdaptiveThreads
from kvcli.model.native_step import NativeStep


@dataclass(slots=True)
class _Layer:
    in_norm: np.ndarray
    qkv: np.ndarray  # [hidden, q + 2 kv]
    qkv_bias: np.ndarray | None
    o: np.ndarray
    o_bias: np.ndarray | None
    post_norm: np.ndarray
    gate_up: np.ndarray
    gate_up_bias: np.ndarray | None
    down: np.ndarray
    down_bias: np.ndarray | None


def _np(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.detach().numpy()


def _rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x * (1.0 / np.sqrt(np.dot(x, x) / x.shape[0] + eps)) * weight


def _affine(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    y = x @ w
    return y if b is None else y + b


class NumpyDecoder:
    def __init__(self, model: torch.nn.Module) -> None:
        cfg = model.config
        self.eps = cfg.rms_norm_eps
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.scale = np.float32(self.head_dim**-0.5)
        inner = model.model
        self.embed = _np(inner.embed_tokens.weight)
        self.final_norm = _np(inner.norm.weight)
        self.cos, self.sin = _np(inner.rotary.cos), _np(inner.rotary.sin)
        self.layers = [self._layer(layer) for layer in inner.layers]
        # OpenBLAS thread count from measured step times (contention: blas_threads.py).
        first, head = self.layers[0], getattr(model, "lm_head", None)
        logits = self.embed.T if head is None else _np(head.weight).T  # compute_logits' matmul
        self.threads = AdaptiveThreads.create([first.qkv, first.o, first.gate_up, first.down,
                                               logits])
        platform = model.platform
        self.int8_lib = platform.native if platform.kv_dtype == torch.uint8 else None
        # The whole layer stack in one native call where its kernels take it (native_step.py).
        self.native_step = NativeStep.create(model)

    @staticmethod
    def supports(model: torch.nn.Module) -> bool:
        params = list(model.parameters())
        if not params or any(p.device.type != "cpu" or p.dtype != torch.float32 for p in params):
            return False
        attns = [layer.self_attn for layer in model.model.layers]
        return all(a.q_norm is None and a.attn.sliding_window is None for a in attns)

    @staticmethod
    def _layer(layer: torch.nn.Module) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        # Weights are [out, in] views of [in, out] buffers: .T is the buffer itself, no copy.
        return _Layer(
            _np(layer.input_layernorm.weight), _np(attn.qkv_proj.weight).T, _np(attn.qkv_proj.bias),
            _np(attn.o_proj.weight).T, _np(attn.o_proj.bias), _np(layer.post_attention_layernorm.weight),
            _np(mlp.gate_up_proj.weight).T, _np(mlp.gate_up_proj.bias),
            _np(mlp.down_proj.weight).T, _np(mlp.down_proj.bias),
        )

    def __call__(
        self, token: int, position: int, slot: int, context: np.ndarray, kv_cache: np.ndarray
    ) -> np.ndarray:
        """Hidden state [1, hidden] after the final norm; writes this token's K/V at ``slot``.

        ``context`` holds the flat slots of the whole context (this token's slot last)."""
        if self.native_step is not None:
            return self.native_step(self.embed[token], self.cos[position], self.sin[position],
                                    kv_cache, slot, context)
        if self.threads is None:
            return self._forward(token, position, slot, context, kv_cache)
        self.threads.begin()
        start = time.perf_counter()
        hidden = self._forward(token, position, slot, context, kv_cache)
        self.threads.end(time.perf_counter() - start)
        return hidden

    def _forward(
        self, token: int, position: int, slot: int, context: np.ndarray, kv_cache: np.ndarray
    ) -> np.ndarray:
        h = self.embed[token].copy()
        cos, sin = self.cos[position], self.sin[position]
        q_size = self.heads * self.head_dim
        kv_size = self.kv_heads * self.head_dim
        half = self.head_dim // 2
        group = self.heads // self.kv_heads
        for i, lw in enumerate(self.layers):
            x = _rms_norm(h, lw.in_norm, self.eps)
            qkv = _affine(x, lw.qkv, lw.qkv_bias)
            qk = qkv[: q_size + kv_size].reshape(-1, self.head_dim)
            rotated = np.concatenate((-qk[:, half:], qk[:, :half]), axis=1)
            qk = qk * cos + rotated * sin
            kv_layer = kv_cache[i]
            v = qkv[q_size + kv_size :].reshape(self.kv_heads, self.head_dim)
            if self.int8_lib is not None:
                attn = self._int8_attention(qk, v, kv_layer, slot, context)
                h = h + _affine(attn, lw.o, lw.o_bias)
            else:
                kv_layer[0, slot] = qk[self.heads :]
                kv_layer[1, slot] = v
                keys = kv_layer[0].take(context, axis=0)  # [L, Hkv, D]
                values = kv_layer[1].take(context, axis=0)
                q = qk[: self.heads].reshape(self.kv_heads, group, self.head_dim)
                scores = np.matmul(q, keys.transpose(1, 2, 0)) * self.scale  # [Hkv, G, L]
                scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
                scores /= scores.sum(axis=-1, keepdims=True)
                attn = np.matmul(scores, values.transpose(1, 0, 2)).reshape(q_size)  # [Hkv,G,D]
                h = h + _affine(attn, lw.o, lw.o_bias)
            gate_up = _affine(_rms_norm(h, lw.post_norm, self.eps), lw.gate_up, lw.gate_up_bias)
            gate, up = np.split(gate_up, 2)
            h = h + _affine(gate / (1.0 + np.exp(-gate)) * up, lw.down, lw.down_bias)
        return _rms_norm(h, self.final_norm, self.eps)[None, :]

    def _int8_attention(self, qk: np.ndarray, v: np.ndarray, kv_layer: np.ndarray, slot: int,
                        context: np.ndarray) -> np.ndarray:
        """This token's K/V quantized into ``slot``, then its attention over ``context`` by the
        native many-row kernel (which takes the context's slots as they are)."""
        from kvcli.model import native

        lib, kv = self.int8_lib, torch.from_numpy(kv_layer)
        where = torch.tensor([slot], dtype=torch.int64)
        native.quantize_kv(lib, torch.from_numpy(qk[self.heads :])[None], where, kv[0])
        native.quantize_kv(lib, torch.from_numpy(np.ascontiguousarray(v))[None], where, kv[1])
        q = torch.from_numpy(np.ascontiguousarray(qk[: self.heads]))[None]
        out = torch.empty_like(q)
        seqs = torch.tensor([[0, 1, context.shape[0], 0]], dtype=torch.int64)
        native.paged_prefill_attention(lib, q, kv, torch.from_numpy(context), seqs, out, None,
                                       float(self.scale))
        return out.numpy().reshape(-1)
