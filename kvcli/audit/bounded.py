"""Bounded-cache replay: the prompts through the engine's own KV-cache manager at one size.

No second implementation of the cache: kvcli/engine/kv_cache.py's KVCacheManager (and its
BlockPool: the LRU free queue, tail-first freeing, unhashed blocks reused first, a hit
capped so one token is computed) runs the replay, on the prompts' chain hashes. The
manager only reads a few fields of a request, given here by `_Sequence`.

Scheduling assumed (what the prediction equals `kvcli generate` under): prompts are admitted
in input order, `concurrency` of them in flight, the oldest finishing before the next is
admitted (`--max-num-seqs N` admits in order; with N = 1 the run is deterministic). Output
tokens are not known, so a prompt is taken as finished after its prefill: its decode
blocks (a few per request in `generate`) are not modelled.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kvcli.engine.kv_cache import KVCacheManager
from kvcli.hashing import BlockHash


@dataclass(slots=True)
class _Sequence:
    """The fields of kvcli.engine.request.Request that KVCacheManager reads."""

    request_id: str
    num_tokens: int
    block_hashes: list[BlockHash]
    block_size: int
    num_computed_tokens: int = 0
    num_preemptions: int = 0
    reads_prefix_cache: bool = True  # the audit replays plain prompts


@dataclass(slots=True)
class BoundedReplay:
    num_blocks: int
    block_size: int
    concurrency: int = 1
    cached_tokens: int = 0
    tokens: int = 0
    too_large: int = 0  # prompts that need more blocks than the cache has (the engine refuses them)
    _manager: KVCacheManager = field(init=False)
    _running: deque[_Sequence] = field(default_factory=deque)
    _count: int = 0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency: expected an integer >= 1")
        self._manager = KVCacheManager(self.num_blocks, self.block_size)

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.tokens if self.tokens else 0.0

    def step(self, hashes: list[BlockHash], num_tokens: int, min_tokens: int = 0) -> int:
        """Admit one prompt (its chain hashes and length); its cached tokens at this size."""
        self.tokens += num_tokens
        seq = _Sequence(str(self._count), num_tokens, hashes, self.block_size)
        self._count += 1
        if -(-num_tokens // self.block_size) > self.num_blocks:
            self.too_large += 1
            return 0
        while len(self._running) >= self.concurrency:
            self._finish_oldest()
        manager = self._manager
        while True:
            hits, cached = manager.get_computed_blocks(seq)
            if manager.allocate_slots(seq, num_tokens - cached, hits) is not None:
                break
            self._finish_oldest()  # the pool is full of running prompts: one finishes first
        seq.num_computed_tokens = num_tokens  # prefilled
        self._running.append(seq)
        counted = cached if cached >= min_tokens else 0
        self.cached_tokens += counted
        return counted

    def _finish_oldest(self) -> None:
        self._manager.free(self._running.popleft())

    def finish(self) -> None:
        while self._running:
            self._finish_oldest()
