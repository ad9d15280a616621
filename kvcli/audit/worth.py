"""What the cache is worth: prefill tokens and time saved (--prefill-tok-s, else the rate
`kvcli bench --calibrate` stored for --model, CPU and dtype), dollars at the price
table (providers), and why the rest is computed: not shared, too short (a shared prefix below one
block), or the shared tail past a prompt's last full shared block."""

from __future__ import annotations

from array import array
from dataclasses import asdict, dataclass
from typing import Any

from kvcli.audit.counting import HitCounter
from kvcli.audit.records import PromptResult, RenderedPrompt
from kvcli.audit.style import Style, plural
from kvcli.calibration import Calibration
from kvcli.numbers import percent

TIME_MODEL = ("prefill time taken as linear in the tokens computed, at the rate given; attention's "
              "quadratic part, batching and decode are not in it")


@dataclass(slots=True)
class ShareCounter:
    """An auditor observer: each prompt's longest prefix shared with an earlier one, by kind."""

    block_size: int
    minimum: int  # the profile's shortest cacheable prefix: one block, or a provider's minimum
    unshared: int = 0  # prompts no earlier prompt shares even a first token with
    too_short: int = 0  # prompts sharing fewer tokens than the minimum: nothing the cache can reuse
    too_short_tokens: int = 0
    tail_tokens: int = 0  # shared tokens past the last full shared block (recomputed)

    def __call__(self, prompt: RenderedPrompt, ids: array, hashes: list[bytes], result: PromptResult) -> None:
        shared = result.divergence.token if result.divergence is not None else 0
        if shared == 0:
            self.unshared += 1
        elif shared < self.minimum:
            self.too_short += 1
            self.too_short_tokens += shared
        else:
            self.tail_tokens += shared % self.block_size


@dataclass(slots=True)
class Worth:
    tokens: int
    cached: int  # unbounded (expiring) cache
    bounded: int | None  # at --cache-size
    rate: float | None  # --prefill-tok-s
    shares: ShareCounter | None
    hits: HitCounter | None = None  # its Cost, for providers
    calibration: Calibration | None = None  # the stored rate `rate` came from (no --prefill-tok-s)
    model: str | None = None  # --model, for the calibration hint
    dtype: str = "float32"

    def seconds(self, tokens: int) -> float | None:
        return tokens / self.rate if self.rate else None


def worth_lines(w: Worth, style: Style) -> list[str]:
    lines = ["", style("── worth ", "bold") + "─" * 63]
    for label, cached in (("unbounded cache", w.cached), ("at --cache-size", w.bounded)):
        if cached is None:
            continue
        saved = f"{cached:,} prefill tokens saved of {w.tokens:,} ({percent(cached, max(w.tokens, 1))})"
        t_all, t_with = w.seconds(w.tokens), w.seconds(w.tokens - cached)
        if t_all is not None and t_with is not None:
            saved += f"; ≈ {t_all:,.1f} s of prefill without a cache, {t_with:,.1f} s with it, {t_all - t_with:,.1f} s saved"
        lines.append(f"  {label}: {saved}")
    note = rate_sentence(w)
    if note is not None:
        lines.append(style(f"  {note}", "dim"))
    cost = w.hits.cost if w.hits is not None else None
    if cost is not None:
        lines.append(f"  {dollars_sentence(cost)}")
    unread = unread_writes(w)
    if unread is not None and unread["writes"]:
        lines.append(f"  unread cache writes: {unread['writes']:,} breakpoint write(s), {unread['tokens']:,} tokens billed "
                     "at the write price, that no later request read (a breakpoint after per-request content, or "
                     f"the entry expired first); first: {'; '.join(unread['first'])}")
    s = w.shares
    if s is not None:
        least = f"one block, {s.block_size} tokens" if s.minimum <= s.block_size else f"the minimum, {s.minimum:,} tokens"
        lines.append(f"  not shared: {plural(s.unshared, 'prompt')} with not even a first token in common with an earlier one")
        lines.append(f"  too short: {plural(s.too_short, 'prompt')} with a shared prefix below the cacheable minimum "
                     f"({least}; {s.too_short_tokens:,} tokens in all): nothing the cache can reuse")
        lines.append(f"  shared tails: {s.tail_tokens:,} tokens shared past a prompt's last full shared block "
                     "(recomputed: the rest of that block differs)")
    return lines


def rate_sentence(w: Worth) -> str | None:
    """Where the prefill rate comes from, or how to get one (engines: a provider's is not ours)."""
    c = w.calibration
    if c is not None:
        load = f" at load {c.load_avg[0]:g}" if c.load_avg else ""
        return (f"an estimate, calibrated on {c.date} {c.cpu} ({c.prefill_tok_s:,g} prefill tokens/s{load}, "
                f"dtype {c.dtype}, kvcli bench --calibrate; --prefill-tok-s overrides): {TIME_MODEL}")
    if w.rate:
        return f"an estimate at --prefill-tok-s {w.rate:,g}: {TIME_MODEL}"
    if w.hits is not None and w.hits.cost is not None:
        return None
    model = w.model or "MODEL"
    dtype = f" --dtype {w.dtype}" if w.dtype != "float32" else ""
    return (f"no prefill time: give --prefill-tok-s RATE, or calibrate this machine once with "
            f"`kvcli bench --calibrate --model {model} --dtype {w.dtype}` (then `kvcli audit --model {model}{dtype}` "
            "uses the stored rate)")


def unread_writes(w: Worth) -> dict[str, Any] | None:
    """Anthropic, and OpenAI's breakpoint models: breakpoint writes that were never read."""
    if w.hits is None or not (w.hits.profile.hit_model == "breakpoints" or w.hits.profile.breakpoint_models):
        return None
    unread = list(w.hits.breakpoints.unread.values())
    return {"writes": len(unread), "tokens": sum(u[0] for u in unread), "first": [u[1] for u in unread[:3]]}


def dollars_sentence(cost: Any) -> str:
    if not cost.models:
        return (f"no request names a model in the price table ({cost.unpriced:,} unpriced): see "
                "kvcli/audit/timing.py INPUT_USD_PER_MTOK")
    saved = cost.usd_uncached - cost.usd_cached
    unpriced = f"; {cost.unpriced:,} request(s) of other models not priced" if cost.unpriced else ""
    return (f"input ≈ ${cost.usd_uncached:,.4f} without the cache, ${cost.usd_cached:,.4f} with it "
            f"(${saved:,.4f} saved) at {', '.join(sorted(cost.models))} list prices of {cost.as_of} "
            f"(kvcli/audit/timing.py, with sources){unpriced}")


def worth_dict(w: Worth) -> dict[str, Any]:
    cost = w.hits.cost if w.hits is not None else None
    s = w.shares
    out: dict[str, Any] = {
        "tokens": w.tokens, "saved_tokens": w.cached, "bounded_saved_tokens": w.bounded,
        "prefill_tok_s": w.rate, "time_model": TIME_MODEL if w.rate else None,
        "rate_source": "calibration" if w.calibration else "--prefill-tok-s" if w.rate else None,
        "calibration": None if w.calibration is None else asdict(w.calibration),
        "rate_note": rate_sentence(w),
        "prefill_s_uncached": w.seconds(w.tokens), "prefill_s_cached": w.seconds(w.tokens - w.cached),
        "prefill_s_bounded": w.seconds(w.tokens - w.bounded) if w.bounded is not None else None,
        "usd": None if cost is None else {"uncached": cost.usd_uncached, "cached": cost.usd_cached,
                                          "models": sorted(cost.models), "unpriced_requests": cost.unpriced,
                                          "prices_as_of": cost.as_of},
    }  # fmt: skip
    out["unread_writes"] = unread_writes(w)
    if s is not None:
        out["not_shared"] = s.unshared
        out["too_short"] = {"prompts": s.too_short, "tokens": s.too_short_tokens, "below_tokens": s.minimum}
        out["shared_tail_tokens"] = s.tail_tokens
    return out
