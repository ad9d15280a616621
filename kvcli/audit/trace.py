"""Hash-id traces (Mooncake, Alibaba Bailian): prefix reuse without text, through the audit's cache models.

A published prefix-reuse trace has no text: each line is `{"timestamp", "input_length",
"output_length", "hash_ids"}`, one id per block of the trace's block size (Mooncake's FAST'25
traces: 512 tokens; Bailian's: 16), equal ids where prompts share a block. The replay is the
one text prompts get: the ids become nodes of a block trie (a node is a block *after its
parent*, as the engine's chain hash makes it), and the nodes go through the same unbounded
count (hits.py), lifetimes (timing.Clock) and capacity models (capacity.CacheModels: the
LRU stack for every size, the engine's KV-cache manager for --concurrency) as the audit's.
Only full blocks are cacheable: the id of a prompt's partial last block is not a cached block.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

from kvcli.audit.capacity import CacheModels
from kvcli.audit.hits import block_cached_tokens
from kvcli.audit.profiles import Profile
from kvcli.audit.records import InputProblem
from kvcli.audit.timing import Clock, Cost

TRACE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
TIME_SCALE = {"ms": 1e-3, "s": 1.0}  # Mooncake: milliseconds since the first request


@dataclass(slots=True)
class TraceRequest:
    where: str
    input_length: int
    output_length: int
    hash_ids: list[int]
    time: float | None  # seconds


def _count(value: dict[str, Any], name: str, required: bool) -> int:
    raw = value.get(name)
    if raw is None and not required:
        return 0
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise ValueError(f"{name}: expected a non-negative integer, got {raw!r}")
    return raw


def parse_trace_line(value: Any, where: str, block_size: int, time_unit: str = "ms") -> TraceRequest | InputProblem:
    """One trace line, checked against the block size: a wrong --trace-block-size is an error per line."""
    if not isinstance(value, dict):
        return InputProblem(where, f"expected a trace object {{{', '.join(TRACE_FIELDS)}}}, got {type(value).__name__}")
    try:
        length = _count(value, "input_length", True)
        output = _count(value, "output_length", False)
        ids = value.get("hash_ids")
        if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
            raise ValueError("hash_ids: expected an array of integers")
        full, blocks = length // block_size, -(-length // block_size)
        if not full <= len(ids) <= blocks:
            want = f"{full}" if full == blocks else f"{full} or {blocks}"
            raise ValueError(f"hash_ids: {len(ids)} ids for input_length {length} at --trace-block-size "
                             f"{block_size} (expected {want}: is the block size the trace's?)")
        stamp = value.get("timestamp")
        if stamp is not None and (isinstance(stamp, bool) or not isinstance(stamp, (int, float))):
            raise ValueError(f"timestamp: expected a number ({time_unit} since the trace's start), got {stamp!r}")
    except ValueError as err:
        return InputProblem(where, str(err))
    time = None if stamp is None else float(stamp) * TIME_SCALE[time_unit]
    return TraceRequest(where, length, output, ids, time)


class HashIdIndex:
    """A trie of hash ids, a dense node number per (parent node, id): memory grows with distinct
    blocks. Traces number a block after its prefix, so an id nearly always has one parent; the
    first is kept in a plain dict and any other parent in a second one."""

    __slots__ = ("_first", "_other", "_parent")

    def __init__(self) -> None:
        self._first: dict[int, int] = {}  # id -> node, under the first parent it was seen with
        self._other: dict[tuple[int, int], int] = {}  # (parent, id) -> node otherwise
        self._parent = array("q")

    def __len__(self) -> int:
        return len(self._parent)

    def walk(self, ids: list[int]) -> tuple[list[int], int]:
        """The chain's nodes (new ones added) and how many leading ones existed before."""
        first, other, parents = self._first, self._other, self._parent
        nodes: list[int] = []
        parent, matched = -1, 0
        for hid in ids:
            node = first.get(hid)
            if node is None or parents[node] != parent:
                node = other.get((parent, hid))
            if node is None:
                break
            nodes.append(node)
            parent = node
            matched += 1
        for hid in ids[matched:]:
            node = len(parents)
            if hid in first:
                other[(parent, hid)] = node
            else:
                first[hid] = node
            parents.append(parent)
            nodes.append(node)
            parent = node
        return nodes, matched


@dataclass(slots=True)
class TraceReplay:
    """The trace through the audit's cache models, in file order."""

    profile: Profile
    models: CacheModels
    clock: Clock
    cost: Cost | None = None
    index: HashIdIndex = field(default_factory=HashIdIndex)
    requests: int = 0
    tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0  # unbounded (less what expired with a lifetime)
    first_time: float | None = None
    last_time: float | None = None
    out_of_order: int = 0  # lines earlier than the line before (replayed in file order anyway)

    def step(self, req: TraceRequest) -> int:
        """One request; its cached tokens in the unbounded (or expiring) cache."""
        bs, n = self.profile.block_size, req.input_length
        nodes, matched = self.index.walk(req.hash_ids[: n // bs])
        minimum = self.profile.min_tokens_for(None)
        keep = self.profile.keep_last_token
        live = self.clock.live_blocks(nodes, matched, req.time)
        cached = block_cached_tokens(live, n, bs, keep, minimum)
        self.clock.expired_tokens += block_cached_tokens(matched, n, bs, keep, minimum) - cached
        self.clock.touch(nodes, req.time)
        # The engine's manager (--concurrency) keys blocks by hash: a trie node is one chain prefix.
        hashes = [node.to_bytes(8, "little") for node in nodes] if self.models.replay is not None else []
        self.models.observe(nodes, matched, hashes, n, minimum)
        if self.cost is not None:
            self.cost.add(None, n, cached)
        self._count(req, cached)
        return cached

    def _count(self, req: TraceRequest, cached: int) -> None:
        self.requests += 1
        self.tokens += req.input_length
        self.output_tokens += req.output_length
        self.cached_tokens += cached
        if req.time is not None:
            if self.last_time is not None and req.time < self.last_time:
                self.out_of_order += 1
            self.first_time = req.time if self.first_time is None else min(self.first_time, req.time)
            self.last_time = req.time if self.last_time is None else max(self.last_time, req.time)

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.tokens if self.tokens else 0.0

    @property
    def span_s(self) -> float | None:
        if self.first_time is None or self.last_time is None:
            return None
        return self.last_time - self.first_time
