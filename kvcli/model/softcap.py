"""Paged attention with soft-capped logits (Gemma 2): ``cap * tanh(q.k * scale / cap)``.

Neither SDPA nor the native decode kernel caps the logits, so every sequence of a soft-capped
layer runs transformers' eager formula over its gathered context: scores, cap, mask, float32
softmax, values. Layers without a cap keep the fast paths.
"""

from __future__ import annotations

from itertools import pairwise

import torch

from kvcli.model.attention import AttentionMetadata, TorchSDPAAttention, attention_mask
from kvcli.model.prefill_cascade import broadcast_kv, grouped_queries


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


class SoftcapAttention(TorchSDPAAttention):
    def __init__(self, scale: float, sliding_window: int | None, softcap: float) -> None:
        super().__init__(scale, sliding_window)
        self.softcap = softcap

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_layer: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        kv_layer[0].index_copy_(0, meta.slot_mapping, k)
        kv_layer[1].index_copy_(0, meta.slot_mapping, v)
        out = torch.empty_like(q)
        window = self.sliding_window
        for seq, (start, end) in enumerate(pairwise(meta.query_start_loc)):
            q_len, seq_len = end - start, meta.seq_lens[seq]
            # Keys older than the window are invisible to every query of this step.
            key_start = max(0, seq_len - q_len - window + 1) if window is not None else 0
            slots = meta.context_slots[seq][key_start:]
            keys, values = kv_layer[0].index_select(0, slots), kv_layer[1].index_select(0, slots)
            mask = attention_mask(q_len, seq_len, key_start, window, q.device)
            out[start:end] = capped_attention(q[start:end], keys, values, mask, self.scale,
                                              self.softcap)
        return out
