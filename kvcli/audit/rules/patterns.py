"""Values that change from request to request, as data: what they look like and how to fix them."""

from __future__ import annotations

import re
from dataclasses import dataclass

_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*\.?"
_DAY = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*\.?"

FIX_TIME = (
    "Move the {what} out of the cached prefix: put it in the last user message (or request "
    "metadata), or round it (e.g. to the day) so it stays the same across requests."
)
FIX_ID = (
    "Keep per-request ids out of the prompt prefix: send them as request metadata, a header or "
    "in your logs, or place them after the stable part of the prompt."
)
FIX_COUNTER = "Drop the counter from the prefix, or move it to the end of the prompt."


@dataclass(frozen=True, slots=True)
class VolatileKind:
    name: str
    label: str
    pattern: re.Pattern[str]
    fix: str
    latent: str | None  # severity when seen (not yet varying) in tools/system, None: not reported


KINDS: tuple[VolatileKind, ...] = (
    VolatileKind("timestamp", "timestamp", re.compile(
        r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"
        rf"|\b{_DAY},? \d{{1,2}} {_MONTH} \d{{4}} \d{{2}}:\d{{2}}(?::\d{{2}})?(?: [+-]\d{{4}}| GMT| UTC)?"
    ), FIX_TIME.format(what="timestamp"), "warning"),
    VolatileKind("uuid", "UUID", re.compile(
        r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
    ), FIX_ID, "warning"),
    VolatileKind("labelled-id", "request id", re.compile(
        r"(?i)\b(?:request|req|trace|span|correlation|run|nonce|conversation|call|message|msg)[_\- ]?id"
        r"\b[\"']?\s*[:=]\s*[\"']?[\w.\-]{4,}"
    ), FIX_ID, "warning"),
    VolatileKind("epoch", "Unix time", re.compile(r"\b1[5-9]\d{8}(?:\d{3})?\b"), FIX_TIME.format(what="Unix time"), "warning"),
    VolatileKind("date", "date", re.compile(
        rf"\b\d{{4}}-\d{{2}}-\d{{2}}\b|\b\d{{1,2}}/\d{{1,2}}/\d{{2,4}}\b"
        rf"|\b{_MONTH} \d{{1,2}}(?:st|nd|rd|th)?,? \d{{4}}\b|\b\d{{1,2}} {_MONTH} \d{{4}}\b"
        r"|\b(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday)\b"
    ), FIX_TIME.format(what="date"), "info"),
    VolatileKind("time", "time of day", re.compile(
        r"\b\d{1,2}:\d{2}(?::\d{2})?(?:\s?[AaPp]\.?[Mm]\.?)?(?![\d:])"
    ), FIX_TIME.format(what="time of day"), "warning"),
    VolatileKind("ulid", "ULID", re.compile(r"\b[0-7][0-9A-HJKMNP-TV-Z]{25}\b"), FIX_ID, "warning"),
    VolatileKind("hex-id", "hex id", re.compile(
        r"(?i)\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{16,}\b"
    ), FIX_ID, "info"),
    VolatileKind("nonce", "random token", re.compile(
        r"\b(?=[\w-]*[A-Z])(?=[\w-]*[a-z])(?=[\w-]*\d)[A-Za-z0-9_\-]{20,}={0,2}"
    ), FIX_ID, None),
    VolatileKind("counter", "counter", re.compile(
        r"(?i)\b(?:turn|step|iteration|attempt|retry|request|call|round|counter|count|seq(?:uence)?)"
        r"\s*(?:#|no\.?|number)?\s*[:=#]?\s*\d+\b"
    ), FIX_COUNTER, None),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class VolatileSpan:
    start: int
    end: int
    kind: VolatileKind


LATENT_KINDS = tuple(kind for kind in KINDS if kind.latent)


def spans_in(text: str, lo: int, hi: int, kinds: tuple[VolatileKind, ...] = KINDS) -> list[VolatileSpan]:
    """Volatile-looking values in text[lo:hi] (offsets into `text`); where two overlap, the
    earlier kind in KINDS wins (a timestamp is not also reported as a time of day)."""
    found: list[VolatileSpan] = []
    for kind in kinds:
        for m in kind.pattern.finditer(text, max(0, lo), min(len(text), hi)):
            if not any(s.start < m.end() and m.start() < s.end for s in found):
                found.append(VolatileSpan(m.start(), m.end(), kind))
    return sorted(found, key=lambda s: s.start)


def span_covering(text: str, char: int) -> VolatileSpan | None:
    """The value (most specific kind) that covers `char`."""
    for span in spans_in(text, char - 48, char + 64):  # values are short: a small window is enough
        if span.start <= char < span.end:
            return span
    return None
