"""The capacity curve: hit rate against cache size, every size in one pass over the prompts.

Replaying the engine's block pool once per size costs a pass per size (bounded.py does it
for the one size asked for). For the curve the same eviction order is computed once, as an
LRU stack of the distinct full blocks (Mattson's stack algorithm), because with prompts
run one after another the engine's pool (kvcli/engine/block_pool.py) is such a stack:

- a finished prompt frees its blocks tail first, so its block 0 is the most recent and a
  chain's head is never older than its tail (a later prompt that uses block j uses 0..j-1);
- free blocks are evicted from the least recently freed end, blocks without a hash (a
  partial last block) are reused before any cached one, and a running prompt's own hit
  blocks are pinned, so the pool always holds the H most recent distinct blocks, where
  H = min(H + newly hashed blocks, size - the prompt's unhashed blocks).

So a block is a hit at a size exactly when its stack depth is below that size's H, and
depth grows along a chain: the hits are the leading blocks above H. Depths come from one
stamp per block (the last prompt that used it) and a Fenwick tree of blocks per stamp.
One difference from bounded.py's exact replay remains: a prompt of a whole number of
blocks that is cached in full recomputes its last block without refreshing the cached copy
(the engine keeps one block per hash); the model refreshes it.
"""

from __future__ import annotations

import operator
from array import array
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvcli.audit.hits import usable_blocks

GRID_STEP = 2**0.5  # sizes in blocks: 16, 23, 32, 45, ... (a point per half power of two)
GRID_MIN = 16


class GrowingFenwick:
    """Prefix sums over a list that only grows at the end (one entry per prompt)."""

    __slots__ = ("_tree", "total")

    def __init__(self) -> None:
        self._tree = [0]  # 1-based
        self.total = 0

    def _prefix(self, n: int) -> int:
        s, tree = 0, self._tree
        while n > 0:
            s += tree[n]
            n -= n & -n
        return s

    def append(self, value: int) -> None:
        n = len(self._tree)
        self._tree.append(value + self._prefix(n - 1) - self._prefix(n - (n & -n)))
        self.total += value

    def add(self, i: int, delta: int) -> None:
        n, tree = len(self._tree), self._tree
        i += 1
        while i < n:
            tree[i] += delta
            i += i & -i
        self.total += delta

    def after(self, i: int) -> int:
        """Sum of the entries after entry i."""
        return self.total - self._prefix(i + 1)


Run = tuple[int, int, int]  # (depth of the run's first block, first block, end block)


@dataclass(slots=True)
class SizeState:
    blocks: int  # cache size
    held: int = 0  # H: distinct blocks the cache holds between prompts
    evicted: bool = False  # False while it has held every block and run every prompt (= unbounded)
    cached_tokens: int = 0
    refused: int = 0  # prompts larger than this cache (the engine refuses them)


def leading_above(runs: list[Run], limit: int, held: int) -> int:
    """Leading blocks (of the first `limit`) whose depth is below `held`."""
    for depth, start, end in runs:
        first_out = start + max(0, held - depth)
        if first_out < end:
            return min(first_out, limit)
    return limit


@dataclass(slots=True)
class StackModel:
    """Every grid size's cache through one replay of the prompts in the order given."""

    block_size: int
    extra: list[int] = field(default_factory=list)  # sizes off the grid to follow too (--cache-size)
    watch: int | None = None  # a size whose per-prompt cached tokens `observe` returns
    sizes: list[SizeState] = field(default_factory=list)
    _stamp: array = field(default_factory=lambda: array("q"))  # per index node: last prompt using it
    _per_prompt: GrowingFenwick = field(default_factory=GrowingFenwick)  # blocks last used per prompt
    prompts: int = 0
    tokens: int = 0
    largest_prompt: int = 0  # blocks: smaller caches cannot run every prompt

    def __post_init__(self) -> None:
        self.grow_grid(max([GRID_MIN, *self.extra]))
        grid = {s.blocks for s in self.sizes}
        self.sizes += [SizeState(b) for b in set(self.extra) - grid]
        if self.watch is not None and self.watch not in grid | set(self.extra):
            self.sizes.append(SizeState(self.watch))
        self.sizes.sort(key=lambda s: s.blocks)

    @property
    def distinct_blocks(self) -> int:
        return self._per_prompt.total

    def grow_grid(self, blocks: int) -> None:
        """Add grid sizes until the largest holds `blocks` (the unbounded end of the curve)."""
        size = self.sizes[-1].blocks if self.sizes else GRID_MIN
        while not self.sizes or self.sizes[-1].blocks < blocks:
            if self.sizes:
                size = max(size + 1, round(size * GRID_STEP))
            # A size added late never evicted before: it held every block so far.
            self.sizes.append(SizeState(size, self.distinct_blocks, False,
                                        self.sizes[-1].cached_tokens if self.sizes else 0))

    def _runs(self, nodes: Sequence[int], matched: int) -> list[Run]:
        """The matched blocks as runs of one stamp, with each run's depth in the stack."""
        stamps = [self._stamp[n] for n in nodes[:matched]]  # non-increasing along a chain
        runs, start = [], 0
        while start < matched:
            p = stamps[start]
            end = bisect_right(stamps, -p, lo=start, key=operator.neg)
            # Blocks of later prompts, then this run's own blocks before `start` in its stamp group.
            runs.append((self._per_prompt.after(p), start, end))
            start = end
        return runs

    def observe(self, nodes: Sequence[int], matched: int, num_tokens: int, min_tokens: int) -> int | None:
        """One prompt: `nodes` are its full blocks' index nodes, the first `matched` seen before.
        Returns its cached tokens at the `watch` size."""
        bs, full = self.block_size, len(nodes)
        usable = usable_blocks(matched, num_tokens, bs, keep_last_token=True)  # the engine's rule
        total_blocks = -(-num_tokens // bs)
        runs = self._runs(nodes, matched)
        # The largest size keeps room for every block and one prompt's partial blocks: it never
        # evicts, so a size added later starts as a copy of it.
        self.grow_grid(self.distinct_blocks + full - matched + total_blocks)
        self.largest_prompt = max(self.largest_prompt, total_blocks)
        last_fits = num_tokens % bs == 0 and matched == full and full > 0
        watched = None
        for size in self.sizes:
            hits = leading_above(runs, usable, size.held) if size.evicted else usable
            if total_blocks > size.blocks:  # the engine refuses a prompt larger than its pool
                size.evicted = True  # (no longer the unbounded cache)
                size.refused += 1
                watched = 0 if size.blocks == self.watch else watched
                continue
            dup = 1 if last_fits and hits == usable and leading_above(runs, full, size.held) == full else 0
            fresh = full - hits - dup
            unhashed = total_blocks - full + dup
            held = size.held + fresh
            if held > size.blocks - unhashed:
                held, size.evicted = size.blocks - unhashed, True
            size.held = held
            counted = hits * bs if hits * bs >= min_tokens else 0
            size.cached_tokens += counted
            watched = counted if size.blocks == self.watch else watched
        self._update(nodes, matched, runs)
        self.prompts += 1
        self.tokens += num_tokens
        return watched

    def _update(self, nodes: Sequence[int], matched: int, runs: list[Run]) -> None:
        prompt = self.prompts
        for _, start, end in runs:
            self._per_prompt.add(self._stamp[nodes[start]], start - end)
        self._per_prompt.append(len(nodes))
        stamp = self._stamp
        for n in nodes[:matched]:
            stamp[n] = prompt
        top = max(nodes[matched:], default=-1)
        if top >= len(stamp):
            stamp.extend([prompt] * (top + 1 - len(stamp)))
        for n in nodes[matched:]:
            stamp[n] = prompt
