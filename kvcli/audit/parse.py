"""Turning one JSON record into a PromptRequest, with errors that name the field.

Accepted shapes (see docs/AUDIT.md): {"prompt": ...}; chat {"messages", "tools"}
(OpenAI chat completions, or Anthropic Messages with a top-level "system"); the
OpenAI Batch API line {"custom_id", "method", "url", "body"} and Anthropic's
batch line {"custom_id", "params"}; an OpenAI Responses body {"input", "instructions"}.
Nothing is reordered or re-serialized here: dicts keep their key order.
"""

from __future__ import annotations

from typing import Any

from kvcli.audit.records import FieldError, InputProblem, PromptRequest
from kvcli.audit.responses import responses_to_messages

SESSION_KEYS = ("session_id", "prompt_cache_key", "user")


def type_name(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number" if isinstance(value, int | float) else type(value).__name__)


def _optional_str(container: dict[str, Any], key: str, path: str) -> str | None:
    value = container.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise FieldError(f"{path}{key}: expected a string, got {type_name(value)}")
    return str(value)


def _unwrap_batch(value: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """(request body, path prefix for messages) of a Batch API line, or the line itself."""
    for key in ("body", "params"):
        if key in value and ("custom_id" in value or "url" in value or "method" in value):
            body = value[key]
            if not isinstance(body, dict):
                raise FieldError(f"{key}: expected an object, got {type_name(body)}")
            return body, f"{key}."
    return value, ""


def _session(value: dict[str, Any], body: dict[str, Any], prefix: str) -> str | None:
    for container, path in ((value, ""), (body, prefix)):
        metadata = container.get("metadata")
        if isinstance(metadata, dict) and metadata.get("session_id") is not None:
            return _optional_str(metadata, "session_id", f"{path}metadata.")
        for key in SESSION_KEYS:
            found = _optional_str(container, key, path)
            if found is not None:
                return found
    return None


def _check_list(value: Any, path: str, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise FieldError(f"{path}: expected an array of {what}, got {type_name(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise FieldError(f"{path}[{i}]: expected an object, got {type_name(item)}")
    return value


def _check_content(content: Any, path: str) -> None:
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise FieldError(
            f"{path}: expected a string, an array of content parts or null, got {type_name(content)}"
        )
    for j, part in enumerate(content):
        if isinstance(part, str):
            continue  # some clients send bare strings as parts
        if not isinstance(part, dict):
            raise FieldError(f"{path}[{j}]: expected a content part object, got {type_name(part)}")
        if part.get("type") == "text" and not isinstance(part.get("text"), str):
            raise FieldError(f"{path}[{j}].text: expected a string, got {type_name(part.get('text'))}")


def _check_tool_calls(calls: Any, path: str) -> None:
    for k, call in enumerate(_check_list(calls, path, "tool calls")):
        function = call.get("function")
        if not isinstance(function, dict):
            raise FieldError(f"{path}[{k}].function: expected an object, got {type_name(function)}")
        if not isinstance(function.get("name"), str):
            raise FieldError(f"{path}[{k}].function.name: expected a string")
        arguments = function.get("arguments")
        if arguments is not None and not isinstance(arguments, str | dict):
            raise FieldError(
                f"{path}[{k}].function.arguments: expected a JSON string, got {type_name(arguments)}"
            )


def check_messages(messages: Any, path: str) -> list[dict[str, Any]]:
    checked = _check_list(messages, path, "messages")
    if not checked:
        raise FieldError(f"{path}: empty; a chat request needs at least one message")
    for i, message in enumerate(checked):
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise FieldError(f"{path}[{i}].role: expected a non-empty string, got {type_name(role)}")
        _check_content(message.get("content"), f"{path}[{i}].content")
        if message.get("tool_calls") is not None:
            _check_tool_calls(message["tool_calls"], f"{path}[{i}].tool_calls")
    return checked


def _prompt_text(prompt: Any, path: str) -> str:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0]
    if not isinstance(prompt, str):
        detail = " (token id arrays are not supported; give the text)" if isinstance(prompt, list) else ""
        raise FieldError(f"{path}: expected a string, got {type_name(prompt)}{detail}")
    return prompt


def parse_request(value: Any, where: str) -> PromptRequest:
    """Raises FieldError on a malformed request."""
    if not isinstance(value, dict):
        raise FieldError(f"expected a JSON object per request, got {type_name(value)}")
    body, prefix = _unwrap_batch(value)
    request = PromptRequest(source=where)
    request.id = (
        _optional_str(value, "custom_id", "")
        or _optional_str(value, "id", "")
        or _optional_str(value, "request_id", "")
    )
    request.cache_salt = _optional_str(value, "cache_salt", "") or _optional_str(body, "cache_salt", prefix)
    request.session = _session(value, body, prefix)
    request.model = _optional_str(body, "model", prefix)
    if "messages" in body:
        request.messages = check_messages(body["messages"], f"{prefix}messages")
    elif "input" in body:
        request.messages = check_messages(responses_to_messages(body, prefix), f"{prefix}input")
    elif "prompt" in body or "text" in body:
        key = "prompt" if "prompt" in body else "text"
        request.text = _prompt_text(body[key], f"{prefix}{key}")
        return request
    else:
        where = f"{prefix[:-1]}: " if prefix else ""
        raise FieldError(f"{where}no 'prompt', 'messages' or 'input' field")
    if body.get("tools") is not None:
        request.tools = _check_list(body["tools"], f"{prefix}tools", "tool definitions")
    if body.get("system") is not None:
        system = body["system"]
        _check_content(system, f"{prefix}system")
        request.system = system
    request.response_format = _response_format(body)
    return request


def _response_format(body: dict[str, Any]) -> Any:
    """The structured-output schema: chat's response_format, or Responses' text.format."""
    text = body.get("text")
    if isinstance(text, dict) and text.get("format") is not None:
        return text["format"]
    return body.get("response_format")


def to_request(value: Any, where: str, is_text: bool = False) -> PromptRequest | InputProblem:
    if is_text:
        return PromptRequest(source=where, text=value)
    try:
        return parse_request(value, where)
    except FieldError as err:
        return InputProblem(where, str(err))
