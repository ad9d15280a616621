"""dynamic-tools: tools added, removed, edited or reordered between requests.

Compared with the previous request of the same session (or, without session keys,
the previous chat request of the stream). Tool definitions render first, so any
change there invalidates everything cached after it. Only changes of content or
order count here: the same definitions with their keys in another order are
unsorted-json's.
"""

from __future__ import annotations

from kvcli.audit.excerpt import make_excerpt
from kvcli.audit.records import Finding
from kvcli.audit.rules.base import PromptView, Rule, prompt_name
from kvcli.audit.shapes import ToolPrint
from kvcli.audit.tokenizers import common_prefix_length

FIX = (
    "Send one fixed tool list, in a fixed order, for the whole session (ideally for every "
    "session); narrow it per request with tool_choice / allowed_tools (OpenAI), logit masking, "
    "or Anthropic's defer_loading tool search instead of adding or removing definitions."
)


def describe_changes(old: list[ToolPrint], new: list[ToolPrint]) -> list[str]:
    old_by_name = {t.name: t for t in old}
    new_by_name = {t.name: t for t in new}
    changes = [f"'{t.name}' added" for t in new if t.name not in old_by_name]
    changes += [f"'{t.name}' removed" for t in old if t.name not in new_by_name]
    for tool in new:
        before = old_by_name.get(tool.name)
        if before is not None and before.canonical != tool.canonical:
            fields = sorted(k for k in set(before.fields) | set(tool.fields) if before.fields.get(k) != tool.fields.get(k))
            changes.append(f"'{tool.name}' edited ({', '.join(fields) or 'definition'})")
    common_old = [t.name for t in old if t.name in new_by_name]
    common_new = [t.name for t in new if t.name in old_by_name]
    if common_old != common_new:
        changes.append(f"reordered: {', '.join(common_old[:6])} -> {', '.join(common_new[:6])}")
    return changes


def first_change(old: list[ToolPrint], new: list[ToolPrint]) -> int:
    """Index of the first tool that is not what the previous request had at that place."""
    for j, (a, b) in enumerate(zip(old, new, strict=False)):
        if a.canonical != b.canonical:
            return j
    return min(len(old), len(new))


class DynamicTools(Rule):
    id = "dynamic-tools"
    phase = "structure"
    summary = "tools added, removed, edited or reordered between requests of a session or stream"

    def check(self, view: PromptView) -> list[Finding]:
        shape = view.shape
        prev = self.ctx.conversations.previous_tools(shape) if shape else None
        if shape is None or prev is None:
            return []
        if [t.canonical for t in prev.tools] == [t.canonical for t in shape.tools]:
            return []
        changes = describe_changes(prev.tools, shape.tools)
        j = first_change(prev.tools, shape.tools)
        char = shape.tools[j].start if j < len(shape.tools) else (shape.tools[-1].end if shape.tools else 0)
        span_end = shape.tools[-1].end if shape.tools else char + 1
        old_char = prev.tools[j].start if j < len(prev.tools) else (prev.tools[-1].end if prev.tools else 0)
        old_text = self.ctx.text_of(prev.index)
        same = common_prefix_length(view.text, old_text)
        if char <= same < span_end and old_char == char:  # where the two prompts really part
            char = old_char = same
        if view.has_finding_at(char, span_end):
            return []  # already explained (e.g. a timestamp in a tool description)
        scope = f"session '{shape.session}'" if shape.session is not None else "the previous request"
        stake = view.tokens_after(char)
        message = (
            f"tools differ from {prompt_name(self.ctx, prev.index)} ({scope}): {'; '.join(changes)}. "
            f"Tools come first, so everything from char {char} on (~{stake} tokens) misses the cache"
        )
        return [view.finding(self.id, "error", char, message, FIX, against=prev.index, stake=stake, excerpt=make_excerpt(view.text, char, old_text, old_char, prev.index))]
