"""Each prompt's cached tokens under the profile's rule (hits.py), with provider lifetimes
(timing.py) when requests carry times, and the cost estimate for provider profiles."""

from __future__ import annotations

from array import array
from collections.abc import Container
from dataclasses import dataclass
from typing import Any

from kvcli.audit.disk import with_disk
from kvcli.audit.hits import (
    BreakpointCache,
    BreakpointRead,
    block_cached_tokens,
    radix_cached_tokens,
)
from kvcli.audit.prefix_index import Match
from kvcli.audit.profiles import OPENAI_BREAKPOINT_TTL_S, Profile
from kvcli.audit.records import RenderedPrompt
from kvcli.audit.slots import SlotCache
from kvcli.audit.timing import LIFETIME_S, PRICES_AS_OF, Clock, Cost


def segment_token_ends(prompt: RenderedPrompt, ids: array, tokenizer: Any) -> list[int]:
    """Each segment's end in tokens of the whole prompt's ids: the most tokens whose text ends
    inside it (a token across a boundary counts with the segment after it)."""
    if hasattr(tokenizer, "token_ends"):  # tiktoken: one pass over the token lengths
        return tokenizer.token_ends(prompt.text, ids, [s.end for s in prompt.segments])
    char_offset = tokenizer.char_offset
    ends, low = [], 0
    for segment in prompt.segments:
        lo, hi = low, len(ids)
        while lo < hi:  # char_offset grows with k: the largest k whose text ends by segment.end
            mid = (lo + hi + 1) // 2
            if char_offset(prompt.text, ids, mid) <= segment.end:
                lo = mid
            else:
                hi = mid - 1
        ends.append(lo)
        low = lo
    return ends


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
        lookback = profile.lookback_blocks
        points_ttl = lifetime
        if profile.breakpoint_models:  # OpenAI's breakpoint models: no lookback limit, a 30 min TTL
            lookback, points_ttl = 1 << 30, ttl if ttl is not None else OPENAI_BREAKPOINT_TTL_S
        cost = None
        if profile.name in ("openai", "anthropic"):
            cost = Cost(profile.name, prices=profile.input_prices, as_of=profile.prices_as_of or PRICES_AS_OF)
        slots = SlotCache(profile.slots) if profile.hit_model == "slots" else None
        return cls(profile, Clock.make(lifetime), BreakpointCache(lookback, points_ttl), cost, slots, disk)

    def cached(self, prompt: RenderedPrompt, ids: array, ends: list[int], match: Match,
               min_tokens: int) -> tuple[int, BreakpointRead | None]:
        profile, now = self.profile, prompt.request.time
        read = None
        if profile.hit_model == "blocks" and profile.takes_breakpoints(prompt.request.model):
            read = self._openai_points(prompt, ids, ends, min_tokens)
            cached = read.cached
        elif profile.hit_model == "blocks":
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
            read = self._step(prompt, ids, ends, marked, min_tokens)
            read.marks = [(prompt.segments[j].label, ends[j]) for j in marked if prompt.segments[j].cache_control]
            cached = read.cached
        if self.cost is not None:
            self.cost.add(prompt.request.model, len(ids), cached, read.written if read else 0,
                          read.written_long if read else 0)
        return cached, read

    def _step(self, prompt: RenderedPrompt, ids: array, ends: list[int], marked: list[int],
              min_tokens: int) -> BreakpointRead:
        where = [f"{prompt.request.source} {s.label}" for s in prompt.segments]
        # Unread writes are grouped by the explicit breakpoint's place (the automatic one is no choice)
        labels = [s.label if s.cache_control or s.breakpoint else "" for s in prompt.segments]
        long = {j for j in marked if prompt.segments[j].long_ttl}
        return self.breakpoints.step(ids, ends, marked, prompt.request.cache_salt, min_tokens, prompt.request.time,
                                     where, labels, prompt.index, long)

    def _openai_points(self, prompt: RenderedPrompt, ids: array, ends: list[int], min_tokens: int) -> BreakpointRead:
        """gpt-5.6 and later: the latest explicit prompt_cache_breakpoints (3, with the implicit one at
        the newest user or tool message; 4 with prompt_cache_options.mode "explicit"), read with no
        lookback limit and never more than the prompt less its last token."""
        segments = prompt.segments
        explicit = [j for j, s in enumerate(segments) if s.breakpoint]
        implicit: list[int] = []
        if prompt.request.cache_mode != "explicit":
            newest = [j for j, s in enumerate(segments) if s.role in ("user", "tool")]
            content = [j for j, s in enumerate(segments) if s.kind != "generation"]
            implicit = (newest or content)[-1:]
        writes = self.profile.max_breakpoints - len(implicit)
        marked = sorted(set(explicit[-writes:] if writes > 0 else []) | set(implicit))
        read = self._step(prompt, ids, ends, marked, min_tokens)
        read.cached = min(read.cached, max(0, len(ids) - 1))  # the engine computes at least one token
        read.breakpoints = len(explicit)
        read.marks = [(segments[j].label, ends[j]) for j in explicit]
        return read

    def after(self, nodes: list[int], now: float | None) -> None:
        """The prompt ran: its blocks were used now."""
        self.clock.touch(nodes if self.profile.hit_model == "blocks" else [], now)
