"""Structural checks of a line's prompt (text, chat messages, tools, token ids), before tokenizing.

Messages are normalised to what chat templates expect: ``content`` becomes one
string (OpenAI text parts are joined with newlines, as vLLM does).
"""

from __future__ import annotations

from typing import Any

from kvcli.batch.fields import show_value
from kvcli.batch.records import LineError, PromptSpec

ROLES = ("system", "developer", "user", "assistant", "tool")


def check_text(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise LineError(name, f"expected a non-empty string, got {show_value(value)}")
    return value


def check_token_ids(value: Any, name: str) -> list[int]:
    """Non-empty list of non-negative ints (the vocabulary range is checked when encoding)."""
    if not isinstance(value, list) or not value:
        raise LineError(name, f"expected a non-empty list of token ids, got {show_value(value)}")
    for i, tok in enumerate(value):
        if not isinstance(tok, int) or isinstance(tok, bool) or tok < 0:
            raise LineError(f"{name}[{i}]", f"expected a token id (integer >= 0), got {show_value(tok)}")
    return value


def check_messages(value: Any, name: str = "messages") -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise LineError(name, f"expected a non-empty list of messages, got {show_value(value)}")
    return [_check_message(m, f"{name}[{i}]") for i, m in enumerate(value)]


def _check_message(msg: Any, where: str) -> dict[str, Any]:
    if not isinstance(msg, dict):
        raise LineError(where, f"expected a message object, got {show_value(msg)}")
    role = msg.get("role")
    if role not in ROLES:
        raise LineError(f"{where}.role", f"unknown role {show_value(role)}; expected one of "
                        + ", ".join(ROLES))
    out = dict(msg)
    content = msg.get("content")
    if content is None:
        if not (role == "assistant" and msg.get("tool_calls")):
            raise LineError(f"{where}.content", "missing (only an assistant message with "
                            "tool_calls may omit it)")
    elif isinstance(content, list):
        out["content"] = _join_text_parts(content, f"{where}.content")
    elif not isinstance(content, str):
        raise LineError(f"{where}.content", "expected a string or a list of text parts, got "
                        + show_value(content))
    return out


def _join_text_parts(parts: list[Any], where: str) -> str:
    texts = []
    for i, part in enumerate(parts):
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else part
            raise LineError(f"{where}[{i}]", f"only text parts are supported, got {show_value(kind)}")
        text = part.get("text")
        if not isinstance(text, str):
            raise LineError(f"{where}[{i}].text", f"expected a string, got {show_value(text)}")
        texts.append(text)
    return "\n".join(texts)


def check_tools(value: Any, name: str = "tools") -> list[Any] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise LineError(name, f"expected a list of tool objects, got {show_value(value)}")
    return value


def prompt_spec(fields: dict[str, Any], prefix: str = "") -> PromptSpec:
    """Exactly one of prompt / messages / prompt_token_ids (``fields`` holds set fields only)."""
    given = [k for k in ("prompt", "messages", "prompt_token_ids") if k in fields]
    if len(given) != 1:
        what = "none" if not given else " and ".join(given)
        raise LineError(prefix + (given[1] if len(given) > 1 else "prompt"),
                        f"expected exactly one of prompt, messages or prompt_token_ids, got {what}")
    tools = check_tools(fields.get("tools"), prefix + "tools")
    if tools is not None and given[0] != "messages":
        raise LineError(prefix + "tools", "only valid together with messages")
    name = prefix + given[0]
    if given[0] == "messages":
        return PromptSpec(messages=check_messages(fields["messages"], name), tools=tools, source=name)
    if given[0] == "prompt_token_ids":
        return PromptSpec(token_ids=check_token_ids(fields["prompt_token_ids"], name), source=name)
    return PromptSpec(text=check_text(fields["prompt"], name), source=name)
