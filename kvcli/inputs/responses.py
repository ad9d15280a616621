"""OpenAI Responses API bodies ({"instructions", "input"}) as chat messages.

Instructions -> a system message, input items -> messages, function_call items
-> assistant tool calls, function_call_output -> tool messages. Content part
types input_text/output_text become text parts; anything else is kept as a
part (the audit renders it as a fingerprint; generate refuses it).
"""

from __future__ import annotations

from typing import Any

from kvcli.inputs.errors import LineError, type_name

_TEXT_PARTS = ("input_text", "output_text", "text")
_MARKS = ("cache_control", "prompt_cache_breakpoint")


def _parts(content: Any) -> Any:
    if not isinstance(content, list):
        return content
    parts = []
    for part in content:
        if isinstance(part, dict) and part.get("type") in _TEXT_PARTS and "text" in part:
            marks = {k: part[k] for k in _MARKS if k in part}  # the audit reads cache breakpoints
            parts.append({"type": "text", "text": part["text"], **marks})
        else:
            parts.append(part)
    return parts


def _item_message(item: dict[str, Any]) -> dict[str, Any]:
    kind = item.get("type", "message")
    if kind == "message" or "role" in item:
        return {"role": item.get("role"), "content": _parts(item.get("content"))}
    if kind == "function_call":
        call = {
            "id": item.get("call_id"),
            "type": "function",
            "function": {"name": item.get("name"), "arguments": item.get("arguments")},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if kind == "function_call_output":
        return {"role": "tool", "tool_call_id": item.get("call_id"), "content": _parts(item.get("output"))}
    # reasoning, web_search_call, ...: the model's own earlier output, kept as an opaque part
    return {"role": "assistant", "content": [item]}


def responses_to_messages(body: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise LineError(f"{prefix}instructions", f"expected a string, got {type_name(instructions)}")
        messages.append({"role": "system", "content": instructions})
    items = body.get("input")  # missing: the "expected" error below names the field
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
        return messages
    if not isinstance(items, list):
        raise LineError(f"{prefix}input", "expected a string or an array of input items")
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise LineError(f"{prefix}input[{i}]", "expected an object")
        messages.append(_item_message(item))
    return messages
