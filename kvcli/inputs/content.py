"""Message content: its structure, and the one way both commands turn it into template input.

A chat template sees each message's ``content`` as one string: text parts are
joined with newlines (as vLLM does), and a ``null`` content (an assistant turn
that only calls tools) becomes ``""``, because transformers' templates read
``message.content`` unguarded. Tool-call ``arguments`` given as a JSON string
are parsed into an object, as vLLM does, since templates write them with
``tojson``. `generate` refuses non-text parts; the audit renders them as a
fingerprint (its own ``part_text``), so a changed image still shows.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kvcli.inputs.errors import LineError, show_value, type_name

#: How one content part becomes text: ``part_text(part, where)``.
PartText = Callable[[Any, str], str]


def check_content(content: Any, path: str) -> None:
    """Structure only: a string, null, or a list of part objects (bare strings allowed)."""
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise LineError(path, "expected a string, an array of content parts or null, got "
                        + type_name(content))
    for j, part in enumerate(content):
        if isinstance(part, str):
            continue  # some clients send bare strings as parts
        if not isinstance(part, dict):
            raise LineError(f"{path}[{j}]", f"expected a content part object, got {type_name(part)}")
        if part.get("type") == "text" and not isinstance(part.get("text"), str):
            raise LineError(f"{path}[{j}].text", f"expected a string, got {type_name(part.get('text'))}")


def text_part(part: Any, where: str) -> str:
    """The strict policy: only text parts (what the engine can feed a text model)."""
    if isinstance(part, str):
        return part
    if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
        return part["text"]
    kind = part.get("type") if isinstance(part, dict) else part
    raise LineError(where, f"only text parts are supported, got {show_value(kind)}")


def content_text(content: Any, where: str, part_text: PartText = text_part) -> str:
    """A message's content as the one string a chat template sees."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(part_text(part, f"{where}[{j}]") for j, part in enumerate(content))


def _template_call(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    if not isinstance(arguments, str):
        return call
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return call  # not JSON: the template gets the string as given
    if not isinstance(parsed, dict):
        return call
    return {**call, "function": {**function, "arguments": parsed}}


def template_message(message: dict[str, Any], where: str, part_text: PartText = text_part) -> dict[str, Any]:
    out = dict(message)
    out["content"] = content_text(message.get("content"), f"{where}.content", part_text)
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        out["tool_calls"] = [_template_call(call) for call in calls]
    return out


def template_messages(messages: list[dict[str, Any]], system: Any = None, *, source: str = "messages",
                      system_source: str = "system", part_text: PartText = text_part) -> list[dict[str, Any]]:
    """What a chat template renders: an Anthropic top-level ``system`` becomes the first message."""
    out = [template_message(m, f"{source}[{i}]", part_text) for i, m in enumerate(messages)]
    if system is not None:
        out.insert(0, {"role": "system", "content": content_text(system, system_source, part_text)})
    return out
