"""whitespace-drift: prompts that differ only in whitespace, line endings or Unicode normalization.

At a divergence, both texts are normalized from the start of the line (NFC, LF line
endings, no zero-width characters, NBSP as space, runs of blanks as one space, no
trailing blanks); if they then agree well past the divergence, the difference is
invisible and breaks the prefix for nothing.
"""

from __future__ import annotations

import re
import unicodedata

from kvcli.audit.records import Finding
from kvcli.audit.rules.base import PromptView, Rule, prompt_name
from kvcli.audit.tokenizers import common_prefix_length

WINDOW = 2000
AGREE = 32  # normalized characters that must agree past the divergence
_ZERO_WIDTH = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff"))
_BLANKS = re.compile(r"[ \t\u00a0]+")
_TRAILING = re.compile(r" +\n")
_BEFORE_NEWLINE = re.compile(r"[ \t]*\r?\n")

FIX = (
    "Normalize text the same way before every request: one line ending (\\n), "
    "unicodedata.normalize('NFC', text), no trailing whitespace or zero-width characters."
)


def normalize(text: str) -> str:
    text = unicodedata.normalize("NFC", text).translate(_ZERO_WIDTH)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _TRAILING.sub("\n", _BLANKS.sub(" ", text))


def describe(this: str, other: str, start: int) -> str:
    """Which invisible difference is at `start`."""
    a, b = this[start : start + 1], other[start : start + 1]
    pair = a + b
    if "\r" in pair:
        return "line endings (CRLF vs LF)"
    if any(ord(ch) in _ZERO_WIDTH for ch in pair):
        return "an invisible zero-width character"
    if "\u00a0" in pair:
        return "a non-breaking space"
    if "\t" in pair:
        return "tabs vs spaces"
    if a.isspace() or b.isspace():
        if _BEFORE_NEWLINE.match(this, start) or _BEFORE_NEWLINE.match(other, start):
            return "trailing whitespace"
        return "whitespace"
    return "Unicode normalization (NFC vs NFD)"


class WhitespaceDrift(Rule):
    id = "whitespace-drift"
    phase = "divergence"
    summary = "prompts that differ only in whitespace, line endings or Unicode normalization"

    def check(self, view: PromptView) -> list[Finding]:
        contrast = view.contrast()
        if contrast is None or contrast.this_ends_first or contrast.other_ends_first:
            return []
        this, other, start = contrast.this, contrast.other, contrast.start
        pair = this[start] + other[start]
        if pair.isascii() and not any(ch.isspace() for ch in pair):
            return []  # two different visible ASCII characters: a real change
        line = this.rfind("\n", 0, start) + 1
        if start - line > WINDOW:
            line = start - WINDOW
        head = len(normalize(this[line:start]))
        a, b = normalize(this[line : start + WINDOW]), normalize(other[line : start + WINDOW])
        agree = common_prefix_length(a, b)
        both_end = agree == len(a) == len(b)
        if agree - head < AGREE and not both_end:
            return []  # the texts still differ once normalized: a real change
        kind = describe(this, other, start)
        stake = view.tokens_in(agree - head)
        message = (
            f"differs from {prompt_name(self.ctx, contrast.against)} only by {kind} at char {start}: "
            f"the shared prefix ends at token {view.lcp} although the text reads the same "
            f"(~{stake} more tokens could be cached)"
        )
        excerpt = view.contrast_excerpt(contrast)
        return [view.finding(self.id, "error", start, message, FIX, against=contrast.against, stake=stake, excerpt=excerpt)]
