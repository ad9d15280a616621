"""Every earlier prompt's tokens, merged into one tree of blocks, found by block hash.

Each node is one block of one or more prompts (a full block of `block_size`
tokens, or a prompt's trailing partial block). Two prompts reach the same node
exactly when their chain hashes (kvcli/hashing.py: salt, parent, tokens) agree,
so walking the tree by block content is the engine's hash lookup; each full
block's hash is computed once, with kvcli/hashing.py continuing the parent's
chain (as the engine's BlockHasher does), and kept on its node. The tree adds
what hashes cannot give: the first token where a prompt leaves the longest
earlier prefix, which earlier prompt that was, and that prompt's tokens back
(prompt texts are not kept: 100,000 prompts stream).

Memory is one node per distinct block (its tokens, owner, parent, first child),
so identical prefixes cost nothing extra; branching nodes also keep their
children sorted by token bytes, and the child sharing most tokens with a query
is a neighbour of its insertion point (binary search, no scan).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from kvcli.hashing import ROOT_SEED, hash_token_blocks

_Seq = TypeVar("_Seq", str, bytes)

_NONE = -1
TIE_SCAN = 32


def token_bytes(token_ids: Sequence[int]) -> bytes:
    """Little-endian uint32, as kvcli/hashing.py packs them (fixed width: byte LCP // 4 = token LCP)."""
    return array("I", token_ids).tobytes()


def common_prefix_length(a: _Seq, b: _Seq) -> int:
    """Length of the common prefix of two strings or byte strings, by bisection on C-level
    slice compares (no per-character Python loop)."""
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
    blocks: int  # leading full blocks seen before (their chain hashes are known)
    lcp: int  # tokens shared with the earlier prompt sharing the longest prefix
    against: int | None  # that prompt (the earliest of those tied, among those compared)
    node: int  # node of the last matched full block (a root when blocks == 0)
    hashes: list[bytes]  # the prompt's chain hashes: the matched ones, then the new ones
    nodes: list[int]  # nodes of the matched full blocks


class PrefixIndex:
    __slots__ = (
        "block_size", "_hash", "_tokens", "_owner", "_parent", "_first_child",
        "_branches", "_roots", "_leaf", "_tail_node", "_tail_len", "_recent",
    )  # fmt: skip
    RECENT = 512  # recent prompts kept as (salt, token bytes, full-block nodes) for hinted matches

    def __init__(self, block_size: int) -> None:
        if block_size < 1:
            raise ValueError("block_size: expected a positive integer")
        self.block_size = block_size
        self._hash: list[bytes] = []  # per node: its chain hash (b"" for roots and partial blocks)
        self._tokens: list[bytes] = []
        self._owner = array("q")
        self._parent = array("q")
        self._first_child = array("q")
        self._branches: dict[int, tuple[list[bytes], list[int]]] = {}
        self._roots: dict[str | None, int] = {}
        self._leaf = array("q")  # per prompt: node of its last full block (or its root)
        self._tail_node = array("q")  # per prompt: node holding its trailing partial block
        self._tail_len = array("q")  # per prompt: tokens of that node that are its own
        self._recent: OrderedDict[int, tuple[str | None, bytes, list[int]]] = OrderedDict()

    # ---- nodes ---------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def prompts(self) -> int:
        return len(self._leaf)

    def _new_node(self, tokens: bytes, owner: int, parent: int, block_hash: bytes = b"") -> int:
        node = len(self._tokens)
        self._hash.append(block_hash)
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
            return (common_prefix_length(self._tokens[child], query) // 4, child) if child != _NONE else (0, _NONE)
        keys, ids = branch
        pos = bisect_left(keys, query)
        best, best_child = 0, _NONE
        for j in (pos - 1, pos):
            if 0 <= j < len(keys):
                shared = common_prefix_length(keys[j], query) // 4
                if shared > best:
                    best, best_child = shared, ids[j]
        if best:
            best_child = self._earliest_tied(keys, ids, pos, best, query)
        return best, best_child

    def _earliest_tied(self, keys: list[bytes], ids: list[int], pos: int, shared: int, query: bytes) -> int:
        """Of the children sharing `shared` tokens with `query` (contiguous around `pos` in sorted
        order), the one whose owner came first; at most TIE_SCAN each way are looked at."""
        prefix = query[: 4 * shared]
        best = _NONE
        for step, j in ((-1, pos - 1), (1, pos)):
            for _ in range(TIE_SCAN):
                if not (0 <= j < len(keys)) or not keys[j].startswith(prefix):
                    break
                if best == _NONE or self._owner[ids[j]] < self._owner[best]:
                    best = ids[j]
                j += step
        return best

    # ---- queries -------------------------------------------------------------
    def _child_equal_to(self, node: int, block: bytes) -> int:
        """The child of `node` holding exactly `block`, or _NONE."""
        branch = self._branches.get(node)
        if branch is None:
            child = self._first_child[node]
            return child if child != _NONE and self._tokens[child] == block else _NONE
        keys, ids = branch
        pos = bisect_left(keys, block)
        return ids[pos] if pos < len(keys) and keys[pos] == block else _NONE

    def _jump(self, hint: int | None, raw: bytes, salt: str | None) -> list[int]:
        """Nodes of the leading full blocks shared with prompt `hint`, by one byte comparison
        (a conversation's previous turn usually shares almost everything)."""
        entry = self._recent.get(hint) if hint is not None else None
        if entry is None or entry[0] != salt:
            return []
        shared = common_prefix_length(entry[1], raw) // (4 * self.block_size)
        return entry[2][:shared]

    def match(self, token_ids: Sequence[int], raw: bytes, salt: str | None, hint: int | None = None) -> Match:
        """Where a prompt (its ids, and `raw`: the same as token_bytes) leaves every earlier prompt,
        and its chain hashes (new blocks hashed here, continuing the matched chain). `hint`: an
        earlier prompt likely to share a long prefix (only a shortcut: the result is the same)."""
        root = self._roots.get(salt, _NONE)
        width = 4 * self.block_size
        full = len(raw) // width
        nodes = self._jump(hint, raw, salt) if root != _NONE else []
        node, blocks = (nodes[-1] if nodes else root), len(nodes)
        if root != _NONE:
            tokens, first_child, branches = self._tokens, self._first_child, self._branches
            while blocks < full:  # hot loop: the common single-child case is inlined
                block = raw[blocks * width : (blocks + 1) * width]
                if node in branches:
                    child = self._child_equal_to(node, block)
                else:
                    child = first_child[node]
                    if child != _NONE and tokens[child] != block:
                        child = _NONE
                if child == _NONE:
                    break
                node, blocks = child, blocks + 1
                nodes.append(node)
        bs = self.block_size
        path = [self._hash[n] for n in nodes]
        parent = path[-1] if path else ROOT_SEED
        path += hash_token_blocks(token_ids[blocks * bs : full * bs], bs, salt, parent=parent, start_block=blocks)
        if node == _NONE:
            return Match(0, 0, None, _NONE, path, nodes)
        shared, child = self._best_child(node, raw[blocks * width : (blocks + 1) * width])
        lcp = blocks * bs + shared
        if lcp == 0:
            return Match(0, 0, None, node, path, nodes)
        against = self._owner[child] if shared else self._owner[node]
        return Match(blocks, lcp, against, node, path, nodes)

    def insert(self, prompt: int, raw: bytes, salt: str | None, match: Match) -> list[int]:
        """Add prompt number `prompt` (the next one) after `match` told where it leaves the tree;
        returns the nodes of its full blocks (the first match.blocks of them were there before)."""
        if prompt != len(self._leaf):
            raise ValueError(f"prompt: expected {len(self._leaf)}, got {prompt}")
        node = match.node if match.node != _NONE else self._root(salt)
        width = 4 * self.block_size
        hashes, nodes = match.hashes, list(match.nodes)
        new = len(hashes) - match.blocks
        if new:  # a fresh chain: consecutive node ids, each the only child of the one before
            first = len(self._tokens)
            self._tokens.extend(raw[j * width : (j + 1) * width] for j in range(match.blocks, len(hashes)))
            self._hash.extend(hashes[match.blocks :])
            self._owner.extend([prompt] * new)
            self._parent.append(node)
            self._parent.extend(range(first, first + new - 1))
            self._first_child.extend(range(first + 1, first + new))
            self._first_child.append(_NONE)
            self._attach(node, first)
            nodes.extend(range(first, first + new))
            node = first + new - 1
        self._leaf.append(node)
        self._recent[prompt] = (salt, raw, nodes)
        if len(self._recent) > self.RECENT:
            self._recent.popitem(last=False)
        tail = raw[len(hashes) * width :]
        shared, child = self._best_child(node, tail)
        if tail and shared * 4 < len(tail):
            child = self._new_node(tail, prompt, node)
            self._attach(node, child)
        self._tail_node.append(child if tail else _NONE)
        self._tail_len.append(len(tail) // 4)
        return nodes

    # ---- the whole tree (prefix groups, orderings: kvcli/audit/groups.py) -------
    def tree(self) -> tuple[array, array, array, list[bytes]]:
        """Per node its parent and owner (the first prompt through it), per prompt its last full
        block's node, and per node its chain hash (b"" for roots and partial blocks). Read only."""
        return self._parent, self._owner, self._leaf, self._hash

    def children(self, node: int) -> list[int]:
        """Children of `node` in token order (a depth-first walk visits prompts sorted by tokens)."""
        branch = self._branches.get(node)
        if branch is not None:
            return list(branch[1])
        child = self._first_child[node]
        return [child] if child != _NONE else []

    def roots(self) -> list[int]:
        return list(self._roots.values())

    def tail_tokens(self, prompt: int) -> int:
        return self._tail_len[prompt]

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
