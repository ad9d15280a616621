"""Each prompt's cached tokens under the profile's rule (hits.py), with provider lifetimes
(timing.py) when requests carry times, and the cost estimate for provider profiles."""

from __future__ import annotations

from array import array
from collections.abc import Container
from dataclasses import dataclass

from kvcli.audit.disk import with_disk
from kvcli.audit.hits import (
    BreakpointCache,
    BreakpointRead,
    block_cached_tokens,
    radix_cached_tokens,
)
from kvcli.audit.prefix_index import Match
from kvcli.audit.profiles import Profile
from kvcli.audit.records import RenderedPrompt
from kvcli.audit.slots import SlotCache
from kvcli.audit.timing import LIFETIME_S, PRICES_AS_OF, Clock, Cost


@dataclass(slots=True)
class HitCounter:
    profile: Profile
    clock: Clock
    breakpoints: BreakpointCache
    cost: Cost | None = None  # providers only: they bill cached tokens differently
    slots: SlotCache | None = None  # llamacpp
    disk: Container[bytes] | None = None  # --kv-cache-dir: block hashes already on disk

    @classmethod
    def make(cls, profile: Profile, ttl: float | None = None,
             disk: Container[bytes] | None = None) -> HitCounter:
        lifetime = ttl if ttl is not None else LIFETIME_S.get(profile.name)
        cost = None
        if profile.name in ("openai", "anthropic"):
            cost = Cost(profile.name, prices=profile.input_prices, as_of=profile.prices_as_of or PRICES_AS_OF)
        slots = SlotCache(profile.slots) if profile.hit_model == "slots" else None
        return cls(profile, Clock.make(lifetime), BreakpointCache(profile.lookback_blocks, lifetime), cost, slots,
                   disk)

    def cached(self, prompt: RenderedPrompt, ids: array, ends: list[int], match: Match,
               min_tokens: int) -> tuple[int, BreakpointRead | None]:
        profile, now = self.profile, prompt.request.time
        read = None
        if profile.hit_model == "blocks":
            bs, keep = profile.block_size, profile.keep_last_token
            live = self.clock.live_blocks(match.nodes, match.blocks, now)
            if live == match.blocks:  # the memory walk went to its end: it goes on on disk
                live = with_disk(live, match.hashes, self.disk)
            cached = block_cached_tokens(live, len(ids), bs, keep, min_tokens)
            self.clock.expired_tokens += block_cached_tokens(match.blocks, len(ids), bs, keep, min_tokens) - cached
        elif profile.hit_model == "tokens":
            cached = radix_cached_tokens(match.lcp, len(ids), profile.keep_last_token, min_tokens)
        elif profile.hit_model == "slots":
            shared = self.slots.step(ids.tobytes())  # the same per-token rule, on the slot's prefix
            cached = radix_cached_tokens(shared, len(ids), profile.keep_last_token, min_tokens)
        else:
            marked = [j for j, s in enumerate(prompt.segments) if s.cache_control]
            if not marked:  # automatic caching: the breakpoint sits on the last block before generation
                content = [j for j, s in enumerate(prompt.segments) if s.kind != "generation"]
                marked = content[-1:]
            where = [f"{prompt.request.source} {s.label}" for s in prompt.segments]
            read = self.breakpoints.step(ids, ends, marked, prompt.request.cache_salt, min_tokens, now, where)
            cached = read.cached
        if self.cost is not None:
            self.cost.add(prompt.request.model, len(ids), cached, read.written if read else 0)
        return cached, read

    def after(self, nodes: list[int], now: float | None) -> None:
        """The prompt ran: its blocks were used now."""
        self.clock.touch(nodes if self.profile.hit_model == "blocks" else [], now)
