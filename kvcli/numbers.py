"""How kvcli writes numbers for people: one percent rule and one plural rule for every report.

``kvcli generate``'s summary and ``kvcli audit``'s report both print hit rates; with two
rules the same 1,792 of 1,837 tokens read 97.5% in one and 97.6% in the other. Ground floor:
imports nothing of kvcli.
"""

from __future__ import annotations

from fractions import Fraction
from math import floor


def percent(part: float, whole: float = 1) -> str:
    """``part / whole`` as a percentage with one decimal, rounded half up from the exact ratio
    (never from an already rounded fraction): ``percent(1792, 1837) == "97.6%"``; 0 of 0 is
    ``"0.0%"``."""
    if not whole:
        return "0.0%"
    tenths = floor(Fraction(part) * 1000 / Fraction(whole) + Fraction(1, 2))
    sign = "-" if tenths < 0 else ""
    whole_part, tenth = divmod(abs(tenths), 10)
    return f"{sign}{whole_part:,}.{tenth}%"


def plural(count: int, word: str, many: str | None = None) -> str:
    """``1 request``, ``2 requests``, ``0 requests`` (``many`` for irregular plurals)."""
    return f"{count:,} {word if count == 1 else (many or word + 's')}"
