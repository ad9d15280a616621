"""Every earlier prompt's tokens, merged into one tree of blocks, found by block hash.

Each node is one block of one or more prompts (a full block of `block_size`
tokens, or a prompt's trailing partial block). Full blocks are found through
their chain hash from kvcli/hashing.py, so "seen before" means exactly what it
means to the engine. The tree adds what hashes cannot give: the first token
where a prompt leaves the longest earlier prefix, which earlier prompt that was,
and that prompt's tokens back (prompt texts are not kept: 100,000 prompts stream).

Memory is one node per distinct block (its tokens, owner, parent, first child),
so identical prefixes cost nothing extra; branching nodes also keep their
children sorted by token bytes, and the child sharing most tokens with a query
is a neighbour of its insertion point (binary search, no scan).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

_NONE = -1


def token_bytes(token_ids: Sequence[int]) -> bytes:
    """Little-endian uint32, as kvcli/hashing.py packs them (fixed width: byte LCP // 4 = token LCP)."""
    return array("I", token_ids).tobytes()


def common_bytes(a: bytes, b: bytes) -> int:
    """Length of the common prefix of two byte strings (bisection on C-level compares)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(slots=True)
class Match:
    blocks: int  # leading full blocks whose hashes were seen before
    lcp: int  # tokens shared with the earlier prompt sharing the longest prefix
    against: int | None  # that prompt (the earliest of those tied, among those compared)
    node: int  # node of the last matched full block (a root when blocks == 0)


class PrefixIndex:
    __slots__ = (
        "block_size", "_by_hash", "_tokens", "_owner", "_parent", "_first_child",
        "_branches", "_roots", "_leaf", "_tail_node", "_tail_len",
    )  # fmt: skip

    def __init__(self, block_size: int) -> None:
        if block_size < 1:
            raise ValueError("block_size: expected a positive integer")
        self.block_size = block_size
        self._by_hash: dict[bytes, int] = {}
        self._tokens: list[bytes] = []
        self._owner = array("q")
        self._parent = array("q")
        self._first_child = array("q")
        self._branches: dict[int, tuple[list[bytes], list[int]]] = {}
        self._roots: dict[str | None, int] = {}
        self._leaf = array("q")  # per prompt: node of its last full block (or its root)
        self._tail_node = array("q")  # per prompt: node holding its trailing partial block
        self._tail_len = array("q")  # per prompt: tokens of that node that are its own

    # ---- nodes ---------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def prompts(self) -> int:
        return len(self._leaf)

    def _new_node(self, tokens: bytes, owner: int, parent: int) -> int:
        node = len(self._tokens)
        self._tokens.append(tokens)
        self._owner.append(owner)
        self._parent.append(parent)
        self._first_child.append(_NONE)
        return node

    def _root(self, salt: str | None) -> int:
        root = self._roots.get(salt)
        if root is None:
            root = self._roots[salt] = self._new_node(b"", _NONE, _NONE)
        return root

    def _attach(self, parent: int, child: int) -> None:
        first = self._first_child[parent]
        if first == _NONE:
            self._first_child[parent] = child
            return
        branch = self._branches.get(parent)
        if branch is None:
            branch = self._branches[parent] = ([self._tokens[first]], [first])
        keys, ids = branch
        pos = bisect_left(keys, self._tokens[child])
        keys.insert(pos, self._tokens[child])
        ids.insert(pos, child)

    def _best_child(self, node: int, query: bytes) -> tuple[int, int]:
        """(tokens shared, child) for the child of `node` sharing most leading tokens with `query`."""
        if not query:
            return 0, _NONE
        branch = self._branches.get(node)
        if branch is None:
            child = self._first_child[node]
            return (common_bytes(self._tokens[child], query) // 4, child) if child != _NONE else (0, _NONE)
        keys, ids = branch
        pos = bisect_left(keys, query)
        best, best_child = 0, _NONE
        for j in (pos - 1, pos):
            if 0 <= j < len(keys):
                shared = common_bytes(keys[j], query) // 4
                if shared > best or (shared == best > 0 and self._owner[ids[j]] < self._owner[best_child]):
                    best, best_child = shared, ids[j]
        return best, best_child

    # ---- queries -------------------------------------------------------------
    def match(self, raw: bytes, hashes: Sequence[bytes], salt: str | None) -> Match:
        """Where a prompt (token bytes `raw`, block hashes `hashes`) leaves every earlier prompt."""
        node, blocks = self._roots.get(salt, _NONE), 0
        by_hash = self._by_hash
        for h in hashes:
            found = by_hash.get(h)
            if found is None:
                break
            node, blocks = found, blocks + 1
        if node == _NONE:
            return Match(0, 0, None, _NONE)
        width = 4 * self.block_size
        shared, child = self._best_child(node, raw[blocks * width : (blocks + 1) * width])
        lcp = blocks * self.block_size + shared
        if lcp == 0:
            return Match(0, 0, None, node)
        against = self._owner[child] if shared else self._owner[node]
        return Match(blocks, lcp, against, node)

    def insert(self, prompt: int, raw: bytes, hashes: Sequence[bytes], salt: str | None, match: Match) -> None:
        """Add prompt number `prompt` (the next one) after `match` told where it leaves the tree."""
        if prompt != len(self._leaf):
            raise ValueError(f"prompt: expected {len(self._leaf)}, got {prompt}")
        node = match.node if match.node != _NONE else self._root(salt)
        width = 4 * self.block_size
        for j in range(match.blocks, len(hashes)):
            child = self._new_node(raw[j * width : (j + 1) * width], prompt, node)
            self._by_hash[hashes[j]] = child
            self._attach(node, child)
            node = child
        self._leaf.append(node)
        tail = raw[len(hashes) * width :]
        shared, child = self._best_child(node, tail)
        if tail and shared * 4 < len(tail):
            child = self._new_node(tail, prompt, node)
            self._attach(node, child)
        self._tail_node.append(child if tail else _NONE)
        self._tail_len.append(len(tail) // 4)

    def tokens_of(self, prompt: int) -> list[int]:
        """The token ids of an earlier prompt, rebuilt from its path in the tree."""
        pieces = []
        node = self._leaf[prompt]
        while node != _NONE:
            pieces.append(self._tokens[node])
            node = self._parent[node]
        pieces.reverse()
        tail = self._tail_node[prompt]
        if tail != _NONE:
            pieces.append(self._tokens[tail][: 4 * self._tail_len[prompt]])
        ids = array("I")
        ids.frombytes(b"".join(pieces))
        return ids.tolist()
