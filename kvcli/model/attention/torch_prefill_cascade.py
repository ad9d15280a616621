"""The torch CPU route's cascade attention for prefill chunks that share a cached prefix.

When several requests with one system prompt are admitted together, each prefill chunk's
queries attend the same cached prefix blocks. Per sequence, that meant gathering the prefix's
K/V and running a masked SDPA over it once per request and layer (on the shared-prefix bench
workload: 31 sequences x 40 queries x 440 keys, ~0.8 s of a 2.5 s prefill). Here the prefix
is gathered once per group and attended once by all the group's queries in one fused call
(every query sits after the whole prefix, so no mask), each sequence's own part (its context
after the prefix, causal) separately, and the two partial softmaxes are merged exactly through
their log-sum-exps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvcli.model.attention.shared_prefix import MIN_CASCADE_BLOCKS, shared_block_groups

# torch's fused CPU attention, which also returns each row's log-sum-exp (F.scaled_dot_product_
# attention does not); None in builds without it, where the per-sequence path runs instead.
_FLASH_LSE = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


@dataclass(slots=True)
class PrefillGroup:
    seqs: list[int]  # sequences (indices into the step's batch) whose chunks share the prefix
    rows: torch.Tensor  # [T] int64: their query rows in the packed batch, sequence by sequence
    prefix_slots: torch.Tensor  # [P] int64: flat KV slots of the shared prefix


def build_prefill_groups(
    block_tables: list[list[int]],
    num_computed: list[int],
    query_start_loc: list[int],
    block_size: int,
) -> list[PrefillGroup]:
    """Chunks of more than one token whose already computed contexts start with the same
    >= MIN_CASCADE_BLOCKS blocks, grouped by that prefix (only groups of two or more)."""
    if _FLASH_LSE is None:
        return []
    # Chunks of more than one token; only blocks computed before this step count: every query
    # of every chunk sees all of them.
    chunks = [s for s in range(len(num_computed)) if query_start_loc[s + 1] - query_start_loc[s] > 1
              and num_computed[s] >= MIN_CASCADE_BLOCKS * block_size]
    groups = []
    offsets = torch.arange(block_size, dtype=torch.int64)
    limits = [num_computed[s] // block_size for s in chunks]
    for members, common in shared_block_groups(chunks, block_tables, limits):
        blocks = torch.tensor(block_tables[members[0]][:common], dtype=torch.int64)
        rows = torch.cat([torch.arange(query_start_loc[s], query_start_loc[s + 1]) for s in members])
        groups.append(PrefillGroup(members, rows, (blocks[:, None] * block_size + offsets).reshape(-1)))
    return groups


def grouped_queries(x: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """[T, H, D] queries -> [Hkv, group, T, D], the layout whose K/V broadcast over the group."""
    t, h, d = x.shape
    return x.view(t, kv_heads, h // kv_heads, d).permute(1, 2, 0, 3)


def broadcast_kv(x: torch.Tensor, group: int) -> torch.Tensor:
    """[L, Hkv, D] keys or values -> [Hkv, group, L, D], a stride-0 view over the group (no copy;
    torch's fused CPU attention takes it, where ``enable_gqa`` would copy)."""
    length, kv_heads, d = x.shape
    return x.transpose(0, 1).unsqueeze(1).expand(kv_heads, group, length, d)


def _kv(kv_layer: torch.Tensor, slots: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V at ``slots``, broadcast over the group."""
    return (broadcast_kv(kv_layer[0].index_select(0, slots), group),
            broadcast_kv(kv_layer[1].index_select(0, slots), group))


def prefill_cascade(
    q: torch.Tensor,  # [T, H, D]: the group's query rows
    kv_layer: torch.Tensor,  # [2, num_slots, Hkv, D]
    group: PrefillGroup,
    query_start_loc: list[int],
    context_slots: list[torch.Tensor],
    own_mask: Callable[[int, int], torch.Tensor],  # (seq, key_start) -> float [q_len, keys]
    scale: float,
) -> torch.Tensor:  # [T, H, D]
    assert _FLASH_LSE is not None
    kv_heads, (rows, num_heads, head_dim) = kv_layer.shape[2], q.shape
    n_group = num_heads // kv_heads
    qg = grouped_queries(q, kv_heads).contiguous()
    pre_out, pre_lse = _FLASH_LSE(qg, *_kv(kv_layer, group.prefix_slots, n_group), 0.0, False,
                                  scale=scale)[:2]
    own_out, own_lse = torch.empty_like(pre_out), torch.empty_like(pre_lse)
    prefix_len, start = group.prefix_slots.numel(), 0
    for s in group.seqs:
        end = start + query_start_loc[s + 1] - query_start_loc[s]
        mask = own_mask(s, prefix_len).to(q.dtype)  # a no-op in float32
        out, lse = _FLASH_LSE(qg[:, :, start:end], *_kv(kv_layer, context_slots[s][prefix_len:],
                                                          n_group), 0.0, False, attn_mask=mask,
                              scale=scale)[:2]
        own_out[:, :, start:end], own_lse[:, :, start:end] = out, lse
        start = end
    lse = torch.logaddexp(pre_lse, own_lse)
    merged = (pre_out * (pre_lse - lse).exp_().unsqueeze(-1)
              + own_out * (own_lse - lse).exp_().unsqueeze(-1))
    return merged.permute(2, 0, 1, 3).reshape(rows, num_heads, head_dim)
