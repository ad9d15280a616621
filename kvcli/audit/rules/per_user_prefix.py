"""per-user-prefix: user-specific values (names, emails, account ids) inside the shared tools/system text.

At a divergence inside tools, schema or system text against a prompt of another
conversation, where the texts agree again right after a short difference: the
system prompt is a template filled per user, which forks the cache into one
copy per user instead of one shared prefix.
"""

from __future__ import annotations

import re

from kvcli.audit.records import Finding
from kvcli.audit.rules.base import PromptView, Rule, prompt_name

MAX_WORDS = 4
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+\.[\w.]+")
_PHONE = re.compile(r"\+?\d[\d ()-]{6,}\d")
_NUMBER = re.compile(r"[\w-]*\d[\w-]*")

FIX = (
    "Keep the tools and system prompt identical for every user; move per-user values (name, "
    "email, account, locale, preferences) to the end, e.g. into the first user message."
)


def _word_around(text: str, start: int, end: int) -> str:
    """The differing span widened to whole words, for the message."""
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] in "@._-"):
        start -= 1
    while end < len(text) and (text[end].isalnum() or text[end] in "@._-"):
        end += 1
    return text[start:end][:48]


def value_kind(value: str) -> str:
    if _EMAIL.search(value):
        return "email address"
    if _PHONE.fullmatch(value.strip()):
        return "phone number"
    if _NUMBER.fullmatch(value.strip()):
        return "id"
    return "value"


class PerUserPrefix(Rule):
    id = "per-user-prefix"
    phase = "divergence"
    summary = "per-user values inside the tools/system prefix that every user could share"

    def check(self, view: PromptView) -> list[Finding]:
        contrast = view.contrast()
        if contrast is None or contrast.region is None or not view.in_stable_segment(contrast.start):
            return []
        session = view.rendered.request.session
        if session is not None and session == self.ctx.session_of(contrast.against):
            return []  # same conversation: a change over time, not per-user data (mid-prompt-edit)
        x, y = contrast.region
        mine = _word_around(contrast.this, contrast.start, contrast.start + x)
        theirs = _word_around(contrast.other, contrast.start, contrast.start + y)
        if max(len(mine.split()), len(theirs.split())) > MAX_WORDS:
            return []  # a rewritten sentence, not a value filled into a template
        stake = view.tokens_in(x + contrast.shared_after_region())
        seg = view.rendered.segment_at(contrast.start)
        message = (
            f"{seg.label if seg else 'the prefix'} differs from {prompt_name(self.ctx, contrast.against)} "
            f"only in a per-user value ({value_kind(mine)}): '{mine}' vs '{theirs}'; each user gets a separate copy of "
            f"this prefix (~{stake} tokens that all users could share)"
        )
        excerpt = view.contrast_excerpt(contrast)
        return [view.finding(self.id, "warning", contrast.start, message, FIX, against=contrast.against, stake=stake, excerpt=excerpt)]
