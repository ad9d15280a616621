"""The step's prefill sequences for the native prefill attention kernel (native/prefill_attention.c).

Every sequence of a step that is not a single decode token (prompt chunks, a one-token prompt)
is listed once per step, for all layers: its rows in the packed batch and its context's flat
slots. The kernel reads keys and values where they lie in the paged cache, so the step gathers
no context (index_select), builds no masks, and needs no prefix-cascade grouping.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class PagedPrefill:
    seq_ids: list[int]  # the listed sequences' indices in the step
    slots: torch.Tensor  # int64: their context slots, concatenated
    seqs: torch.Tensor  # [S, 4] int64: first q row, q_len, context length, first slot index


def build_paged_prefill(context_slots: list[torch.Tensor], seq_lens: list[int],
                        query_start_loc: list[int], decode_seqs: list[int]) -> PagedPrefill | None:
    """The sequences not in ``decode_seqs``, or None when every sequence decodes."""
    skip = set(decode_seqs)
    ids = [s for s in range(len(seq_lens)) if s not in skip]
    if not ids:
        return None
    rows, start = [], 0
    for s in ids:
        rows.append((query_start_loc[s], query_start_loc[s + 1] - query_start_loc[s],
                     seq_lens[s], start))
        start += seq_lens[s]
    slots = torch.cat([context_slots[s] for s in ids]) if len(ids) > 1 else context_slots[ids[0]]
    return PagedPrefill(ids, slots.contiguous(), torch.tensor(rows, dtype=torch.int64))
