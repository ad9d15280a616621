"""How many of a prompt's tokens a cache would reuse, per profile.

"blocks" (kvcli, openai): the longest run of leading full blocks whose chain hash
an earlier prompt produced, in input order against an unbounded cache. The engine
always computes at least one token, so a prompt that would be cached in full
loses its last full block (vLLM v1: the hit is capped at prompt length - 1).
A profile minimum (OpenAI: 1024) zeroes shorter hits.

"breakpoints" (anthropic): a request reads at its breakpoints only (blocks with
cache_control, else the last block: automatic caching), walking back at most 20
content blocks for a prefix an earlier request wrote; it writes at its
breakpoints when the prefix there is at least the model's minimum.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Container, Sequence
from dataclasses import dataclass, field

from kvcli.audit.prefix_index import token_bytes
from kvcli.hashing import DEFAULT_BLOCK_SIZE, hash_token_blocks

LONG_TTL_S = 3600.0  # Anthropic's cache_control {"ttl": "1h"}


def leading_hits(hashes: Sequence[bytes], seen: Container[bytes]) -> int:
    """Number of leading block hashes found in `seen` (the chain makes later ones miss anyway)."""
    count = 0
    for h in hashes:
        if h not in seen:
            break
        count += 1
    return count


def usable_blocks(matched: int, num_tokens: int, block_size: int, keep_last_token: bool) -> int:
    """Matched blocks the engine may reuse: never all of the prompt's tokens."""
    if keep_last_token:
        return max(0, min(matched, (num_tokens - 1) // block_size))
    return matched


def block_cached_tokens(matched: int, num_tokens: int, block_size: int, keep_last_token: bool, min_tokens: int) -> int:
    tokens = usable_blocks(matched, num_tokens, block_size, keep_last_token) * block_size
    return tokens if tokens >= min_tokens else 0


def radix_cached_tokens(shared: int, num_tokens: int, keep_last_token: bool, min_tokens: int) -> int:
    """A token-granular cache (SGLang's radix tree): the longest shared token prefix, less the
    last token when the whole prompt is shared."""
    tokens = min(shared, num_tokens - 1) if keep_last_token else shared
    return max(0, tokens) if tokens >= min_tokens else 0


def predict_cached_tokens(
    token_id_lists: Sequence[Sequence[int]],
    block_size: int = DEFAULT_BLOCK_SIZE,
    cache_salts: Sequence[str | None] | None = None,
) -> list[int]:
    """kvcli's prediction of each prompt's cached tokens, prompts run one after another.

    The same rule as the engine: hashes from kvcli/hashing.py, an unbounded cache,
    full blocks only, at least one token computed.
    """
    salts = list(cache_salts) if cache_salts is not None else [None] * len(token_id_lists)
    if len(salts) != len(token_id_lists):
        raise ValueError(f"cache_salts: expected {len(token_id_lists)} entries, got {len(salts)}")
    seen: set[bytes] = set()
    cached = []
    for ids, salt in zip(token_id_lists, salts, strict=True):
        hashes = hash_token_blocks(ids, block_size, salt)
        matched = leading_hits(hashes, seen)
        cached.append(usable_blocks(matched, len(ids), block_size, True) * block_size)
        seen.update(hashes)
    return cached


@dataclass(slots=True)
class BreakpointRead:
    cached: int  # tokens read at a breakpoint
    reachable: int  # longest prefix an earlier request wrote, ignoring the lookback limit
    breakpoints: int  # breakpoints this request has
    written: int = 0  # tokens past the read that this request wrote (billed as cache writes)
    written_long: int = 0  # of them, those up to a 1-hour breakpoint (Anthropic bills them 2x)
    marks: list[tuple[str, int]] = field(default_factory=list)  # explicit breakpoints: (segment label, token end)


class BreakpointCache:
    """Anthropic-style writes and reads at content-block boundaries; with request times, an
    entry lives `ttl` seconds after its last write or read."""

    __slots__ = ("lookback", "ttl", "_written", "unread", "read_at", "_label", "_long", "_pending", "shared_before")

    def __init__(self, lookback: int, ttl: float | None = None) -> None:
        self.lookback = lookback
        self.ttl = ttl
        self._written: dict[bytes, float | None] = {}  # prefix hash -> last write or read
        # Writes no later request has read yet: prefix hash -> (tokens billed as a write, where,
        # segment label, prompt). What is left at the end was paid for at the write price and never used.
        self.unread: dict[bytes, tuple[int, str, str, int]] = {}
        self.read_at: Counter[str] = Counter()  # segment label of the write a read found -> reads
        self._label: dict[bytes, str] = {}  # prefix hash -> the label of the breakpoint that wrote it
        self._long: set[bytes] = set()  # entries written by a 1-hour breakpoint (cache_control ttl "1h")
        # An unread write's prefix up to the part it marks -> those writes; when a later request has
        # that prefix too, the write is in `shared_before`: the marked part is what differs.
        self._pending: dict[bytes, list[bytes]] = {}
        self.shared_before: set[bytes] = set()

    @staticmethod
    def _prefix_hashes(ids: Sequence[int], ends: Sequence[int], salt: str | None) -> list[bytes]:
        h = hashlib.sha256(("salt:" + salt).encode() if salt else b"")
        hashes, start = [], 0
        for end in ends:
            h.update(token_bytes(ids[start:end]))
            hashes.append(h.copy().digest())
            start = end
        return hashes

    def _alive(self, h: bytes, now: float | None) -> bool:
        if h not in self._written:
            return False
        then = self._written[h]
        ttl = self.ttl if self.ttl is None or h not in self._long else max(self.ttl, LONG_TTL_S)
        return ttl is None or now is None or then is None or now - then <= ttl

    def step(
        self, ids: Sequence[int], ends: Sequence[int], marked: Sequence[int], salt: str | None, min_tokens: int,
        now: float | None = None, where: Sequence[str] = (), labels: Sequence[str] = (), prompt: int = -1,
        long: Container[int] = (),
    ) -> BreakpointRead:
        """Read then write for one request. `ends`: token end of each block; `marked`: breakpoint block
        indexes; `long`: those with a 1-hour TTL."""
        hashes = self._prefix_hashes(ids, ends, salt)
        for h in hashes:
            if h in self._pending:
                self.shared_before.update(self._pending.pop(h))
        cached = reachable = written = written_long = 0
        for b in marked:
            for j in range(b, max(-1, b - self.lookback), -1):
                if self._alive(hashes[j], now):
                    cached = max(cached, ends[j])
                    self._written[hashes[j]] = now  # a read refreshes the entry
                    self.unread.pop(hashes[j], None)
                    self.read_at[self._label.get(hashes[j], "")] += 1
                    break
        for j in range(len(ends) - 1, -1, -1):
            if self._alive(hashes[j], now):
                reachable = ends[j]
                break
        before = cached  # an earlier breakpoint's tokens are its own write, not this one's
        for b in marked:
            if ends[b] >= min_tokens:
                if not self._alive(hashes[b], now):
                    written = max(written, ends[b] - cached)
                    if b in long:
                        written_long = max(written_long, ends[b] - cached)
                    label = labels[b] if b < len(labels) else ""
                    self.unread[hashes[b]] = (max(0, ends[b] - before), where[b] if b < len(where) else "", label,
                                              prompt)
                    self._label[hashes[b]] = label
                    if label and b > 0:
                        self._pending.setdefault(hashes[b - 1], []).append(hashes[b])
                self._written[hashes[b]] = now
                if b in long:
                    self._long.add(hashes[b])
                before = max(before, ends[b])
        return BreakpointRead(cached, reachable, len(marked), written, written_long)
