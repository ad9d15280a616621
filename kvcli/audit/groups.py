"""Shared-prefix groups and cacheability, from the prefix index's tree after the stream.

A group is a prefix (a node of the block tree) shared by two or more prompts that cannot be
extended without losing one of them: some of its prompts end there or part ways. Its
saving is what its prompts after the first reuse of the blocks below the enclosing group
((prompts - 1) x those tokens), so nested groups never count a block twice and the
savings of all groups add up to the cacheable tokens: the tokens in full blocks that an
earlier prompt also has, whatever the order and the cache size (an upper bound on any hit
rate; the engine also computes each prompt's last token).
"""

from __future__ import annotations

import heapq
import sys
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field

from kvcli.audit.prefix_index import PrefixIndex
from kvcli.audit.records import Segment

TOP_GROUPS = 10
EXAMPLE_IDS = 3


@dataclass(slots=True)
class PrefixGroup:
    node: int
    tokens: int  # the prefix's length
    prompts: int  # prompts sharing it
    tokens_saved: int  # (prompts - 1) x its tokens below the enclosing group
    examples: list[int]  # some of its prompts (its first one first)
    owner: int  # the first prompt with this prefix
    char: int | None = None  # where the prefix ends in the owner's text
    segment: str | None = None  # and in which part of it


UPPER_BOUND = ("the tokens in full blocks that an earlier prompt of this input also has: an upper bound "
               "on the hit rate this input can reach from an empty cache, for any cache size and any order "
               "(each prompt still computes its last token); blocks already on --kv-cache-dir from earlier "
               "runs can add hits beyond it")
NOT_A_BOUND = ("the tokens in full blocks that an earlier prompt of this input also has; a token-granular "
               "cache (this profile) also reuses the shared part of a partial block, so it is not a bound here")


@dataclass(slots=True)
class GroupsReport:
    tokens: int
    cacheable_tokens: int
    groups: list[PrefixGroup] = field(default_factory=list)
    meaning: str = UPPER_BOUND  # NOT_A_BOUND for token-granular profiles

    @property
    def cacheability(self) -> float:
        return self.cacheable_tokens / self.tokens if self.tokens else 0.0


class SegmentStore:
    """Where each part of a prompt starts, for prompts that added blocks to the tree (a
    group's owner is such a prompt): labels interned, starts as 4-byte offsets."""

    __slots__ = ("_by_prompt",)

    def __init__(self) -> None:
        self._by_prompt: dict[int, tuple[array, tuple[str, ...]]] = {}

    def put(self, prompt: int, segments: list[Segment]) -> None:
        starts = array("I", (s.start for s in segments))
        self._by_prompt[prompt] = (starts, tuple(sys.intern(s.label) for s in segments))

    def label_at(self, prompt: int, char: int) -> str | None:
        entry = self._by_prompt.get(prompt)
        if entry is None:
            return None
        starts, labels = entry
        j = next((k for k in range(len(starts) - 1, -1, -1) if starts[k] <= char), None)
        return labels[j] if j is not None else None


def _counts(index: PrefixIndex) -> tuple[array, array]:
    """Prompts through each node, and the most through any one child (children have larger ids)."""
    parent, _, leaf, _ = index.tree()
    n = len(parent)
    through, widest_child = array("q", bytes(8 * n)), array("q", bytes(8 * n))
    for node in leaf:
        through[node] += 1
    for v in range(n - 1, -1, -1):
        p = parent[v]
        if p >= 0:
            c = through[v]
            through[p] += c
            if c > widest_child[p]:
                widest_child[p] = c
    return through, widest_child


def prefix_groups(index: PrefixIndex, total_tokens: int, top: int = TOP_GROUPS, block_hits: bool = True) -> GroupsReport:
    parent, owner, _, hashes = index.tree()
    bs, n = index.block_size, len(parent)
    through, widest_child = _counts(index)
    depth, enclosing = array("q", bytes(8 * n)), array("q", [-1]) * n
    cacheable, candidates = 0, []
    for v in range(n):  # parents first
        p = parent[v]
        if p < 0 or not hashes[v]:
            continue  # a root or a partial block
        depth[v] = depth[p] + 1
        parent_is_group = through[p] >= 2 and widest_child[p] < through[p] and bool(hashes[p])
        enclosing[v] = p if parent_is_group else enclosing[p]
        cacheable += (through[v] - 1) * bs
        if through[v] >= 2 and widest_child[v] < through[v]:
            below = depth[v] - (depth[enclosing[v]] if enclosing[v] >= 0 else 0)
            candidates.append(((through[v] - 1) * below * bs, v))
    report = GroupsReport(total_tokens, cacheable, meaning=UPPER_BOUND if block_hits else NOT_A_BOUND)
    for saved, v in heapq.nlargest(top, candidates):
        report.groups.append(PrefixGroup(v, depth[v] * bs, through[v], saved, [], owner[v]))
    _examples(index, report.groups)
    return report


def _examples(index: PrefixIndex, groups: list[PrefixGroup]) -> None:
    """A few prompts of each group: its owner, the owners of its branches, prompts ending there."""
    _, owner, leaf, _ = index.tree()
    by_node = {g.node: g for g in groups}
    ending: dict[int, list[int]] = {}
    for prompt, node in enumerate(leaf):
        if node in by_node and len(ending.setdefault(node, [])) < EXAMPLE_IDS:
            ending[node].append(prompt)
    for g in groups:
        found = {g.owner, *(owner[c] for c in index.children(g.node)), *ending.get(g.node, [])}
        g.examples = sorted(found)[:EXAMPLE_IDS]


def locate(report: GroupsReport, index: PrefixIndex, text_of: Callable[[int], str],
           char_offset: Callable[[str, list[int], int], int], segments: SegmentStore) -> None:
    """Fill each group's end: the character in its owner's text, and the part (message) it is in."""
    for g in report.groups:
        text = text_of(g.owner)
        g.char = char_offset(text, index.tokens_of(g.owner), g.tokens)
        g.segment = segments.label_at(g.owner, max(0, g.char - 1))  # the prefix's last character
