"""A GenAI span's prompt as OpenAI chat messages and tools, whichever convention recorded it.

In order of preference: `gen_ai.input.messages` (semantic conventions v1.37+: role + parts) with
`gen_ai.system_instructions` in front and `gen_ai.tool.definitions` as the tools; the span events
of v1.28-1.36 (`gen_ai.system.message`, `gen_ai.user.message`, `gen_ai.assistant.message`,
`gen_ai.tool.message`, with `content`, `tool_calls`, `id` attributes; or `gen_ai.content.prompt`
with a `gen_ai.prompt` attribute); the `gen_ai.prompt` attribute itself (a JSON list of messages
or plain text) or OpenLLMetry's flattened `gen_ai.prompt.N.role` / `.content`. A part the audit
cannot render (an image, a file) is that span's error, never dropped silently.
"""

from __future__ import annotations

import json
import re
from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")
EVENT_ROLES = {f"gen_ai.{r}.message": r for r in ("system", "user", "assistant", "tool")}
# OpenLLMetry's gen_ai.prompt.N.role/content; OpenInference's llm.input_messages.N.message.role/content
FLAT = re.compile(r"(?:gen_ai\.prompt|llm\.input_messages)\.(\d+)\.(?:message\.)?(role|content)$")
TOOL_SCHEMA = re.compile(r"llm\.tools\.(\d+)\.tool\.json_schema$")  # OpenInference


class MessagesError(ValueError):
    """The span's prompt cannot be read as chat messages (the message names the attribute)."""


def any_value(value: Any) -> Any:
    """An OTLP AnyValue ({"stringValue": ...}, {"intValue": "12"}, arrays, key lists) as Python."""
    if not isinstance(value, dict) or len(value) != 1:
        return value
    kind, inner = next(iter(value.items()))
    if kind == "intValue":
        return int(inner) if isinstance(inner, (int, str)) and str(inner).lstrip("-").isdigit() else inner
    if kind == "arrayValue":
        return [any_value(v) for v in (inner or {}).get("values", [])]
    if kind == "kvlistValue":
        return attributes((inner or {}).get("values", []))
    if kind in ("stringValue", "doubleValue", "boolValue", "bytesValue"):
        return inner
    return value


def attributes(raw: Any) -> dict[str, Any]:
    """OTLP `[{"key", "value": AnyValue}]`, or a plain object, as a dict."""
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, list):
        return {}
    return {a["key"]: any_value(a.get("value")) for a in raw if isinstance(a, dict) and isinstance(a.get("key"), str)}


def _json(value: Any, where: str) -> Any:
    """Structured values come as they are; a JSON string (spans without structured attributes) parsed."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        raise MessagesError(f"{where}: expected JSON, got {value[:40]!r}") from None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _parts_message(role: str, parts: Any, where: str) -> dict[str, Any]:
    """One v1.37 message (role + parts) as a chat message."""
    if not isinstance(parts, list):
        raise MessagesError(f"{where}.parts: expected a list")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            texts.append(_text(part.get("content", "")))
        elif kind in ("tool_call", "function_call"):
            arguments = part.get("arguments")
            calls.append({"id": part.get("id") or f"call_{j}", "type": "function",
                          "function": {"name": part.get("name"), "arguments": _text(arguments or {})}})
        elif kind == "tool_call_response":
            return {"role": "tool", "tool_call_id": part.get("id") or "", "content": _text(part.get("response"))}
        else:
            raise MessagesError(f"{where}.parts[{j}]: part type {kind!r} not read (text, tool_call, "
                                "tool_call_response): the audit cannot count its tokens")
    message: dict[str, Any] = {"role": role if role in ROLES else "user"}
    message["content"] = texts[0] if len(texts) == 1 else [{"type": "text", "text": t} for t in texts] or None
    if calls:
        message["tool_calls"] = calls
    return message


def _input_messages(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    raw = _json(attrs["gen_ai.input.messages"], "gen_ai.input.messages")
    if not isinstance(raw, list):
        raise MessagesError("gen_ai.input.messages: expected a list of messages")
    out = []
    instructions = attrs.get("gen_ai.system_instructions")
    if instructions is not None:
        parts = _json(instructions, "gen_ai.system_instructions")
        out.append(_parts_message("system", parts if isinstance(parts, list) else
                                  [{"type": "text", "content": parts}], "gen_ai.system_instructions"))
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise MessagesError(f"gen_ai.input.messages[{i}]: expected an object with role and parts")
        out.append(_parts_message(str(m.get("role")), m.get("parts"), f"gen_ai.input.messages[{i}]"))
    return out


def _tools(attrs: dict[str, Any]) -> list[dict[str, Any]] | None:
    """`gen_ai.tool.definitions` ({type, name, description, parameters}) in chat's nested form;
    else OpenInference's `llm.tools.N.tool.json_schema`."""
    raw = attrs.get("gen_ai.tool.definitions")
    if raw is None:
        found = sorted((int(m.group(1)), v) for k, v in attrs.items() if (m := TOOL_SCHEMA.match(k)))
        if not found:
            return None
        raw = [_json(v, f"llm.tools.{i}.tool.json_schema") for i, v in found]
    tools = _json(raw, "gen_ai.tool.definitions")
    if not isinstance(tools, list):
        raise MessagesError("gen_ai.tool.definitions: expected a list")
    out = []
    for t in tools:
        if isinstance(t, dict) and "function" not in t:
            fn = {k: t[k] for k in ("name", "description", "parameters") if k in t}
            t = {"type": t.get("type", "function"), "function": fn}
        out.append(t)
    return out


def _legacy_message(role: str, attrs: dict[str, Any], where: str) -> dict[str, Any]:
    content = attrs.get("content")
    if isinstance(content, str) and content[:1] in "[{":
        try:
            content = json.loads(content)
        except ValueError:
            pass
    message: dict[str, Any] = {"role": str(attrs.get("role") or role), "content": content}
    if "tool_calls" in attrs:
        message["tool_calls"] = _json(attrs["tool_calls"], f"{where}.tool_calls")
    if role == "tool":
        message["tool_call_id"] = str(attrs.get("id") or "")
    return message


def _event_messages(events: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, event in enumerate(events if isinstance(events, list) else []):
        name = event.get("name") if isinstance(event, dict) else None
        attrs = attributes(event.get("attributes")) if isinstance(event, dict) else {}
        if name in EVENT_ROLES:
            out.append(_legacy_message(EVENT_ROLES[name], attrs, f"events[{i}] {name}"))
        elif name == "gen_ai.content.prompt" and "gen_ai.prompt" in attrs:
            out.extend(_prompt_attribute(attrs["gen_ai.prompt"]))
    return out


def _prompt_attribute(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str) and value[:1] == "[":
        value = _json(value, "gen_ai.prompt")
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not all(isinstance(m, dict) and "role" in m for m in value):
        raise MessagesError("gen_ai.prompt: expected text or a list of messages with role")
    return value


def _flat_messages(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    found: dict[int, dict[str, Any]] = {}
    for key, value in attrs.items():
        if (m := FLAT.match(key)) is not None:
            found.setdefault(int(m.group(1)), {})[m.group(2)] = value
    return [{"role": str(found[i].get("role") or "user"), "content": found[i].get("content", "")}
            for i in sorted(found)]


def span_messages(attrs: dict[str, Any], events: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) of one span; no messages when it recorded no prompt content."""
    tools = _tools(attrs)
    if "gen_ai.input.messages" in attrs:
        return _input_messages(attrs), tools
    messages = _event_messages(events)
    if not messages and "gen_ai.prompt" in attrs:
        messages = _prompt_attribute(attrs["gen_ai.prompt"])
    return messages or _flat_messages(attrs), tools
