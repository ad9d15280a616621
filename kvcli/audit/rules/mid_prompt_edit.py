"""mid-prompt-edit: a request that should extend its conversation's previous request but
changes an earlier message (edited, dropped, summarized, reordered or inserted).

The previous request is the session's last one (session_id, prompt_cache_key, user,
metadata.session_id), or without a session key the last request that opened with
the same first non-system message, else the request it repeats the longest run of
consecutive messages of (at least two: a rewritten opening or a compacted history keeps
the later turns). Append-only is what the cache rewards.
"""

from __future__ import annotations

from kvcli.audit.excerpt import make_excerpt
from kvcli.audit.records import Finding
from kvcli.audit.rules.base import PromptView, Rule, prompt_name
from kvcli.audit.shapes import MessagePrint
from kvcli.audit.tokenizers import common_prefix_length

FIXES = {
    "edited": "Keep earlier messages and tool results exactly as they were sent; append a "
    "correction or a new message instead of rewriting history.",
    "dropped": "Don't slide a window over the history: truncate or compact rarely and in large "
    "steps (keep the result fixed for many turns), so most turns stay append-only.",
    "summarized": "Summarize rarely and keep each summary fixed once written; replacing messages "
    "with a new summary every turn recomputes everything after it.",
    "reordered": "Keep messages in the order they were first sent; append new ones at the end.",
    "inserted": "Append new context at the end of the conversation instead of inserting it "
    "before existing messages.",
}


def classify(old: list[MessagePrint], new: list[MessagePrint], k: int) -> str:
    """How new[k:] departs from old[k:]."""
    old_rest = [m.digest for m in old[k:]]
    new_rest = [m.digest for m in new[k:]]
    moved_old = old[k].digest in new_rest[1:]
    moved_new = k < len(new) and new[k].digest in old_rest[1:]
    if moved_old and moved_new:
        return "reordered"
    if moved_old:
        return "inserted"
    if moved_new:
        return "dropped"
    if k + 1 < len(new) and k + 1 < len(old) and new[k + 1].digest == old[k + 1].digest:
        return "edited"
    if k + 1 < len(new) and new[k + 1].digest in old_rest[2:]:
        return "summarized"
    return "edited"


class MidPromptEdit(Rule):
    id = "mid-prompt-edit"
    phase = "structure"
    summary = "a conversation's request rewrites an earlier message instead of appending"

    def check(self, view: PromptView) -> list[Finding]:
        shape = view.shape
        prev = self.ctx.conversations.previous(shape) if shape else None
        if shape is None or prev is None:
            return []
        old, new = prev.messages, shape.messages
        k = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a.digest != b.digest), None)
        if k is None or (k == len(old) - 1 and old[k].role == "user"):
            return []  # append-only, a shorter branch, or the last user turn re-sent edited
        how = classify(old, new, k)
        old_text = self.ctx.text_of(prev.index)
        old_msg = old_text[old[k].start : old[k].end]
        new_msg = view.text[new[k].start : new[k].end] if k < len(new) else ""
        offset = common_prefix_length(old_msg, new_msg)
        char = (new[k].start if k < len(new) else len(view.text)) + offset
        if k < len(new) and view.has_finding_at(new[k].start, new[k].end):
            return []  # explained by a more specific rule (e.g. a timestamp)
        # What append-only would have let the cache reuse: the rest of the previous request.
        stake = view.tokens_in(len(old_text) - old[k].start - offset)
        scope = f"session '{shape.session}'" if shape.session is not None else "the same conversation"
        overlap = self.ctx.conversations.overlap(shape)
        if overlap is not None:
            scope += (f": its messages[{overlap.new_start}:{overlap.new_start + overlap.length}] repeat "
                      f"messages[{overlap.old_start}:{overlap.old_start + overlap.length}] there")
        message = (
            f"messages[{k}] ({old[k].role}) was {how} since {prompt_name(self.ctx, prev.index)} "
            f"({scope}): the request is not append-only, so the ~{stake} tokens that followed there "
            f"in {prompt_name(self.ctx, prev.index)} cannot be reused"
        )
        excerpt = make_excerpt(view.text, char, old_text, old[k].start + offset, prev.index)
        return [view.finding(self.id, "error", char, message, FIXES[how], against=prev.index, stake=stake, excerpt=excerpt)]
