"""Rendering with a model's own chat template (--model), as `kvcli generate` does.

The template decides the text; segments are then located by finding each
message's text in it, in order, so findings can still name "messages[3] tool".
Where a message's text cannot be found (a template that rewrites content), its
segment starts where the previous one ended.
"""

from __future__ import annotations

from typing import Any

from kvcli.audit.records import FieldError, PromptRequest, RenderedPrompt, Segment
from kvcli.audit.render import render_part, scrub_surrogates
from kvcli.audit.tokenizers import AuditTokenizer


def _probe(message: dict[str, Any]) -> str:
    """A piece of the message's text to look for in the rendered prompt."""
    content = message.get("content")
    if isinstance(content, list):
        content = next((render_part(p, "probe") for p in content if render_part(p, "probe")), "")
    return content[:200] if isinstance(content, str) else ""


def _locate(text: str, messages: list[dict[str, Any]], has_tools: bool) -> list[Segment]:
    starts: list[int] = []
    cursor = 0
    for message in messages:
        probe = _probe(message)
        found = text.find(probe, cursor) if probe else -1
        start = found if found >= 0 else cursor
        starts.append(start)
        cursor = start + len(probe) if found >= 0 else cursor
    segments: list[Segment] = []
    if starts and starts[0] > 0:
        kind = "tools" if has_tools else "system"
        segments.append(Segment("template header", kind, 0, starts[0]))
    for i, message in enumerate(messages):
        end = starts[i + 1] if i + 1 < len(starts) else max(cursor, starts[i])
        role = str(message["role"])
        kind = "system" if role in ("system", "developer") else "message"
        segments.append(Segment(f"messages[{i}] {role}", kind, starts[i], end, role=role, message=i))
    tail = segments[-1].end if segments else 0
    segments.append(Segment("generation prompt", "generation", tail, len(text)))
    return segments


def render_with_template(index: int, request: PromptRequest, tokenizer: AuditTokenizer) -> RenderedPrompt:
    if not request.is_chat:
        text = scrub_surrogates(request.text or "")
        return RenderedPrompt(index, request, text, [Segment("prompt", "text", 0, len(text))], True)
    messages = list(request.messages or [])
    if request.system is not None:  # an Anthropic top-level system becomes the first message
        messages.insert(0, {"role": "system", "content": request.system})
    try:
        text = tokenizer.render_chat(messages, request.tools)
    except Exception as err:  # jinja raises many types, including raise_exception() from templates
        raise FieldError(f"chat template: {type(err).__name__}: {err}") from err
    if text is None:
        raise FieldError("chat template: the tokenizer has no chat template")
    text = scrub_surrogates(text)
    segments = _locate(text, messages, bool(request.tools))
    spans = [(s.role or "?", s.start, s.end) for s in segments if s.message is not None]
    return RenderedPrompt(index, request, text, segments, False, spans)
