"""unstable-order: the same few-shot examples, retrieved chunks or list items in another order.

From the start of the paragraph (or line) where the prompts diverge, both sides
are cut into units; if the first K units of each are the same multiset in a
different order, the content is identical and only its order breaks the prefix.
Tools are left to dynamic-tools.
"""

from __future__ import annotations

from kvcli.audit.records import Finding
from kvcli.audit.rules.base import PromptView, Rule, prompt_name

WINDOW = 16_000
MAX_UNITS = 64

FIX = (
    "Order few-shot examples, retrieved chunks and listed items deterministically (sort by id, "
    "with a stable tie-break; never iterate a set or dict of unspecified order), or move the "
    "variable selection after the stable part of the prompt."
)


def _units(text: str, start: int, sep: str) -> list[str]:
    window = text[start : start + WINDOW]
    units = window.split(sep)
    if start + WINDOW < len(text):
        units.pop()  # cut by the window
    return units


def reordered_prefix(a: list[str], b: list[str]) -> int:
    """Smallest K >= 2 where a[:K] and b[:K] hold the same units in a different order (0: none)."""
    balance: dict[str, int] = {}
    unequal = 0
    for k, (x, y) in enumerate(zip(a[:MAX_UNITS], b[:MAX_UNITS], strict=False), start=1):
        for unit, step in ((x, 1), (y, -1)):
            before = balance.get(unit, 0)
            balance[unit] = before + step
            unequal += (balance[unit] != 0) - (before != 0)
        if unequal == 0:
            return k if k >= 2 and a[:k] != b[:k] else 0
    return 0


class UnstableOrder(Rule):
    id = "unstable-order"
    phase = "divergence"
    summary = "the same examples, chunks or items in a different order"

    def check(self, view: PromptView) -> list[Finding]:
        contrast = view.contrast()
        if contrast is None or contrast.this_ends_first or contrast.other_ends_first:
            return []
        seg = view.rendered.segment_at(contrast.start)
        if seg is not None and seg.kind == "tools":
            return []
        this, other, start = contrast.this, contrast.other, contrast.start
        lo, hi = (seg.start, seg.end) if seg is not None else (0, len(this))
        sep = "\n\n" if "\n\n" in this[max(lo, start - 4000) : min(hi, start + 4000)] else "\n"
        unit_start = this.rfind(sep, lo, start)
        # The first unit starts after the last separator, else at the start of the line
        # (not before the segment: its header is no example).
        unit_start = unit_start + len(sep) if unit_start >= 0 else this.rfind("\n", lo, start) + 1 or lo
        end = this.find(sep, start)
        first = this[unit_start : end if end >= 0 else len(this)]
        if len(first.strip()) < 8 or other.find(first, start) < 0:
            return []  # this prompt's unit is not somewhere later in the other prompt
        k = reordered_prefix(_units(this, unit_start, sep), _units(other, unit_start, sep))
        if not k:
            return []
        units = _units(this, unit_start, sep)[:k]
        span = sum(map(len, units)) + len(sep) * (k - 1)
        if unit_start + span > hi:
            return []  # units reach into the next message: a reordered conversation (mid-prompt-edit)
        stake = view.tokens_in(span)
        what = "paragraphs" if sep == "\n\n" else "lines"
        theirs = _units(other, unit_start, sep)[0]
        message = (
            f"{k} {what} from char {unit_start} hold the same text as in "
            f"{prompt_name(self.ctx, contrast.against)} in a different order (first here: "
            f"'{_short(first)}', first there: '{_short(theirs)}'); ~{stake} tokens could be shared"
        )
        excerpt = view.contrast_excerpt(contrast)
        return [view.finding(self.id, "error", start, message, FIX, against=contrast.against, stake=stake, excerpt=excerpt)]


def _short(text: str, limit: int = 40) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"
