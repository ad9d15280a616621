"""The one rule for sharing a cached prefix, used by every backend that attends it once.

Requests with one system prompt hit the same cached blocks; a backend that reads those blocks
once for a whole group (the torch decode and prefill cascades, the native shared-prefix decode
kernel) groups its sequences with :func:`shared_block_groups`.
"""

from __future__ import annotations

#: Share a prefix only when it saves real work: at least this many common blocks.
MIN_CASCADE_BLOCKS = 4


def decode_seqs(seq_lens: list[int], query_start_loc: list[int]) -> list[int]:
    """Sequences computing exactly one token after a non-empty context."""
    return [s for s in range(len(seq_lens)) if query_start_loc[s + 1] - query_start_loc[s] == 1
            and seq_lens[s] > 1]


def common_prefix(tables: list[list[int]], limit: int) -> int:
    first = tables[0]
    n = 0
    while n < limit and all(t[n] == first[n] for t in tables):
        n += 1
    return n


def shared_block_groups(seqs: list[int], block_tables: list[list[int]],
                        limits: list[int]) -> list[tuple[list[int], int]]:
    """The sequences whose tables start with the same >= MIN_CASCADE_BLOCKS blocks, as
    (members, common blocks), groups of two or more only. ``limits[i]`` caps sequence
    ``seqs[i]``'s blocks that may count (whole, visible blocks)."""
    by_first: dict[int, list[tuple[int, int]]] = {}
    for s, limit in zip(seqs, limits, strict=True):
        by_first.setdefault(block_tables[s][0], []).append((s, limit))
    groups = []
    for entries in by_first.values():
        if len(entries) < 2:
            continue
        members = [s for s, _ in entries]
        common = common_prefix([block_tables[s] for s in members], min(lim for _, lim in entries))
        if common >= MIN_CASCADE_BLOCKS:
            groups.append((members, common))
    return groups
