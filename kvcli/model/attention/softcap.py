"""Paged attention with soft-capped logits (Gemma 2): ``cap * tanh(q.k * scale / cap)``.

Neither SDPA nor the native kernels cap the logits, so every sequence of a soft-capped model
runs transformers' eager formula over its gathered context: scores, cap, mask, float32
softmax, values. The selector picks this backend for a model whose layers cap their logits.
"""

from __future__ import annotations

from itertools import pairwise
from typing import ClassVar

import torch

from kvcli.model.attention.common import (
    CommonAttentionMetadata,
    LayerAttention,
    attention_mask,
    window_start,
    write_kv,
)
from kvcli.model.attention.torch_prefill_cascade import broadcast_kv, grouped_queries
from kvcli.model.platform import Platform


def capped_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                     mask: torch.Tensor, scale: float, cap: float) -> torch.Tensor:
    """q [q_len, H, D], keys/values [L, Hkv, D], mask bool [q_len, L] -> [q_len, H, D]."""
    q_len, num_heads, head_dim = q.shape
    kv_heads = keys.shape[1]
    group = num_heads // kv_heads
    scores = grouped_queries(q, kv_heads) @ broadcast_kv(keys, group).transpose(-1, -2) * scale
    scores = torch.tanh(scores / cap) * cap  # the same three ops, in the same order, as eager
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    out = probs @ broadcast_kv(values, group)  # [Hkv, group, q_len, D]
    return out.permute(2, 0, 1, 3).reshape(q_len, num_heads, head_dim)


class SoftcapBackend:
    name: ClassVar[str] = "softcap"
    decode: ClassVar[str] = "torch eager soft-capped per sequence"
    prefill: ClassVar[str] = "torch eager soft-capped per sequence"

    def __init__(self, platform: Platform) -> None:
        self.platform = platform

    @classmethod
    def accepts(cls, platform: Platform, layers: list[LayerAttention]) -> bool:
        capped = [spec.softcap is not None for spec in layers]
        if any(capped) and not all(capped):  # one backend serves every layer of a model
            raise ValueError("a model whose layers cap their attention logits only in part is "
                             "not supported")
        return any(capped)

    def build_metadata(self, common: CommonAttentionMetadata) -> CommonAttentionMetadata:
        return common  # per sequence: the common fields are all it reads

    def layer(self, spec: LayerAttention) -> SoftcapImpl:
        assert spec.softcap is not None
        return SoftcapImpl(spec.scale, spec.sliding_window, spec.softcap)


class SoftcapImpl:
    def __init__(self, scale: float, sliding_window: int | None, softcap: float) -> None:
        self.scale = scale
        self.sliding_window = sliding_window
        self.softcap = softcap

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_layer: torch.Tensor,
                meta: CommonAttentionMetadata) -> torch.Tensor:
        write_kv(kv_layer, meta, k, v)
        out = torch.empty_like(q)
        window = self.sliding_window
        for seq, (start, end) in enumerate(pairwise(meta.query_start_loc)):
            q_len, seq_len = end - start, meta.seq_lens[seq]
            key_start = window_start(q_len, seq_len, window)
            slots = meta.context_slots[seq][key_start:]
            keys, values = kv_layer[0].index_select(0, slots), kv_layer[1].index_select(0, slots)
            mask = attention_mask(q_len, seq_len, key_start, window, q.device)
            out[start:end] = capped_attention(q[start:end], keys, values, mask, self.scale,
                                              self.softcap)
        return out
