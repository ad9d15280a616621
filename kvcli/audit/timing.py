"""Time-aware provider replay: request times, cache lifetimes, and a cost estimate.

Providers expire cached prefixes by time, not only by room: OpenAI after a few minutes
of inactivity, Anthropic 5 minutes after the last read or write (1 hour on request).
When lines carry a time (`created`, `timestamp`, or `--time-field`), a block or breakpoint
not used within the profile's lifetime is a miss. Without times the replay assumes no
expiry, and says so. Prices are multipliers of the base input price, data with sources.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

TIME_FIELDS = ("created", "timestamp")

# OpenAI: "cached prefixes generally remain active for 5 to 10 minutes of inactivity, up to
# one hour during off-peak" (platform.openai.com/docs/guides/prompt-caching, 2025): the low
# end is what can be counted on. Anthropic: 5-minute default TTL, refreshed on each hit
# (docs.anthropic.com build-with-claude/prompt-caching, 2025); a breakpoint with "ttl": "1h"
# writes an entry that lives an hour (hits.LONG_TTL_S), billed at 2x.
LIFETIME_S = {"openai": 300.0, "anthropic": 300.0}

# (model id prefix, cached input price / input price), platform.openai.com/docs/pricing,
# copy of 2025-08: gpt-4o $2.50 -> $1.25, gpt-4.1 $2.00 -> $0.50, gpt-5 $1.25 -> $0.125.
OPENAI_READ = (("gpt-5", 0.1), ("gpt-4.1", 0.25), ("o3", 0.25), ("o4-mini", 0.25), ("gpt-4o", 0.5), ("o1", 0.5))
OPENAI_DEFAULT_READ = 0.5
# Anthropic (docs.anthropic.com/en/docs/about-claude/pricing, 2025): writes 1.25x (5-minute
# TTL) or 2x (1 hour), reads 0.1x the base input price, for every current model.
ANTHROPIC_WRITE, ANTHROPIC_READ = 1.25, 0.1
ANTHROPIC_WRITE_1H = 2.0
# OpenAI bills cache writes from the GPT-5.6 family on (1.25x; before it writes were free):
# developers.openai.com/api/docs/guides/prompt-caching, read 2026-12-02.
OPENAI_WRITE_PRICED, OPENAI_WRITE = ("gpt-5.6",), 1.25
PRICES_AS_OF = "2025-08"

# Base input price in US$ per million tokens, by model id prefix (the longest match wins); cached
# reads (and Anthropic's writes) are these times the multipliers above. OpenAI:
# platform.openai.com/docs/pricing; Anthropic: docs.anthropic.com/en/docs/about-claude/pricing;
# both copies of 2025-08 (PRICES_AS_OF). A model not in the table gets no dollar figure.
INPUT_USD_PER_MTOK: dict[str, tuple[tuple[str, float], ...]] = {
    "openai": (("gpt-5", 1.25), ("gpt-5-mini", 0.25), ("gpt-5-nano", 0.05), ("gpt-4.1", 2.00),
               ("gpt-4.1-mini", 0.40), ("gpt-4.1-nano", 0.10), ("gpt-4o", 2.50), ("gpt-4o-mini", 0.15),
               ("o3", 2.00), ("o4-mini", 1.10), ("o1", 15.00)),
    "anthropic": (("claude-opus-4", 15.00), ("claude-opus-4-1", 15.00), ("claude-sonnet-4", 3.00),
                  ("claude-3-7-sonnet", 3.00), ("claude-3-5-sonnet", 3.00), ("claude-3-5-haiku", 0.80),
                  ("claude-3-haiku", 0.25), ("claude-3-opus", 15.00)),
}  # fmt: skip


def input_price(profile: str, model: str | None, table: tuple[tuple[str, float], ...] = ()) -> float | None:
    """US$ per input token for `model` (from `table`, else the built-in one), None when not priced."""
    matches = [(len(p), usd) for p, usd in table or INPUT_USD_PER_MTOK.get(profile, ()) if model and model.startswith(p)]
    return max(matches)[1] / 1e6 if matches else None


class TimeFieldError(ValueError):
    """A time field that is neither Unix seconds nor ISO 8601; the message names the field."""


def _lookup(value: dict[str, Any], path: str) -> Any:
    for scope in (value, value.get("body"), value.get("params")):
        node: Any = scope
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            return node
    return None


def request_time(value: Any, field: str | None) -> float | None:
    """Seconds since the epoch from a line's time field (a top-level, body or params key)."""
    if not isinstance(value, dict):
        return None
    names = (field,) if field else TIME_FIELDS
    for name in names:
        raw = _lookup(value, name)
        if raw is None:
            continue
        if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
            raise TimeFieldError(f"{name}: expected Unix seconds or an ISO 8601 time, got {type(raw).__name__}")
        if isinstance(raw, str):
            try:
                return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
            except ValueError:
                raise TimeFieldError(f"{name}: expected Unix seconds or an ISO 8601 time, got {raw!r}") from None
        return raw / 1000.0 if raw > 1e11 else float(raw)  # milliseconds when it is that large
    return None


@dataclass(slots=True)
class Clock:
    """Last use of each block-tree node; a block unused for `ttl` seconds has expired."""

    ttl: float | None
    _last: array
    timed: int = 0
    untimed: int = 0
    expired_tokens: int = 0  # tokens an unexpiring cache would have served

    @classmethod
    def make(cls, ttl: float | None) -> Clock:
        return cls(ttl, array("d"))

    def live_blocks(self, nodes: Sequence[int], matched: int, now: float | None) -> int:
        """Leading matched blocks still alive (a chain's head is used whenever its tail is, so
        the last uses never increase along it: the first expired one ends the run)."""
        if self.ttl is None or now is None:
            return matched
        last, ttl = self._last, self.ttl
        return bisect_left(range(matched), True, key=lambda j: now - last[nodes[j]] > ttl)

    def touch(self, nodes: Sequence[int], now: float | None) -> None:
        if now is None:
            self.untimed += 1
            return
        self.timed += 1
        top = max(nodes, default=-1)
        if top >= len(self._last):
            self._last.extend([now] * (top + 1 - len(self._last)))
        for n in nodes:
            self._last[n] = now


@dataclass(slots=True)
class Cost:
    """Input cost relative to sending every prompt with no cache (1.0)."""

    profile: str
    tokens: int = 0
    units: float = 0.0  # in base input tokens
    usd_uncached: float = 0.0  # the priced requests' input at the table's prices, no cache
    usd_cached: float = 0.0  # the same with the cache's reads and writes
    unpriced: int = 0  # requests whose model the price table lacks
    models: set[str] = field(default_factory=set)  # the priced models seen
    prices: tuple[tuple[str, float], ...] = ()  # --provider-rules' table; () = INPUT_USD_PER_MTOK
    as_of: str = PRICES_AS_OF

    def add(self, model: str | None, tokens: int, cached: int, written: int = 0, written_long: int = 0) -> None:
        """`written_long`: of `written`, the tokens up to a 1-hour breakpoint (Anthropic: 2x)."""
        read, write = self.multipliers(model)
        long = ANTHROPIC_WRITE_1H if self.profile == "anthropic" else write
        units = (tokens - cached - written) + cached * read + (written - written_long) * write + written_long * long
        self.tokens += tokens
        self.units += units
        price = input_price(self.profile, model, self.prices)
        if price is None:
            self.unpriced += 1
            return
        self.models.add(str(model))
        self.usd_uncached += tokens * price
        self.usd_cached += units * price

    def multipliers(self, model: str | None) -> tuple[float, float]:
        if self.profile == "anthropic":
            return ANTHROPIC_READ, ANTHROPIC_WRITE
        matches = [(len(p), r) for p, r in OPENAI_READ if model and model.startswith(p)]
        write = OPENAI_WRITE if model and model.startswith(OPENAI_WRITE_PRICED) else 1.0
        return (max(matches)[1] if matches else OPENAI_DEFAULT_READ), write

    @property
    def relative(self) -> float:
        return self.units / self.tokens if self.tokens else 1.0
