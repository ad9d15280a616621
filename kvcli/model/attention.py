"""Paged attention: one flat-slot KV pool for all layers, per-sequence SDPA over gathered context.

KV cache layout: ``[num_layers, 2, num_blocks * block_size, num_kv_heads, head_dim]``; slot
``block_id * block_size + offset`` holds one token's K (index 0) and V (index 1) for a layer.
Prefill chunks and decode tokens of different sequences arrive packed in one batch; each
sequence's queries are the last ``q_len`` positions of its context.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from kvcli.model.decode_batch import (
    DecodeBatch,
    PagedDecode,
    build_decode_batches,
    build_paged_decode,
    decode_attention,
)
from kvcli.model.native_attention import (
    PagedRows,
    build_paged_prefill,
    build_shared_decode,
    native_forward,
)
from kvcli.model.prefill_cascade import (
    PrefillGroup,
    broadcast_kv,
    build_prefill_groups,
    grouped_queries,
    prefill_cascade,
)


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64: flat slot where each new token's K/V is written
    query_start_loc: list[int]  # [S+1]: seq s owns rows query_start_loc[s]:query_start_loc[s+1]
    seq_lens: list[int]  # [S]: context length of seq s after this step
    context_slots: list[
        torch.Tensor
    ]  # [S] int64 [seq_lens[s]]: flat slots of seq s's whole context
    # Masks depend on (sequence, sliding window) only, so the first layer builds them for all others.
    mask_cache: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    block_size: int = 0
    decode: list[DecodeBatch] = field(default_factory=list)  # batched single-token sequences
    # With the native kernel (CPU float32): all single-token sequences, read through their tables.
    paged_decode: PagedDecode | None = None
    native: Any = None  # the loaded kvcli.model.native library
    prefill_groups: list[PrefillGroup] = field(default_factory=list)  # shared cached prefixes
    paged_prefill: PagedRows | None = None  # with the native kernels: every other sequence
    shared_decode: PagedRows | None = None  # native: decode tokens sharing a cached prefix

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)


def build_attention_metadata(
    block_tables: list[list[int]],
    num_computed: list[int],
    num_new: list[int],
    block_size: int,
    device: torch.device | str,
    native: Any = None,
) -> AttentionMetadata:
    """Metadata for one step; sequence s computes tokens num_computed[s] : num_computed[s] + num_new[s].

    ``native`` (kvcli.model.native.load(), CPU float32 only) sends decode rows to its kernel.
    """
    if not len(block_tables) == len(num_computed) == len(num_new):
        raise ValueError("block_tables, num_computed and num_new must have one entry per sequence")
    offsets = torch.arange(block_size, dtype=torch.int64)
    query_start_loc = [0]
    seq_lens: list[int] = []
    context_slots: list[torch.Tensor] = []
    new_slots: list[torch.Tensor] = []
    for table, computed, new in zip(block_tables, num_computed, num_new, strict=True):
        length = computed + new
        blocks_needed = -(-length // block_size)
        if new < 1 or computed < 0 or len(table) < blocks_needed:
            raise ValueError(
                f"sequence of {length} tokens ({new} new) needs {blocks_needed} blocks, "
                f"block table has {len(table)}"
            )
        blocks = torch.tensor(table[:blocks_needed], dtype=torch.int64)
        slots = (blocks[:, None] * block_size + offsets).reshape(-1)[:length]
        context_slots.append(slots.to(device))
        new_slots.append(slots[computed:])
        seq_lens.append(length)
        query_start_loc.append(query_start_loc[-1] + new)
    meta = AttentionMetadata(
        slot_mapping=torch.cat(new_slots).to(device),
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        context_slots=context_slots,
        block_size=block_size,
        native=native,
    )
    if native is not None:
        meta.paged_decode = build_paged_decode(block_tables, seq_lens, query_start_loc, block_size)
        decoding = meta.paged_decode.seqs if meta.paged_decode is not None else []
        meta.paged_prefill = build_paged_prefill(context_slots, seq_lens, query_start_loc,
                                                 decoding)
        meta.shared_decode = build_shared_decode(meta.paged_decode, block_tables, context_slots,
                                                 seq_lens, query_start_loc, block_size)
    else:
        meta.prefill_groups = build_prefill_groups(block_tables, num_computed, query_start_loc,
                                                   block_size)
        meta.decode = build_decode_batches(block_tables, seq_lens, query_start_loc, block_size,
                                           device)
    return meta


class KVCacheSpec(Protocol):
    """Anything that knows the cache geometry: a loaded model or its ModelConfig."""

    num_layers: int
    num_kv_heads: int
    head_dim: int


def kv_cache_bytes_per_block(spec: KVCacheSpec, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block costs across all layers (K and V), to size the pool from a byte budget."""
    element_size = torch.empty((), dtype=dtype).element_size()
    return spec.num_layers * 2 * block_size * spec.num_kv_heads * spec.head_dim * element_size


def allocate_kv_cache(
    spec: KVCacheSpec,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> torch.Tensor:
    # Zeroed rather than empty so that a bookkeeping bug reads zeros, not NaN garbage.
    shape = (spec.num_layers, 2, num_blocks * block_size, spec.num_kv_heads, spec.head_dim)
    # Not a lazily zeroed (calloc) pool: first-touch page faults then land inside decode steps,
    # one per new block and layer, and cost ~20 us each on a VM (32x slower KV writes, measured).
    # On CPU the pages are faulted in by a background thread instead (kv_pool.py): torch.zeros
    # of 1 GiB held start-up ~1.4 s.
    if torch.device(device).type == "cpu":
        from kvcli.model.kv_pool import zeroed_cpu_tensor

        return zeroed_cpu_tensor(shape, dtype)
    return torch.zeros(shape, dtype=dtype, device=device)


class Attention(Protocol):
    """One layer's attention over the paged cache; a faster kernel implements this, models don't change."""

    def forward(
        self,
        q: torch.Tensor,  # [T, num_heads, head_dim], RoPE applied
        k: torch.Tensor,  # [T, num_kv_heads, head_dim], RoPE applied
        v: torch.Tensor,  # [T, num_kv_heads, head_dim]
        kv_layer: torch.Tensor,  # [2, num_slots, num_kv_heads, head_dim]
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, num_heads, head_dim]
        ...


def attention_mask(
    q_len: int, seq_len: int, key_start: int, window: int | None, device: torch.device
) -> torch.Tensor:
    """Bool [q_len, seq_len - key_start]: query i sits at position seq_len - q_len + i and sees
    keys at positions <= its own (and, with a sliding window, > its own - window)."""
    q_pos = torch.arange(seq_len - q_len, seq_len, device=device)[:, None]
    k_pos = torch.arange(key_start, seq_len, device=device)[None, :]
    mask = k_pos <= q_pos
    if window is not None:
        mask &= k_pos > q_pos - window
    return mask


class TorchSDPAAttention:
    """Reference backend: per sequence, gather only its context's K/V and call SDPA."""

    def __init__(self, scale: float, sliding_window: int | None = None) -> None:
        self.scale = scale
        self.sliding_window = sliding_window

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_layer: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        kv_layer[0].index_copy_(0, meta.slot_mapping, k)
        kv_layer[1].index_copy_(0, meta.slot_mapping, v)
        if meta.native is not None:  # CPU float32 with the kernels: no gather, no masks
            return native_forward(q, kv_layer, meta, self.sliding_window, self.scale)
        out = torch.empty_like(q)
        batched: set[int] = set()
        if self.sliding_window is None:
            for batch in meta.decode:
                rows = batch.rows
                out[rows] = decode_attention(q[rows], kv_layer, batch, meta.block_size, self.scale)
                batched.update(batch.seqs)
        # (A window may hide part of the prefix; the fused kernel with log-sum-exp is CPU's.)
        if self.sliding_window is None and q.device.type == "cpu":
            for group in meta.prefill_groups:
                out[group.rows] = prefill_cascade(
                    q[group.rows], kv_layer, group, meta.query_start_loc, meta.context_slots,
                    lambda seq, key_start: self._mask(seq, key_start, meta), self.scale)
                batched.update(group.seqs)
        for seq, (start, end) in enumerate(pairwise(meta.query_start_loc)):
            if seq in batched:
                continue
            out[start:end] = self._sequence(
                seq, q[start:end], k[start:end], v[start:end], kv_layer, meta
            )
        return out

    @staticmethod
    def _mask(seq: int, key_start: int, meta: AttentionMetadata) -> torch.Tensor:
        """Float32 CPU causal mask of a chunk over its keys from ``key_start`` (0 or -inf),
        built by the first layer and reused by the others."""
        key = (seq, -1 - key_start)  # apart from the bool masks, keyed by (seq, window)
        mask = meta.mask_cache.get(key)
        if mask is None:
            q_len = meta.query_start_loc[seq + 1] - meta.query_start_loc[seq]
            allowed = attention_mask(q_len, meta.seq_lens[seq], key_start, None, torch.device("cpu"))
            mask = torch.zeros(allowed.shape).masked_fill_(~allowed, float("-inf"))
            meta.mask_cache[key] = mask
        return mask

    def _sequence(
        self,
        seq: int,
        q: torch.Tensor,
        new_k: torch.Tensor,
        new_v: torch.Tensor,
        kv_layer: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        q_len, seq_len, window = q.shape[0], meta.seq_lens[seq], self.sliding_window
        # Keys older than the window are invisible to every query of this step: don't gather them.
        key_start = max(0, seq_len - q_len - window + 1) if window is not None else 0
        if q_len == seq_len:  # whole context is new: attend to the fresh K/V, no gather
            keys, values = new_k, new_v
        else:
            slots = meta.context_slots[seq][key_start:]
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
