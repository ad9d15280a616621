"""Structural checks of chat messages and tool definitions, with errors that name the field.

One set of rules for every format: a known role; content a string, a list of
parts, or ``null`` on an assistant turn (OpenAI allows it there, with tool
calls); tool calls with a function name and JSON-string or object arguments.
Messages are returned as given (key order kept): how content becomes text is
decided in ``content.py``.
"""

from __future__ import annotations

from typing import Any

from kvcli.inputs.content import check_content
from kvcli.inputs.errors import LineError, show_value, type_name

ROLES = ("system", "developer", "user", "assistant", "tool")


def check_list(value: Any, path: str, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise LineError(path, f"expected an array of {what}, got {type_name(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise LineError(f"{path}[{i}]", f"expected an object, got {type_name(item)}")
    return value


def check_tool_calls(calls: Any, path: str) -> None:
    for k, call in enumerate(check_list(calls, path, "tool calls")):
        function = call.get("function")
        if not isinstance(function, dict):
            raise LineError(f"{path}[{k}].function", f"expected an object, got {type_name(function)}")
        if not isinstance(function.get("name"), str):
            raise LineError(f"{path}[{k}].function.name", "expected a string")
        arguments = function.get("arguments")
        if arguments is not None and not isinstance(arguments, str | dict):
            raise LineError(f"{path}[{k}].function.arguments",
                            f"expected a JSON string, got {type_name(arguments)}")


def _check_message(message: dict[str, Any], where: str) -> None:
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise LineError(f"{where}.role", f"expected a non-empty string, got {type_name(role)}")
    if role not in ROLES:
        raise LineError(f"{where}.role", f"unknown role {show_value(role)}; expected one of "
                        + ", ".join(ROLES))
    content = message.get("content")
    if content is None and role != "assistant":
        raise LineError(f"{where}.content", "missing (only an assistant message may omit it)")
    check_content(content, f"{where}.content")
    if message.get("tool_calls") is not None:
        check_tool_calls(message["tool_calls"], f"{where}.tool_calls")


def check_messages(messages: Any, path: str) -> list[dict[str, Any]]:
    checked = check_list(messages, path, "messages")
    if not checked:
        raise LineError(path, "empty; a chat request needs at least one message")
    for i, message in enumerate(checked):
        _check_message(message, f"{path}[{i}]")
    return checked


def check_tools(value: Any, path: str) -> list[Any] | None:
    return None if value is None else check_list(value, path, "tool definitions")
