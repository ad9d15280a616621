"""Prefix-cache counters of one KVCacheManager (torch-free; split out of kv_cache.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(slots=True)
class PrefixCacheStats:
    """Prefix-cache counters, in tokens except where named ``*_blocks``/``*requests``.

    Lookups of preempted requests are kept apart: they re-find their own blocks,
    which would otherwise inflate the hit rate (vLLM issue #25780).
    """

    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    evicted_blocks: int = 0
    peak_blocks_in_use: int = 0
    disk_hits: int = 0  # of ``hits``: tokens loaded from the disk cache (first-time lookups)

    def record(self, num_tokens: int, num_hit_tokens: int, preempted: bool, count: int = 1) -> None:
        """Add one lookup (``count=-1`` takes a recorded lookup back)."""
        if preempted:
            self.preempted_requests += count
            self.preempted_queries += count * num_tokens
            self.preempted_hits += count * num_hit_tokens
        else:
            self.requests += count
            self.queries += count * num_tokens
            self.hits += count * num_hit_tokens

    @property
    def hit_rate(self) -> float:
        """Fraction of first-time prompt tokens served from the cache."""
        return self.hits / self.queries if self.queries else 0.0

    def to_dict(self) -> dict[str, int | float]:
        return {**asdict(self), "hit_rate": self.hit_rate}
