"""Ordering advice: the bounded cache's hit rate if the same prompts ran sorted by prefix.

`kvcli generate --scheduling cache-aware` orders its waiting requests by prompt tokens, so
prompts sharing a prefix run together and the prefix is still cached for the next one.
Sorting all prompts is the limit of that (a scheduler only sorts the requests waiting at
once). A depth-first walk of the prefix index's tree, children in token order, visits the
prompts in exactly that order, with each prompt's block path at hand, so the replay needs
nothing the audit did not keep; it runs through the same stack model as the capacity
curve (curve.py), one prompt at a time.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass

from kvcli.audit.capacity import CapacityReport
from kvcli.audit.curve import StackModel
from kvcli.audit.prefix_index import PrefixIndex


@dataclass(slots=True)
class OrderingAdvice:
    blocks: int  # the cache size compared at
    given_hit_rate: float
    sorted_hit_rate: float


def sorted_paths(index: PrefixIndex) -> Iterator[tuple[int, list[int]]]:
    """(prompt, nodes of its full blocks) in token order: a prompt before those it is a prefix of."""
    _, _, leaf, hashes = index.tree()
    ending: dict[int, list[int]] = {}
    for prompt, node in enumerate(leaf):
        ending.setdefault(node, []).append(prompt)
    for root in index.roots():
        path: list[int] = []
        stack: list[tuple[int, int]] = [(root, 0)]  # (node, its depth in blocks)
        while stack:
            node, depth = stack.pop()
            del path[depth:]
            if node != root:
                path.append(node)
            for prompt in ending.get(node, ()):
                yield prompt, path
            full = [c for c in index.children(node) if hashes[c]]
            stack.extend((c, len(path)) for c in reversed(full))


def replay_sorted(index: PrefixIndex, sizes: list[int], min_tokens: int) -> StackModel:
    """The stack model (with `sizes` among its sizes) fed the prompts in sorted order."""
    bs = index.block_size
    model = StackModel(bs, extra=sizes)
    seen = bytearray(len(index))
    for prompt, path in sorted_paths(index):
        # Seen nodes are a leading part of the path: a node is visited before its children.
        matched = bisect_left(path, 1, key=lambda n: 1 - seen[n])
        model.observe(path, matched, len(path) * bs + index.tail_tokens(prompt), min_tokens)
        for n in path[matched:]:
            seen[n] = 1
    return model


def advise(given: StackModel, index: PrefixIndex, blocks: int, min_tokens: int) -> OrderingAdvice:
    """Given order against sorted order at `blocks` (a size the given-order model follows)."""
    ordered = replay_sorted(index, [blocks], min_tokens)
    tokens = max(given.tokens, 1)
    rate = {s.blocks: s.cached_tokens / tokens for s in ordered.sizes}
    mine = next(s for s in given.sizes if s.blocks == blocks)
    return OrderingAdvice(blocks, mine.cached_tokens / tokens, rate[blocks])


def advice_size(capacity: CapacityReport) -> int | None:
    """The size to compare at: --cache-size's, else the elbow's (where a pool would be sized)."""
    if capacity.bounded is not None:
        return capacity.bounded.blocks
    return capacity.elbow.blocks if capacity.elbow is not None else None
