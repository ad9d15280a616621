"""--fix rules: rewrite request lines so equal content renders equally, each change named by field.

The default rules only canonicalise (the model reads the same data): `json` re-serialises JSON
held in strings (tool-call arguments, tool results, JSON message text) and JSON objects (tool_use
inputs, response_format) with sorted keys and compact separators; `tools` puts the tools in one
stable order (the order of first appearance in the file, so a tool list that only grows stays a
prefix) with sorted schema keys; `whitespace` normalises text (NFC, LF line ends, no trailing
blanks, one space between words, no NBSP or zero-width characters). `volatile` moves content and is opt-in: a short line
of the system text holding a timestamp, UUID, Unix time or request id goes to the end of the last
message, so the system prompt stops changing per request.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvcli.audit.rules.patterns import KINDS

DEFAULT_RULES = ("json", "tools", "whitespace")
ALL_RULES = ("json", "tools", "whitespace", "volatile")
ZERO_WIDTH = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff"))
MOVED_KINDS = ("timestamp", "uuid", "labelled-id", "epoch", "ulid")
ISO_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
DOUBLED_SPACE = re.compile(r"(?<=\S) {2,}(?=\S)")
MAX_MOVED_LINE = 200  # longer lines are prose around the value: not moved
SYSTEM_ROLES = ("system", "developer")

Note = Callable[[str, str], None]  # (field, what changed)
TextFn = Callable[[str, str], str]  # (field, text) -> new text


@dataclass(slots=True)
class Change:
    line: int
    field: str
    rule: str
    what: str


@dataclass(slots=True)
class FixContext:
    """What a rule needs from the whole file: the order tools first appear in."""

    tool_rank: dict[str, int] = field(default_factory=dict)


def body_of(value: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The request body of a line (a batch line's `body` or `params`) and its field prefix."""
    for key in ("body", "params", "request"):  # a batch line, or a logged request+response pair
        if isinstance(value.get(key), dict):
            return value[key], key + "."
    return value, ""


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sorted_json(value: Any) -> Any:
    return json.loads(canonical(value))


def _json_text(text: str) -> str | None:
    """The canonical form of text that is wholly a JSON object or array, else None."""
    stripped = text.strip()
    if not stripped or stripped[0] not in "[{":
        return None
    try:
        return canonical(json.loads(stripped))
    except ValueError:
        return None


def _map_content(holder: dict[str, Any], key: str, path: str, fn: TextFn) -> None:
    value = holder.get(key)
    if isinstance(value, str):
        holder[key] = fn(path, value)
    elif isinstance(value, list):
        for j, part in enumerate(value):
            if isinstance(part, str):
                value[j] = fn(f"{path}[{j}]", part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                part["text"] = fn(f"{path}[{j}].text", part["text"])
            elif isinstance(part, dict) and part.get("type") == "tool_result":
                _map_content(part, "content", f"{path}[{j}].content", fn)


def _items(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(f"{key}[{i}]", m) for key in ("messages", "input") if isinstance(body.get(key), list)
            for i, m in enumerate(body[key]) if isinstance(m, dict)]  # fmt: skip


def map_texts(body: dict[str, Any], prefix: str, fn: TextFn) -> None:
    """Apply `fn` to every text the model reads (not tool definitions or call arguments)."""
    for key in ("system", "instructions", "prompt", "input"):
        if key != "input" or isinstance(body.get(key), str):
            _map_content(body, key, prefix + key, fn)
    for path, item in _items(body):
        _map_content(item, "content", f"{prefix}{path}.content", fn)
        _map_content(item, "output", f"{prefix}{path}.output", fn)  # Responses function_call_output


def fix_json(body: dict[str, Any], prefix: str, note: Note, ctx: FixContext) -> None:
    def text(path: str, value: str) -> str:
        fixed = _json_text(value)
        if fixed is None or fixed == value:
            return value
        note(path, "JSON text re-serialised (sorted keys, compact)")
        return fixed

    map_texts(body, prefix, text)
    for path, item in _items(body):
        calls = item.get("tool_calls") if isinstance(item.get("tool_calls"), list) else []
        for j, call in enumerate(calls):
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                fn["arguments"] = text(f"{prefix}{path}.tool_calls[{j}].function.arguments", fn["arguments"])
        if item.get("type") == "function_call" and isinstance(item.get("arguments"), str):
            item["arguments"] = text(f"{prefix}{path}.arguments", item["arguments"])
        parts = item.get("content") if isinstance(item.get("content"), list) else []
        for j, part in enumerate(parts):
            if isinstance(part, dict) and part.get("type") == "tool_use" and isinstance(part.get("input"), dict):
                _sort_object(part, "input", f"{prefix}{path}.content[{j}].input", note)
    if isinstance(body.get("response_format"), dict):
        _sort_object(body, "response_format", prefix + "response_format", note)


def _sort_object(holder: dict[str, Any], key: str, path: str, note: Note) -> None:
    fixed = sorted_json(holder[key])
    if json.dumps(fixed) != json.dumps(holder[key]):
        holder[key] = fixed
        note(path, "keys sorted")


def tool_name(tool: Any) -> str | None:
    if not isinstance(tool, dict):
        return None
    fn = tool.get("function")
    name = fn.get("name") if isinstance(fn, dict) else tool.get("name")
    return name if isinstance(name, str) else None


def learn_tools(ctx: FixContext, value: Any) -> None:
    """The pre-pass: each tool name's first appearance in the file."""
    if isinstance(value, dict):
        tools = body_of(value)[0].get("tools")
        for tool in tools if isinstance(tools, list) else []:
            name = tool_name(tool)
            if name is not None:
                ctx.tool_rank.setdefault(name, len(ctx.tool_rank))


def fix_tools(body: dict[str, Any], prefix: str, note: Note, ctx: FixContext) -> None:
    tools = body.get("tools")
    if not isinstance(tools, list) or any(tool_name(t) is None for t in tools):
        return
    ordered = sorted(tools, key=lambda t: ctx.tool_rank[tool_name(t)])  # type: ignore[index]
    if ordered != tools:
        note(prefix + "tools", "order " + ", ".join(map(str, map(tool_name, tools))) + " -> "
             + ", ".join(map(str, map(tool_name, ordered))) + " (first appearance in the file)")
    canon = [sorted_json(t) for t in ordered]
    unsorted = [str(tool_name(t)) for t, c in zip(ordered, canon, strict=True) if json.dumps(t) != json.dumps(c)]
    if unsorted:
        note(prefix + "tools", "schema keys sorted in " + ", ".join(unsorted))
    body["tools"] = canon


def normalise_whitespace(text: str) -> str:
    """NFC, LF, no NBSP or zero-width characters, no trailing blanks, one space between words
    (indentation and fenced code blocks are left as they are)."""
    text = unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n")
    text = text.replace("\u00a0", " ").translate(ZERO_WIDTH)
    lines, fenced = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            line = DOUBLED_SPACE.sub(" ", line)
        lines.append(line.rstrip(" \t"))
    return "\n".join(lines)


def fix_whitespace(body: dict[str, Any], prefix: str, note: Note, ctx: FixContext) -> None:
    def text(path: str, value: str) -> str:
        if _json_text(value) is not None:
            return value  # JSON data: spaces inside its strings are data (the json rule canonicalises it)
        fixed = normalise_whitespace(value)
        if fixed != value:
            kinds = [k for k, hit in (("CRLF/CR", "\r" in value), ("NBSP", "\u00a0" in value),
                                      ("zero-width", bool(value.translate(ZERO_WIDTH) != value)),
                                      ("NFD", unicodedata.normalize("NFC", value) != value),
                                      ("doubled spaces", bool(DOUBLED_SPACE.search(value)))) if hit]  # fmt: skip
            note(path, "whitespace normalised (" + ", ".join(kinds or ["trailing blanks"]) + ")")
        return fixed

    map_texts(body, prefix, text)


def _volatile(line: str) -> bool:
    if len(line) > MAX_MOVED_LINE:
        return False
    return bool(ISO_DATE.search(line)) or any(k.pattern.search(line) for k in KINDS if k.name in MOVED_KINDS)


def _split_volatile(text: str) -> tuple[str, list[str]]:
    kept, moved = [], []
    for line in text.split("\n"):
        if _volatile(line):
            moved.append(line)
        elif not (line == "" and moved and (not kept or kept[-1] == "")):  # no blank run left behind
            kept.append(line)
    return "\n".join(kept).strip("\n"), moved


def fix_volatile(body: dict[str, Any], prefix: str, note: Note, ctx: FixContext) -> None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return
    last, last_path = messages[-1], f"{prefix}messages[{len(messages) - 1}].content"
    if not isinstance(last.get("content"), (str, list)) or last.get("role") in SYSTEM_ROLES:
        return  # nowhere to put it (an assistant tool call, or only a system message)
    holders = [(body, "system", prefix + "system")] + [
        (m, "content", f"{prefix}messages[{i}].content") for i, m in enumerate(messages[:-1])
        if isinstance(m, dict) and m.get("role") in SYSTEM_ROLES]  # fmt: skip
    moved_all: list[str] = []
    for holder, key, path in holders:
        if not isinstance(holder.get(key), str):
            continue
        kept, moved = _split_volatile(holder[key])
        if moved:
            holder[key] = kept
            moved_all += moved
            note(path, f"moved to {last_path}: " + " | ".join(moved))
    if not moved_all:
        return
    tail = "\n".join(moved_all)
    if isinstance(last["content"], str):
        last["content"] = f"{last['content']}\n\n{tail}"
    else:
        last["content"].append({"type": "text", "text": tail})


RULES: dict[str, Callable[[dict[str, Any], str, Note, FixContext], None]] = {
    "json": fix_json, "tools": fix_tools, "whitespace": fix_whitespace, "volatile": fix_volatile,
}  # fmt: skip


def apply_rule(rule: str, value: Any, line: int, ctx: FixContext) -> tuple[Any, list[Change]]:
    """The line's value with one rule applied (a copy) and the changes it made."""
    if not isinstance(value, dict):
        return value, []
    fixed = json.loads(json.dumps(value))
    changes: list[Change] = []
    body, prefix = body_of(fixed)
    RULES[rule](body, prefix, lambda path, what: changes.append(Change(line, path, rule, what)), ctx)
    return (fixed, changes) if changes else (value, [])
