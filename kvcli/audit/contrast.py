"""A prompt set against the earlier prompt it shares the longest prefix with.

`start` is the first character where the two texts differ; `region` is the
smallest pair of differing spans after which the texts agree again for RESYNC
characters (a timestamp, a name, an extra space), or None when they do not
re-align nearby (the prompts simply say different things from there on).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcli.audit.tokenizers import common_prefix_length

RESYNC = 24  # characters that must agree again after a small difference
SEARCH = 64  # longest differing span looked at on either side


def find_resync(a: str, b: str, start: int, b_start: int | None = None) -> tuple[int, int] | None:
    """Smallest (x, y), by x + y, with a[start+x:][:RESYNC] == b[b_start+y:][:RESYNC] (or both ending)."""
    b_start = start if b_start is None else b_start
    window = a[start : start + SEARCH + RESYNC]
    best: tuple[int, int] | None = None
    for y in range(SEARCH + 1):
        if best is not None and y >= best[0] + best[1]:
            break
        anchor = b[b_start + y : b_start + y + RESYNC]
        if len(anchor) < RESYNC:  # b ends: the rest of a must be exactly what is left of b
            x = len(a) - start - len(anchor)
            if 0 <= x <= SEARCH and a.endswith(anchor) and (best is None or x + y < sum(best)):
                best = (x, y)
            break
        x = window.find(anchor)
        if x >= 0 and (best is None or x + y < sum(best)):
            best = (x, y)
    return best


@dataclass(slots=True)
class Contrast:
    this: str
    other: str
    against: int
    start: int
    region: tuple[int, int] | None

    @property
    def other_diff(self) -> str:
        return self.other[self.start : self.start + self.region[1]] if self.region else ""

    @property
    def this_ends_first(self) -> bool:
        """This prompt is a prefix of the other one (or equal)."""
        return self.start >= len(self.this)

    @property
    def other_ends_first(self) -> bool:
        """The other prompt ends where this one goes on: an append, not a change."""
        return self.start >= len(self.other)

    def shared_after_region(self) -> int:
        """Characters the two texts share after the differing region (before the next difference)."""
        if self.region is None:
            return 0
        x, y = self.region
        return common_prefix_length(self.this[self.start + x :], self.other[self.start + y :])


def first_difference(a: str, b: str, start: int = 0) -> int:
    """First index >= start where a and b differ (they agree before `start`), or the shorter length."""
    end = min(len(a), len(b))
    pos = min(start, end)
    step = 64
    while pos < end and a[pos : pos + step] == b[pos : pos + step]:
        pos += step
        step *= 2
    return min(end, pos + common_prefix_length(a[pos : pos + step], b[pos : pos + step]))


def build_contrast(this: str, other: str, against: int, hint: int = 0) -> Contrast:
    """`hint`: a character offset before which the texts are known to agree."""
    start = first_difference(this, other, hint if this[:hint] == other[:hint] else 0)
    region = None
    if start < len(this) and start < len(other):
        region = find_resync(this, other, start)
    return Contrast(this, other, against, start, region)
