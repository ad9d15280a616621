"""Two-line excerpts: each side's line around a position, aligned so one caret marks both."""

from __future__ import annotations

from kvcli.audit.records import Excerpt

WIDTH = 76
# One visible character per invisible one, so caret columns stay right.
_VISIBLE = str.maketrans(
    {"\n": "↵", "\r": "␍", "\t": "⇥", "\u00a0": "⍽", "\u200b": "¤", "\u200c": "¤",
     "\u200d": "¤", "\u2060": "¤", "\ufeff": "¤"}
)  # fmt: skip


def visible(text: str) -> str:
    return text.translate(_VISIBLE)


def _sides(text: str, char: int, left: int) -> tuple[str, str]:
    """(up to `left` characters before `char` on its line, the rest of the line from `char`)."""
    line_start = text.rfind("\n", 0, char) + 1
    before = text[max(line_start, char - left) : char]
    end = text.find("\n", char + 1)
    after = text[char : end if end >= 0 else len(text)]
    return before, after


def make_excerpt(
    this: str, char: int, other: str | None = None, other_char: int | None = None, against: int | None = None
) -> Excerpt:
    """`other_char` defaults to `char` (the texts agree before a divergence)."""
    other_char = char if other_char is None else other_char
    left = WIDTH // 2
    this_before, this_after = _sides(this, char, left)
    if other is None:
        line = visible(this_before + this_after)[:WIDTH]
        return Excerpt(line, None, len(this_before), against)
    other_before, other_after = _sides(other, other_char, left)
    caret = max(len(this_before), len(other_before))
    this_line = visible(this_before.rjust(caret) + this_after)[:WIDTH]
    other_line = visible(other_before.rjust(caret) + other_after)[:WIDTH]
    return Excerpt(this_line, other_line, caret, against)
