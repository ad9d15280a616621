"""The CPU float32 attention route through the native kernels, for every kind of row of a step.

Decode tokens go to the paged decode kernel (native/paged_attention.c), except those of
sequences sharing >= MIN_CASCADE_BLOCKS cached blocks (one system prompt): those go to the
many-row kernel (native/prefill_attention.c) group by group, which reads the shared prefix
once for all of them (a decode step at batch 32 otherwise reads every sequence's whole context
from memory: 693 MB a step on the shared-prefix bench workload, more than the weights).
Prefill chunks (and one-token prompts) go to the many-row kernel too. The rows are listed
once per step for all layers; nothing is gathered and no mask is built.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import ClassVar

import torch

from kvcli.model import native
from kvcli.model.attention.common import CommonAttentionMetadata, LayerAttention, write_kv
from kvcli.model.attention.shared_prefix import decode_seqs, shared_block_groups
from kvcli.model.platform import Platform


@dataclass(slots=True)
class PagedDecode:
    """Single-token sequences for the paged decode kernel, which reads K/V through the block
    tables itself: no gather, no padding copies."""

    seqs: list[int]
    rows: torch.Tensor  # [S] int64: their rows in the packed batch
    block_tables: torch.Tensor  # [S, max_blocks] int64, padded with block 0 (never read)
    seq_lens: torch.Tensor  # [S] int64


def build_paged_decode(
    block_tables: list[list[int]],
    seq_lens: list[int],
    query_start_loc: list[int],
    block_size: int,
    seqs: list[int] | None = None,
) -> PagedDecode | None:
    """The step's single-token sequences (or the given ones) for the native decode kernel."""
    seqs = decode_seqs(seq_lens, query_start_loc) if seqs is None else seqs
    if not seqs:
        return None
    nblocks = [-(-seq_lens[s] // block_size) for s in seqs]
    width = max(nblocks)
    padded = [block_tables[s][:n] + [0] * (width - n) for s, n in zip(seqs, nblocks, strict=True)]
    return PagedDecode(
        seqs=seqs,
        rows=torch.tensor([query_start_loc[s] for s in seqs]),
        block_tables=torch.tensor(padded, dtype=torch.int64),
        seq_lens=torch.tensor([seq_lens[s] for s in seqs], dtype=torch.int64),
    )


@dataclass(frozen=True, slots=True)
class PagedRows:
    """Sequences for the many-row kernel: prefill chunks, or decode tokens by shared prefix."""

    seq_ids: list[int]  # the listed sequences' indices in the step
    slots: torch.Tensor  # int64: their context slots, concatenated
    seqs: torch.Tensor  # [S, 4] int64: first q row, q_len, context length, first slot index
    groups: torch.Tensor | None = None  # decode: [G, 3] first listed seq, count, shared length
    rest: PagedDecode | None = None  # decode: the tokens of no group (the decode kernel's)


def _listed(ids: list[int], context_slots: list[torch.Tensor], seq_lens: list[int],
            query_start_loc: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    rows, start = [], 0
    for s in ids:
        rows.append((query_start_loc[s], query_start_loc[s + 1] - query_start_loc[s],
                     seq_lens[s], start))
        start += seq_lens[s]
    slots = torch.cat([context_slots[s] for s in ids]) if len(ids) > 1 else context_slots[ids[0]]
    return slots.contiguous(), torch.tensor(rows, dtype=torch.int64)


def build_paged_prefill(context_slots: list[torch.Tensor], seq_lens: list[int],
                        query_start_loc: list[int], decoding: list[int]) -> PagedRows | None:
    """The sequences not in ``decoding``, or None when every sequence decodes."""
    skip = set(decoding)
    ids = [s for s in range(len(seq_lens)) if s not in skip]
    if not ids:
        return None
    return PagedRows(ids, *_listed(ids, context_slots, seq_lens, query_start_loc))


def build_shared_decode(decode: PagedDecode | None, block_tables: list[list[int]],
                        context_slots: list[torch.Tensor], seq_lens: list[int],
                        query_start_loc: list[int], block_size: int) -> PagedRows | None:
    """The decode tokens grouped by the whole cached blocks their contexts start with (groups of
    two or more sharing >= MIN_CASCADE_BLOCKS), or None when no such group exists."""
    if decode is None or len(decode.seqs) < 2:
        return None
    ids: list[int] = []
    groups: list[tuple[int, int, int]] = []
    limits = [seq_lens[s] // block_size for s in decode.seqs]  # whole blocks only
    for members, common in shared_block_groups(decode.seqs, block_tables, limits):
        groups.append((len(ids), len(members), common * block_size))
        ids.extend(members)
    if not groups:
        return None
    grouped = set(ids)
    rest = [s for s in decode.seqs if s not in grouped]
    return PagedRows(ids, *_listed(ids, context_slots, seq_lens, query_start_loc),
                     groups=torch.tensor(groups, dtype=torch.int64),
                     rest=build_paged_decode(block_tables, seq_lens, query_start_loc, block_size,
                                             rest) if rest else None)


@dataclass(frozen=True, slots=True)
class NativeMetadata:
    common: CommonAttentionMetadata
    lib: ctypes.CDLL
    paged_decode: PagedDecode | None  # all single-token sequences
    paged_prefill: PagedRows | None  # every other sequence
    shared_decode: PagedRows | None  # decode tokens sharing a cached prefix

    def decode_kernels(self, window: int | None) -> tuple[PagedRows | None, PagedDecode | None]:
        """Which kernel reads which decode tokens: the shared-prefix groups (none under a
        window, which may hide the prefix) and the paged decode kernel's tokens (the rest).
        native_forward and the one-call decode step (model/native_step.py) both read it."""
        shared = self.shared_decode if window is None else None
        return shared, self.paged_decode if shared is None else shared.rest


class NativeCPUBackend:
    name: ClassVar[str] = "native-cpu"
    decode: ClassVar[str] = "native paged"
    prefill: ClassVar[str] = "native paged"

    def __init__(self, platform: Platform) -> None:
        self.lib = platform.native

    @classmethod
    def accepts(cls, platform: Platform, layers: list[LayerAttention]) -> bool:
        return platform.cpu and platform.kv_dtype == torch.float32 and platform.native is not None

    def build_metadata(self, common: CommonAttentionMetadata) -> NativeMetadata:
        c = common
        decode = build_paged_decode(c.block_tables, c.seq_lens, c.query_start_loc, c.block_size)
        prefill = build_paged_prefill(c.context_slots, c.seq_lens, c.query_start_loc,
                                      decode.seqs if decode is not None else [])
        shared = build_shared_decode(decode, c.block_tables, c.context_slots, c.seq_lens,
                                     c.query_start_loc, c.block_size)
        return NativeMetadata(common, self.lib, decode, prefill, shared)

    def layer(self, spec: LayerAttention) -> NativeImpl:
        return NativeImpl(spec.scale, spec.sliding_window)


class NativeImpl:
    """No gather, no masks: the kernels read K/V through the slots and tables in place."""

    def __init__(self, scale: float, sliding_window: int | None = None) -> None:
        self.scale = scale
        self.sliding_window = sliding_window

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_layer: torch.Tensor,
                meta: NativeMetadata) -> torch.Tensor:
        write_kv(kv_layer, meta.common, k, v)
        return native_forward(q, kv_layer, meta, self.sliding_window, self.scale)


def native_forward(q: torch.Tensor, kv_layer: torch.Tensor, meta: NativeMetadata,
                   window: int | None, scale: float) -> torch.Tensor:
    """Every row's attention for a step whose new K/V are already in ``kv_layer``."""
    lib, block_size = meta.lib, meta.common.block_size
    shared, decode = meta.decode_kernels(window)
    if shared is None and meta.paged_prefill is None and decode is not None:
        return _decode(lib, q, kv_layer, decode, block_size, window, scale)  # pure decode
    out = torch.empty(q.shape, dtype=q.dtype)  # q's rows are read where they lie
    if shared is not None:
        native.shared_decode_attention(lib, q, kv_layer, shared.slots, shared.seqs,
                                       shared.groups, out, scale)
    if decode is not None:
        out[decode.rows] = _decode(lib, q[decode.rows], kv_layer, decode, block_size,
                                   window, scale)
    if meta.paged_prefill is not None:
        pp = meta.paged_prefill
        native.paged_prefill_attention(lib, q, kv_layer, pp.slots, pp.seqs, out, window, scale)
    return out


def _decode(lib, q: torch.Tensor, kv_layer: torch.Tensor, decode: PagedDecode, block_size: int,
            window: int | None, scale: float) -> torch.Tensor:
    return native.paged_decode_attention(lib, q, kv_layer, decode.block_tables, decode.seq_lens,
                                         block_size, window, scale)
