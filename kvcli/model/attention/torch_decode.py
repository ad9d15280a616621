"""The torch routes' batched decode: every single-token sequence of a step in one call per layer.

Per-sequence SDPA costs a Python round trip and a kernel launch per sequence per layer
(960 calls per step for 32 sequences x 30 layers). Decode rows instead gather their
context block by block (contiguous ``block_size`` runs, not token by token) into one
padded batch; the grouped query heads of each KV head play the role of the query
length, so no K/V head is ever expanded or copied per group.

Cascade attention: when the decoding sequences share leading blocks (a common system
prompt served from the prefix cache), those blocks are gathered and attended ONCE for all
queries (one matmul with S x group rows), the per-sequence remainder separately, and the
two partial softmaxes are merged exactly through their max and sum (log-sum-exp).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvcli.model.attention.shared_prefix import decode_seqs, shared_block_groups


@dataclass(slots=True)
class DecodeBatch:
    seqs: list[int]  # sequence indices (into the step's batch) that decode one token
    rows: torch.Tensor  # [S] int64: their rows in the packed batch
    prefix_ids: torch.Tensor | None  # [P] int64: blocks every sequence starts with (cascade)
    block_ids: torch.Tensor  # [S * max_blocks] int64: the rest of each table, padded with block 0
    max_blocks: int
    valid: torch.Tensor  # [S, 1, 1, max_blocks * block_size] bool: real (not padding) keys


def build_decode_batches(
    block_tables: list[list[int]],
    seq_lens: list[int],
    query_start_loc: list[int],
    block_size: int,
    device: torch.device | str,
) -> list[DecodeBatch]:
    """The step's decode sequences, grouped by their first block so that each group sharing a
    cached prefix gets a cascade; the rest form one plain batch. Empty when fewer than two
    sequences decode (the per-sequence path is as fast then)."""
    seqs = decode_seqs(seq_lens, query_start_loc)
    if len(seqs) < 2:
        return []
    # Only full blocks can be common: cap at each context's full blocks.
    groups = shared_block_groups(seqs, block_tables, [seq_lens[s] // block_size for s in seqs])
    batches = [_make_batch(members, block_tables, seq_lens, query_start_loc, block_size, device,
                           common) for members, common in groups]
    grouped = {s for members, _ in groups for s in members}
    rest = [s for s in seqs if s not in grouped]
    if rest:
        batches.append(_make_batch(rest, block_tables, seq_lens, query_start_loc, block_size,
                                   device, 0))
    return batches


def _make_batch(
    seqs: list[int],
    block_tables: list[list[int]],
    seq_lens: list[int],
    query_start_loc: list[int],
    block_size: int,
    device: torch.device | str,
    common: int,  # leading blocks every sequence shares (0: no cascade)
) -> DecodeBatch:
    tables = [block_tables[s] for s in seqs]
    nblocks = [-(-seq_lens[s] // block_size) - common for s in seqs]
    max_blocks = max(nblocks)
    padded = [t[common:common + n] + [0] * (max_blocks - n)
              for t, n in zip(tables, nblocks, strict=True)]
    lens = torch.tensor([seq_lens[s] - common * block_size for s in seqs])
    positions = torch.arange(max_blocks * block_size)
    return DecodeBatch(
        seqs=seqs,
        rows=torch.tensor([query_start_loc[s] for s in seqs], device=device),
        prefix_ids=torch.tensor(tables[0][:common], device=device) if common else None,
        block_ids=torch.tensor(padded, dtype=torch.int64).reshape(-1).to(device),
        max_blocks=max_blocks,
        valid=(positions[None, :] < lens[:, None]).view(len(seqs), 1, 1, -1).to(device),
    )


def decode_attention(
    q: torch.Tensor,  # [S, H, D]
    kv_layer: torch.Tensor,  # [2, num_slots, Hkv, D]
    batch: DecodeBatch,
    block_size: int,
    scale: float,
) -> torch.Tensor:  # [S, H, D]
    num_seqs, num_heads, head_dim = q.shape
    kv_heads = kv_layer.shape[2]
    group = num_heads // kv_heads
    paged = kv_layer.view(2, -1, block_size, kv_heads, head_dim)
    ctx = batch.max_blocks * block_size
    # [S, Hkv, L, D] views of each sequence's own (non-shared) blocks.
    keys = paged[0].index_select(0, batch.block_ids).view(num_seqs, ctx, kv_heads, head_dim)
    values = paged[1].index_select(0, batch.block_ids).view(num_seqs, ctx, kv_heads, head_dim)
    keys, values = keys.transpose(1, 2), values.transpose(1, 2)
    qg = q.view(num_seqs, kv_heads, group, head_dim)
    if batch.prefix_ids is None:
        out = F.scaled_dot_product_attention(qg, keys, values, attn_mask=batch.valid, scale=scale)
        return out.reshape(num_seqs, num_heads, head_dim)
    # Own blocks: unnormalised partial softmax with its running max and sum.
    scores = torch.matmul(qg, keys.transpose(-1, -2)).mul_(scale)  # [S, Hkv, G, L]
    scores.masked_fill_(~batch.valid, float("-inf"))
    own_max = scores.amax(-1, keepdim=True)
    probs = torch.exp_(scores.sub_(own_max))
    own_sum = probs.sum(-1, keepdim=True)
    own_out = torch.matmul(probs, values)  # [S, Hkv, G, D]
    # Shared prefix: one gather and one matmul for all S x G query rows of each KV head.
    plen = batch.prefix_ids.numel() * block_size
    pk = paged[0].index_select(0, batch.prefix_ids).view(plen, kv_heads, head_dim)
    pv = paged[1].index_select(0, batch.prefix_ids).view(plen, kv_heads, head_dim)
    qp = qg.permute(1, 0, 2, 3).reshape(kv_heads, num_seqs * group, head_dim)
    pscores = torch.bmm(qp, pk.permute(1, 2, 0)).mul_(scale)  # [Hkv, S*G, P]
    pre_max = pscores.amax(-1, keepdim=True)
    pprobs = torch.exp_(pscores.sub_(pre_max))
    pre_sum = pprobs.sum(-1, keepdim=True)
    pre_out = torch.bmm(pprobs, pv.transpose(0, 1))  # [Hkv, S*G, D]

    def per_seq(t: torch.Tensor) -> torch.Tensor:  # [Hkv, S*G, X] -> [S, Hkv, G, X]
        return t.view(kv_heads, num_seqs, group, -1).permute(1, 0, 2, 3)

    pre_max, pre_sum, pre_out = per_seq(pre_max), per_seq(pre_sum), per_seq(pre_out)
    new_max = torch.maximum(own_max, pre_max)
    own_w, pre_w = torch.exp(own_max - new_max), torch.exp(pre_max - new_max)
    out = (own_out * own_w + pre_out * pre_w) / (own_sum * own_w + pre_sum * pre_w)
    return out.reshape(num_seqs, num_heads, head_dim)
