"""The torch CPU attention route: batched decode with its cascade, SDPA per prefill chunk.

Decode tokens of two or more sequences go to one batched call per layer (torch_decode.py, with
a cascade over a shared cached prefix); prefill chunks sharing a cached prefix attend it once
(torch_prefill_cascade.py); every other sequence gathers only its context's K/V and calls SDPA.
It runs where the native kernels cannot: another dtype, or no C compiler (KVCLI_NATIVE=0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from typing import ClassVar

import torch
import torch.nn.functional as F

from kvcli.model.attention.common import (
    CommonAttentionMetadata,
    LayerAttention,
    attention_mask,
    window_start,
    write_kv,
)
from kvcli.model.attention.torch_decode import DecodeBatch, build_decode_batches, decode_attention
from kvcli.model.attention.torch_prefill_cascade import (
    PrefillGroup,
    broadcast_kv,
    build_prefill_groups,
    grouped_queries,
    prefill_cascade,
)
from kvcli.model.platform import Platform


@dataclass(slots=True)
class TorchMetadata:
    common: CommonAttentionMetadata
    decode: list[DecodeBatch]  # batched single-token sequences
    prefill_groups: list[PrefillGroup]  # chunks sharing a cached prefix (CPU only)
    # Masks depend on (sequence, sliding window) only, so the first layer builds them for all others.
    mask_cache: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)


class TorchSDPABackend:
    name: ClassVar[str] = "torch-cpu"
    decode: ClassVar[str] = "torch batched + cascade"
    prefill: ClassVar[str] = "torch SDPA per sequence + prefix cascade"
    prefill_cascade: ClassVar[bool] = True  # torch's fused CPU kernel returns the log-sum-exp

    def __init__(self, platform: Platform) -> None:
        self.platform = platform

    @classmethod
    def accepts(cls, platform: Platform, layers: list[LayerAttention]) -> bool:
        return platform.cpu

    def build_metadata(self, common: CommonAttentionMetadata) -> TorchMetadata:
        c = common
        groups = (build_prefill_groups(c.block_tables, c.num_computed, c.query_start_loc,
                                       c.block_size) if self.prefill_cascade else [])
        decode = build_decode_batches(c.block_tables, c.seq_lens, c.query_start_loc,
                                      c.block_size, c.device)
        return TorchMetadata(common, decode, groups)

    def layer(self, spec: LayerAttention) -> TorchSDPAImpl:
        return TorchSDPAImpl(spec.scale, spec.sliding_window)


class TorchSDPAImpl:
    """Per sequence, gather only its context's K/V and call SDPA; decode rows batched."""

    def __init__(self, scale: float, sliding_window: int | None = None) -> None:
        self.scale = scale
        self.sliding_window = sliding_window

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_layer: torch.Tensor,
                meta: TorchMetadata) -> torch.Tensor:
        common = meta.common
        write_kv(kv_layer, common, k, v)
        out = torch.empty_like(q)
        batched: set[int] = set()
        # (A window may hide part of the prefix; the fused kernel with log-sum-exp is CPU's.)
        if self.sliding_window is None:
            for batch in meta.decode:
                rows = batch.rows
                out[rows] = decode_attention(q[rows], kv_layer, batch, common.block_size,
                                             self.scale)
                batched.update(batch.seqs)
            for group in meta.prefill_groups:
                out[group.rows] = prefill_cascade(
                    q[group.rows], kv_layer, group, common.query_start_loc, common.context_slots,
                    lambda seq, key_start: self._mask(seq, key_start, meta), self.scale)
                batched.update(group.seqs)
        for seq, (start, end) in enumerate(pairwise(common.query_start_loc)):
            if seq in batched:
                continue
            out[start:end] = self._sequence(
                seq, q[start:end], k[start:end], v[start:end], kv_layer, meta
            )
        return out

    @staticmethod
    def _mask(seq: int, key_start: int, meta: TorchMetadata) -> torch.Tensor:
        """Float32 CPU causal mask of a chunk over its keys from ``key_start`` (0 or -inf),
        built by the first layer and reused by the others."""
        key = (seq, -1 - key_start)  # apart from the bool masks, keyed by (seq, window)
        mask = meta.mask_cache.get(key)
        if mask is None:
            c = meta.common
            q_len = c.query_start_loc[seq + 1] - c.query_start_loc[seq]
            allowed = attention_mask(q_len, c.seq_lens[seq], key_start, None, torch.device("cpu"))
            mask = torch.zeros(allowed.shape).masked_fill_(~allowed, float("-inf"))
            meta.mask_cache[key] = mask
        return mask

    def _sequence(self, seq: int, q: torch.Tensor, new_k: torch.Tensor, new_v: torch.Tensor,
                  kv_layer: torch.Tensor, meta: TorchMetadata) -> torch.Tensor:
        q_len, seq_len, window = q.shape[0], meta.common.seq_lens[seq], self.sliding_window
        key_start = window_start(q_len, seq_len, window)
        if q_len == seq_len:  # whole context is new: attend to the fresh K/V, no gather
            keys, values = new_k, new_v
        else:
            slots = meta.common.context_slots[seq][key_start:]
            keys, values = kv_layer[0].index_select(0, slots), kv_layer[1].index_select(0, slots)
        window_bites = window is not None and seq_len - 1 - window >= key_start
        mask, is_causal = None, False
        if q_len == seq_len and not window_bites:
            is_causal = True
        elif q_len > 1 or window_bites:
            key = (seq, window or 0)
            mask = meta.mask_cache.get(key)
            if mask is None:
                mask = attention_mask(q_len, seq_len, key_start, window, q.device)
                meta.mask_cache[key] = mask
        return grouped_sdpa(q, keys, values, mask, is_causal, self.scale)


def grouped_sdpa(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None,
    is_causal: bool,
    scale: float,
) -> torch.Tensor:
    """SDPA for one sequence with grouped K/V heads: q [q_len, H, D], keys/values [L, Hkv, D].

    Query heads are viewed as [Hkv, group] and K/V broadcast over the group with stride-0
    ``expand`` views, never copied. (``enable_gqa=True`` would be the obvious spelling, but on CPU
    it routes to the math kernel, which repeat_interleaves K/V; the views let torch use its fused
    kernel: 2.3-2.9x faster for prefill, measured with torch 2.13.)
    """
    q_len, num_heads, head_dim = q.shape
    kv_heads = keys.shape[1]
    group = num_heads // kv_heads
    out = F.scaled_dot_product_attention(
        grouped_queries(q, kv_heads),
        broadcast_kv(keys, group),
        broadcast_kv(values, group),
        attn_mask=mask,
        is_causal=is_causal,
        scale=scale,
    )
    return out.permute(2, 0, 1, 3).reshape(q_len, num_heads, head_dim)
