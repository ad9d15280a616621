"""What every attention backend shares: the step's common fields, the layer contract, the K/V write.

The model runner builds :class:`CommonAttentionMetadata` once per step; the model's backend
(chosen once, kvcli/model/attention/selector.py) turns it into its own metadata, which every
layer's :class:`AttentionImpl` of that backend reads.

KV cache layout: ``[num_layers, 2, num_blocks * block_size, num_kv_heads, head_dim]``; slot
``block_id * block_size + offset`` holds one token's K (index 0) and V (index 1) for a layer.
Prefill chunks and decode tokens of different sequences arrive packed in one batch; each
sequence's queries are the last ``q_len`` positions of its context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch

from kvcli.model.platform import Platform


@dataclass(frozen=True, slots=True)
class CommonAttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64: flat slot where each new token's K/V is written
    query_start_loc: list[int]  # [S+1]: seq s owns rows query_start_loc[s]:query_start_loc[s+1]
    seq_lens: list[int]  # [S]: context length of seq s after this step
    context_slots: list[torch.Tensor]  # [S] int64 [seq_lens[s]]: flat slots of seq s's context
    block_tables: list[list[int]]  # [S]: each sequence's blocks
    num_computed: list[int]  # [S]: tokens of seq s already in the cache before this step
    block_size: int
    device: torch.device | str

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)


def build_common_metadata(
    block_tables: list[list[int]],
    num_computed: list[int],
    num_new: list[int],
    block_size: int,
    device: torch.device | str,
) -> CommonAttentionMetadata:
    """One step's fields; sequence s computes tokens num_computed[s] : num_computed[s] + num_new[s]."""
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
    return CommonAttentionMetadata(torch.cat(new_slots).to(device), query_start_loc, seq_lens,
                                   context_slots, block_tables, num_computed, block_size, device)


@dataclass(frozen=True, slots=True)
class LayerAttention:
    """What a layer asks of attention (from the family's AttentionSpec)."""

    scale: float
    sliding_window: int | None = None
    softcap: float | None = None  # Gemma 2: cap * tanh(q.k * scale / cap)


class AttentionImpl(Protocol):
    """One layer's attention over the paged cache; a faster kernel implements this, models don't change."""

    sliding_window: int | None

    def forward(
        self,
        q: torch.Tensor,  # [T, num_heads, head_dim], RoPE applied
        k: torch.Tensor,  # [T, num_kv_heads, head_dim], RoPE applied
        v: torch.Tensor,  # [T, num_kv_heads, head_dim]
        kv_layer: torch.Tensor,  # [2, num_slots, num_kv_heads, head_dim]
        meta: Any,  # the backend's own metadata (AttentionBackend.build_metadata)
    ) -> torch.Tensor:  # [T, num_heads, head_dim]
        ...


class AttentionBackend(Protocol):
    """One attention route: whether it serves a platform and model, its per-step metadata
    (built from the common fields) and its per-layer implementation."""

    name: ClassVar[str]
    decode: ClassVar[str]  # what runs decode tokens, for --stats and the bench
    prefill: ClassVar[str]  # what runs prefill chunks

    @classmethod
    def accepts(cls, platform: Platform, layers: list[LayerAttention]) -> bool: ...

    def build_metadata(self, common: CommonAttentionMetadata) -> Any: ...

    def layer(self, spec: LayerAttention) -> AttentionImpl: ...


def write_kv(kv_layer: torch.Tensor, meta: CommonAttentionMetadata, k: torch.Tensor,
             v: torch.Tensor) -> None:
    """The step's new K/V into their slots, before any backend reads the context."""
    kv_layer[0].index_copy_(0, meta.slot_mapping, k)
    kv_layer[1].index_copy_(0, meta.slot_mapping, v)


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


def window_start(q_len: int, seq_len: int, window: int | None) -> int:
    """First key any query of the chunk can see: keys older than the window are invisible to
    every query of this step, so they are not gathered."""
    return max(0, seq_len - q_len - window + 1) if window is not None else 0
