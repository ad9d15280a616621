"""Tool calls in a model family's own format: which format, how to constrain to it, how to parse it.

The format is read from the chat template (what the model was trained to emit):

* ``hermes``: Hermes / Qwen 2.5+ ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
  one block per call;
* ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``;
* ``llama3``: Llama 3.1+ ``{"name": ..., "parameters": {...}}`` as the whole reply.

``tool_choice`` ``"required"`` or a named function constrains the output to calls in that
format, each call's arguments to its function's parameter schema (checked like any schema:
what the grammar compiler cannot enforce is an error). ``"auto"`` leaves the output free
and parses whatever calls it contains; ``"none"`` parses nothing. Torch-free.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Collection
from typing import Any

from kvcli.structured.params import StructuredOutputsParams
from kvcli.structured.schema_check import check_json_schema

FORMATS = ("hermes", "mistral", "llama3")
_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_ARGUMENTS = {"hermes": "arguments", "mistral": "arguments", "llama3": "parameters"}


def tool_call_format(template: str | None) -> str | None:
    """The tool-call format a chat template teaches, or None (no tools, or one kvcli does not know)."""
    if not template:
        return None
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|python_tag|>" in template or ("ipython" in template and '"parameters"' in template):
        return "llama3"
    return None


def check_tool_choice(tool_choice: Any, tools: list[Any] | None, path: str) -> str | None:
    """``"none"``/``"auto"``/``"required"``, or the named function; ``ValueError`` naming the field."""
    if tool_choice is None:
        return "auto" if tools else None
    if not tools:
        raise ValueError(f"{path}: only valid together with tools")
    if tool_choice in ("none", "auto", "required"):
        return tool_choice
    function = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or tool_choice.get("type") != "function":
        raise ValueError(f"{path}: expected \"none\", \"auto\", \"required\" or "
                         "{\"type\": \"function\", \"function\": {\"name\": ...}}")
    if name not in _names(tools):
        raise ValueError(f"{path}.function.name: no tool named {name!r} in tools")
    return name


def tool_constraint(tools: list[Any], choice: str, fmt: str | None, path: str,
                    tools_path: str, parallel: bool = True) -> StructuredOutputsParams | None:
    """The grammar of ``required`` / a named function's calls in ``fmt`` (None when free)."""
    if choice in ("none", "auto"):
        return None
    if fmt is None:
        raise ValueError(f"{path}: the model's chat template has no tool-call format kvcli knows "
                         f"({', '.join(FORMATS)}), so a call cannot be required")
    functions = [f for f in _functions(tools, tools_path) if choice == "required" or f[0] == choice]
    calls = [_call_schema(name, params, fmt) for name, params in functions]
    tag = _structural_tag(calls, fmt, parallel and choice == "required")
    return StructuredOutputsParams(structural_tag=tag, source=path)


def parse_tool_calls(text: str, fmt: str, names: Collection[str] | None = None
                     ) -> tuple[str | None, list[dict[str, Any]]]:
    """(content outside the calls or None, OpenAI ``tool_calls``) of a completion in ``fmt``.

    Only well-formed calls become ``tool_calls``: JSON (no ``NaN``/``Infinity``, which is not
    JSON) naming a function in ``names`` (when given), as vLLM's newer parsers check. Text
    that is not such a call stays in ``content``, never dropped: a malformed block, a call
    to an unknown function, and a last call cut off by ``max_tokens`` (the complete calls
    before it are kept).
    """
    if fmt == "hermes":
        return _hermes(text, names)
    body = text.strip().removeprefix("[TOOL_CALLS]").strip()
    parsed = _as_json(body)
    items = parsed if isinstance(parsed, list) else [parsed]
    calls = [c for c in (_as_call(item, fmt, names) for item in items) if c is not None]
    if len(calls) != len(items):  # one JSON value holds them all: all or none are calls
        calls = []
    return (None if calls else text or None), calls


def _hermes(text: str, names: Collection[str] | None) -> tuple[str | None, list[dict[str, Any]]]:
    calls, kept, end = [], [], 0
    for match in _HERMES_CALL.finditer(text):
        call = _as_call(match.group(1), "hermes", names)
        if call is not None:  # the block becomes a call; anything else stays text
            calls.append(call)
            kept.append(text[end:match.start()])
            end = match.end()
    if not calls:
        return text or None, []
    kept.append(text[end:])
    return "".join(kept).strip() or None, calls


# ----------------------------------------------------------------- helpers
def tool_names(tools: list[Any] | None) -> frozenset[str]:
    """The function names a line's ``tools`` offer (a reply may call only these)."""
    return frozenset(_names(tools or []))


def _names(tools: list[Any]) -> list[str]:
    return [t.get("function", {}).get("name") for t in tools if isinstance(t, dict)
            and isinstance(t.get("function"), dict)]


def _functions(tools: list[Any], tools_path: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        where = f"{tools_path}[{i}].function"
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValueError(f"{where}: expected an object with a \"name\"")
        params = fn.get("parameters", {"type": "object"})
        check_json_schema(params, f"{where}.parameters")
        out.append((fn["name"], params))
    return out


def _call_schema(name: str, params: dict[str, Any], fmt: str) -> dict[str, Any]:
    arguments = _ARGUMENTS[fmt]
    return {"type": "object", "properties": {"name": {"const": name}, arguments: params},
            "required": ["name", arguments], "additionalProperties": False}


def _structural_tag(calls: list[dict[str, Any]], fmt: str, parallel: bool) -> dict[str, Any]:
    if fmt == "hermes":
        tags = [{"type": "tag", "begin": "<tool_call>\n", "end": "\n</tool_call>",
                 "content": {"type": "json_schema", "json_schema": c}} for c in calls]
        return {"type": "structural_tag", "format": {
            "type": "tags_with_separator", "tags": tags, "separator": "\n",
            "at_least_one": True, "stop_after_first": not parallel}}
    one = {"anyOf": calls} if len(calls) > 1 else calls[0]
    if fmt == "llama3":
        return {"type": "structural_tag", "format": {"type": "json_schema", "json_schema": one}}
    # Mistral's [TOOL_CALLS] is a control token kvcli never lets a grammar emit (its text is
    # skipped in the output): the constrained reply is the JSON list it introduces.
    array = {"type": "array", "items": one, "minItems": 1, **({} if parallel else {"maxItems": 1})}
    return {"type": "structural_tag", "format": {"type": "json_schema", "json_schema": array}}


def _as_json(text: str) -> Any:
    """The JSON value of ``text``, or None: not JSON (``NaN`` and ``Infinity`` included), too
    deep, or an integer longer than Python converts (ValueError)."""
    try:
        return json.loads(text, parse_constant=_not_json)
    except (ValueError, RecursionError):  # also an integer past Python's 4,300-digit limit
        return None


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _as_call(value: Any, fmt: str, names: Collection[str] | None) -> dict[str, Any] | None:
    obj = _as_json(value) if isinstance(value, str) else value
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    if names is not None and obj["name"] not in names:  # a function the line did not offer
        return None
    args = obj.get(_ARGUMENTS[fmt], obj.get("arguments", {}))
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)}}
