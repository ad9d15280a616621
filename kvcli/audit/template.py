"""Rendering with a model's own chat template (--model), as `kvcli generate` does.

The template decides the text; segments are then located by finding each
message's text in it, in order, so findings can still name "messages[3] tool".
Where a message's text cannot be found (a template that rewrites content), its
segment starts where the previous one ended.
"""

from __future__ import annotations

from typing import Any

from kvcli.audit.records import FieldError, PromptRequest, RenderedPrompt, Segment
from kvcli.audit.render import compact_key, render_part, scrub_surrogates
from kvcli.audit.tokenizers import AuditTokenizer
from kvcli.inputs import LineError


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


def _locate(text: str, messages: list[dict[str, Any]], has_tools: bool) -> tuple[list[Segment], list[tuple[str, int, int]]]:
    """Segments tiling the text, and each message's own span: from its content's start to its
    end, so a message reads the same whether it is the last one (followed by the generation
    prompt) or not (followed by the next message's header)."""
    spans: list[tuple[int, int]] = []
    cursor = 0
    for message in messages:
        content = _content(message)
        found = text.find(content, cursor) if content else -1
        start = found if found >= 0 else cursor
        cursor = start + len(content) if found >= 0 else cursor
        spans.append((start, cursor))
    segments: list[Segment] = []
    if spans and spans[0][0] > 0:
        kind = "tools" if has_tools else "system"
        segments.append(Segment("template header", kind, 0, spans[0][0]))
    for i, message in enumerate(messages):
        end = spans[i + 1][0] if i + 1 < len(spans) else max(cursor, spans[i][0])
        role = str(message["role"])
        kind = "system" if role in ("system", "developer") else "message"
        segments.append(Segment(f"messages[{i}] {role}", kind, spans[i][0], end, role=role, message=i))
    tail = segments[-1].end if segments else 0
    segments.append(Segment("generation prompt", "generation", tail, len(text)))
    roles = [(str(m["role"]), start, end) for m, (start, end) in zip(messages, spans, strict=True)]
    return segments, roles


def _token_ids_prompt(index: int, request: PromptRequest, tokenizer: AuditTokenizer) -> RenderedPrompt:
    """Token ids are hashed as given, as generate feeds them; the text is only for excerpts."""
    ids = request.token_ids or []
    text = scrub_surrogates(tokenizer.decode(ids))
    return RenderedPrompt(index, request, text, [Segment("prompt", "text", 0, len(text))], False,
                          token_ids=list(ids))


def render_with_template(index: int, request: PromptRequest, tokenizer: AuditTokenizer) -> RenderedPrompt:
    if request.token_ids is not None:
        return _token_ids_prompt(index, request, tokenizer)
    if not request.is_chat:
        text = scrub_surrogates(request.text or "")
        return RenderedPrompt(index, request, text, [Segment("prompt", "text", 0, len(text))], True)
    # An Anthropic top-level system becomes the first message; content as generate cleans it.
    try:
        messages = request.template_messages(render_part)
        kwargs = request.prompt.template_kwargs if request.prompt else None
        text = tokenizer.render_chat(messages, request.tools, kwargs)
        ignored = bool(request.tools) and text == tokenizer.render_chat(messages, None, kwargs)
    except LineError:
        raise
    except Exception as err:  # jinja raises many types, including raise_exception() from templates
        raise FieldError(f"chat template: {type(err).__name__}: {err}") from err
    if text is None:
        raise FieldError("chat template: the tokenizer has no chat template")
    text = scrub_surrogates(text)
    segments, spans = _locate(text, messages, bool(request.tools) and not ignored)
    keys = [hash(compact_key(m) or repr(m)) for m in messages]
    return RenderedPrompt(index, request, text, segments, False, spans, message_keys=keys,
                          tools_ignored=ignored)
