"""The time-aware replay (lifetimes, expiry) and the cost estimate, in text and JSON."""

from __future__ import annotations

from typing import Any

from kvcli.audit.counting import HitCounter
from kvcli.audit.style import Style
from kvcli.audit.timing import PRICES_AS_OF
from kvcli.numbers import percent

NO_TIMES = "no request carries a time (created, timestamp or --time-field): the replay assumes no expiry"


def shown(hits: HitCounter) -> bool:
    """Providers expire by time and bill cached tokens; an engine only when given --cache-ttl."""
    return hits.cost is not None or hits.clock.ttl is not None


def expiry_sentence(hits: HitCounter) -> str:
    clock = hits.clock
    if clock.ttl is None:
        return "no lifetime for this profile (an engine evicts by room: see --cache-size): no expiry"
    if not clock.timed:
        return NO_TIMES
    told = f"{clock.timed:,} of {clock.timed + clock.untimed:,} requests carry a time"
    return f"{told}; a cached prefix lives {clock.ttl:g} s after its last use (requests without a time never expire one)"


def cost_sentence(hits: HitCounter) -> str | None:
    cost = hits.cost
    if cost is None:
        return None
    return (f"input cost ≈ {percent(cost.relative)} of the same prompts uncached ({cost.profile} cache read/write price "
            f"multipliers, copy of {PRICES_AS_OF}; kvcli/audit/timing.py has the table and sources)")


def timing_lines(hits: HitCounter, style: Style) -> list[str]:
    if not shown(hits):
        return []
    lines = ["", style("── provider replay ", "bold") + "─" * 53, f"  {expiry_sentence(hits)}"]
    if hits.clock.expired_tokens:
        lines.append(f"  expiry: {hits.clock.expired_tokens:,} tokens an unexpiring cache would have served")
    cost = cost_sentence(hits)
    if cost:
        lines.append(f"  {cost}")
    return lines


def timing_dict(hits: HitCounter) -> dict[str, Any] | None:
    if not shown(hits):
        return None
    clock, cost = hits.clock, hits.cost
    return {
        "ttl_s": clock.ttl, "timed": clock.timed, "untimed": clock.untimed,
        "expired_tokens": clock.expired_tokens, "assumes": expiry_sentence(hits),
        "relative_input_cost": cost.relative if cost is not None else None,
        "cost": cost_sentence(hits), "prices_as_of": PRICES_AS_OF if cost is not None else None,
    }  # fmt: skip
