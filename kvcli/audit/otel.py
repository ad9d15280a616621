"""OpenTelemetry GenAI spans as traffic: the request each span records, and its usage.

Read: OTLP JSON (`{"resourceSpans": [{"scopeSpans": [{"spans": [...]}]}]}`, a whole file or one
export per line, as the collector's file exporter writes it) and single span objects whose
`attributes` is an OTLP list or a plain object (the Python console exporter's). A span is a
GenAI request when it has a `gen_ai.*` prompt: the current conventions' `gen_ai.input.messages`
(+ `gen_ai.system_instructions`, `gen_ai.tool.definitions`), the older span events
(`gen_ai.system.message`, `gen_ai.user.message`, ..., `gen_ai.content.prompt`), or the
`gen_ai.prompt` attribute (a JSON list, or OpenLLMetry's `gen_ai.prompt.N.role/content`);
messages conversion is otel_messages.py. Names follow the semantic conventions of
opentelemetry.io/docs/specs/semconv/gen-ai (checked 2026-12-02), older names beside them, and
OpenInference's (`openinference.span.kind` LLM: `llm.input_messages.N.message.*`,
`llm.token_count.prompt_details.cache_read`, `llm.tools.N.tool.json_schema`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kvcli.audit.otel_messages import MessagesError, attributes, span_messages
from kvcli.audit.traffic import Actual

# The last of each: OpenInference's (Arize Phoenix) llm.* names, for spans without gen_ai.* ones.
INPUT = ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt")
# Cache reads: the current name (included in input_tokens), then older and vendor names.
CACHE_READ = ("gen_ai.usage.cache_read.input_tokens", "gen_ai.usage.cache_read_input_tokens",
              "gen_ai.usage.input_tokens.cached", "gen_ai.usage.cached_tokens",
              "gen_ai.usage.cached_input_tokens", "gen_ai.usage.cache_read_tokens",
              "llm.token_count.prompt_details.cache_read")
CACHE_WRITE = ("gen_ai.usage.cache_creation.input_tokens", "gen_ai.usage.cache_creation_input_tokens",
               "gen_ai.usage.cache_write.input_tokens", "gen_ai.usage.cache_write_tokens",
               "llm.token_count.prompt_details.cache_write")
MODEL = ("gen_ai.request.model", "gen_ai.response.model", "llm.model_name")


def is_llm_span(attrs: dict[str, Any]) -> bool:
    """GenAI semantic conventions (gen_ai.*), or an OpenInference LLM span."""
    return attrs.get("openinference.span.kind") == "LLM" or any(k.startswith("gen_ai.") for k in attrs)


def is_otel(value: Any) -> bool:
    """An OTLP export, or one span with GenAI attributes."""
    if isinstance(value, dict) and isinstance(value.get("resourceSpans"), list):
        return True
    return _is_span(value) and is_llm_span(attributes(value.get("attributes")))


def _is_span(value: Any) -> bool:
    return isinstance(value, dict) and "attributes" in value and ("spanId" in value or "context" in value
                                                                  or "span_id" in value)


def _spans(value: Any) -> Iterator[dict[str, Any]]:
    if not isinstance(value, dict) or "resourceSpans" not in value:
        yield value
        return
    found = []
    for resource in value["resourceSpans"] or []:
        for scope in (resource or {}).get("scopeSpans") or (resource or {}).get("instrumentationLibrarySpans") or []:
            found.extend(s for s in (scope or {}).get("spans") or [] if isinstance(s, dict))
    yield from sorted(found, key=_start_ns)  # one export is a batch: replay it in time order


def _start_ns(span: dict[str, Any]) -> int:
    raw = span.get("startTimeUnixNano")
    return int(raw) if isinstance(raw, (int, str)) and str(raw).isdigit() else 0


def _first_int(attrs: dict[str, Any], names: tuple[str, ...]) -> int | None:
    for name in names:
        value = attrs.get(name)
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def actual_of(attrs: dict[str, Any]) -> Actual | None:
    """The span's cached prompt tokens of its prompt tokens; None without usage. The conventions
    count cache reads and writes inside input_tokens; where input_tokens is smaller than they are,
    it was Anthropic's count without them, and they are added."""
    prompt, read, write = (_first_int(attrs, names) for names in (INPUT, CACHE_READ, CACHE_WRITE))
    if prompt is None and read is None:
        return None
    prompt, read = prompt or 0, read or 0
    if prompt < read + (write or 0):
        prompt += read + (write or 0)
    return Actual(read, prompt)


def _span_id(span: dict[str, Any]) -> str | None:
    context = span.get("context") if isinstance(span.get("context"), dict) else {}
    for value in (span.get("spanId"), span.get("span_id"), context.get("span_id")):
        if isinstance(value, str) and value:
            return value
    return None


def _time(span: dict[str, Any]) -> float | None:
    ns = _start_ns(span)
    if ns:
        return ns / 1e9
    start = span.get("start_time")  # the console exporter: ISO 8601
    return start if isinstance(start, str) else None  # type: ignore[return-value]


def otel_requests(value: Any, where: str) -> Iterator[tuple[str, dict[str, Any] | str, Actual | None]]:
    """(where, request body or a problem's message, usage) per GenAI span; other spans are skipped."""
    seen = 0
    for i, span in enumerate(_spans(value)):
        attrs = attributes(span.get("attributes"))
        if not is_llm_span(attrs):
            continue  # an HTTP or database span of the same trace
        seen += 1
        name = _span_id(span) or str(i)
        here = f"{where} span {name}"
        try:
            messages, tools = span_messages(attrs, span.get("events"))
        except MessagesError as err:
            yield here, str(err), None
            continue
        if not messages:
            yield here, ("GenAI span without prompt content (content capture is off by default: "
                         "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true records it)"), None
            continue
        request: dict[str, Any] = {"messages": messages, "id": attrs.get("gen_ai.response.id") or name}
        model = next((attrs[m] for m in MODEL if isinstance(attrs.get(m), str)), None)
        if model:
            request["model"] = model
        if tools:
            request["tools"] = tools
        if isinstance(attrs.get("gen_ai.conversation.id"), str):
            request["session_id"] = attrs["gen_ai.conversation.id"]  # the conversation rules' key
        if (t := _time(span)) is not None:
            request["created"] = t
        yield here, request, actual_of(attrs)
    if not seen:
        yield where, ("no GenAI spans (no gen_ai.* attributes, no OpenInference LLM span) in this "
                      "OpenTelemetry export"), None
