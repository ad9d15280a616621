"""Rendering a request to the one text whose tokens the cache sees, in prefix order.

Chat requests render as tools, then the structured-output schema, then a
top-level system (Anthropic), then the messages in the order given, then the
generation prompt. The wrapper is ChatML-like (`<|im_start|>role ... <|im_end|>`),
which is what most open models' templates produce; with --model the model's own
template is used instead (kvcli.audit.template).

Serialization choice (see docs/AUDIT.md): tool definitions, schemas and
tool_use inputs are request-body JSON that every server parses and re-serializes
before templating, so their whitespace never reaches the cache but their key
order does. They are rendered with json.dumps in insertion order (orjson keeps
the order it read). Strings that hold JSON -- tool-call `arguments`, message
text, tool results -- reach the model verbatim and are rendered byte for byte,
so separators and key order inside them are seen exactly.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import orjson

from kvcli.audit.records import FieldError, PromptRequest, RenderedPrompt, Segment, SegmentKind

IM_START = "<|im_start|>"
IM_END = "<|im_end|>\n"
GENERATION_PROMPT = IM_START + "assistant\n"
MAX_PART_DEPTH = 8
CACHE_CONTROL, BREAKPOINT, LONG_TTL = 1, 2, 4  # a block's marks (bits); LONG_TTL: cache_control ttl "1h"
T = TypeVar("T")
_SURROGATE = re.compile("[\ud800-\udfff]")


def dumps(value: Any, where: str) -> str:
    """Insertion-ordered JSON, as HF chat templates' tojson writes it."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (RecursionError, ValueError, TypeError) as err:
        reason = "nested too deeply" if isinstance(err, RecursionError) else str(err)
        raise FieldError(f"{where}: cannot render: {reason}") from err


def compact_key(value: Any) -> bytes | None:
    """A fast exact key for a JSON value, key order included (orjson keeps insertion order)."""
    try:
        return orjson.dumps(value)
    except (orjson.JSONEncodeError, TypeError):
        return None  # too deep for orjson's writer: no memo


def canonical_json(value: Any) -> str | None:
    """A JSON value with sorted keys and no whitespace: equal values, equal text (None: unencodable)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except (orjson.JSONEncodeError, TypeError):  # deeper than orjson writes, or a huge int
        try:
            return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        except (RecursionError, ValueError, TypeError):
            return None


class JsonMemo:
    """Results of a pure function of a JSON value, keyed by its exact serialization: requests
    repeat the same tools and, turn after turn, the same conversation history."""

    __slots__ = ("budget", "_memo", "_size")

    def __init__(self, budget_bytes: int) -> None:
        self.budget = budget_bytes
        self._memo: dict[bytes, Any] = {}
        self._size = 0

    def get(self, value: Any, compute: Callable[[], T]) -> T:
        serialized = compact_key(value)
        if serialized is None:
            return compute()
        # Keyed by a 128-bit digest: orjson's bytes keep a 4 KiB buffer however short they are.
        key = hashlib.blake2b(serialized, digest_size=16).digest()
        found = self._memo.get(key)
        if found is None:
            if self._size > self.budget:
                self._memo.clear()
                self._size = 0
            found = self._memo[key] = compute()
            self._size += 64 + len(serialized)  # the entry and about as much rendered text
        return found


_TOOLS = JsonMemo(8 << 20)
_MESSAGES = JsonMemo(32 << 20)


def fingerprint(value: Any, where: str) -> str:
    raw = value if isinstance(value, str) else dumps(value, where)
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def tool_name(tool: Any) -> str:
    """OpenAI {"function": {"name"}}, Responses/Anthropic {"name"}."""
    if isinstance(tool, dict):
        function = tool.get("function")
        name = function.get("name") if isinstance(function, dict) else tool.get("name")
        if isinstance(name, str):
            return name
    return "?"


def render_part(part: Any, where: str, depth: int = 0) -> str:
    """One content part as text; non-text parts as a fingerprint so any change shows."""
    if isinstance(part, str):
        return part
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text" and isinstance(part.get("text"), str):
        return part["text"]
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        detail = image.get("detail", "auto") if isinstance(image, dict) else "auto"
        return f"[image {fingerprint(url if url is not None else '', where)} detail={detail}]"
    if kind == "tool_use":
        call = {"name": part.get("name"), "input": part.get("input")}
        return f"<tool_use>{dumps(call, where)}</tool_use>"
    if kind == "tool_result" and depth < MAX_PART_DEPTH:
        content = part.get("content")
        inner = (
            "\n".join(render_part(p, where, depth + 1) for p in content)
            if isinstance(content, list)
            else content if isinstance(content, str) else ""
        )
        return f"<tool_result>{inner}</tool_result>"
    return f"[{kind if isinstance(kind, str) else 'part'} {fingerprint(part, where)}]"


def render_tool_call(call: dict[str, Any], where: str) -> str:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        arguments = dumps(arguments if arguments is not None else {}, f"{where}.function.arguments")
    name = dumps(function.get("name"), where)
    return f'<tool_call>{{"name": {name}, "arguments": {arguments}}}</tool_call>'


class _Builder:
    __slots__ = ("parts", "pos", "segments", "messages")

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.pos = 0
        self.segments: list[Segment] = []
        self.messages: list[tuple[str, int, int]] = []  # (role, start, end) per message

    def add(
        self, text: str, label: str, kind: SegmentKind, role: str | None = None,
        message: int | None = None, marks: int = 0,
    ) -> None:  # fmt: skip
        self.parts.append(text)
        start, self.pos = self.pos, self.pos + len(text)
        self.segments.append(Segment(label, kind, start, self.pos, role, message, bool(marks & CACHE_CONTROL),
                                     bool(marks & BREAKPOINT), bool(marks & LONG_TTL)))


def marks_of(node: Any) -> int:
    """The cache breakpoints a block carries: Anthropic's cache_control, OpenAI's prompt_cache_breakpoint."""
    if not isinstance(node, dict):
        return 0
    control = node.get("cache_control")
    long = LONG_TTL if isinstance(control, dict) and control.get("ttl") == "1h" else 0
    return (CACHE_CONTROL | long if control is not None else 0) | (
        BREAKPOINT if node.get("prompt_cache_breakpoint") is not None else 0)


def tool_blocks(tools: list[Any]) -> list[tuple[str, str, int]]:
    """(text, label, marks) per tool definition, wrapper included."""
    blocks = []
    last = len(tools) - 1
    for i, tool in enumerate(tools):
        head = IM_START + "tools\n" if i == 0 else ""
        tail = "\n" + (IM_END if i == last else "")
        cache = marks_of(tool)
        blocks.append((head + dumps(tool, f"tools[{i}]") + tail, f"tools[{i}] {tool_name(tool)}", cache))
    return blocks


def _render_tools(b: _Builder, tools: list[Any]) -> None:
    for text, label, cache in _TOOLS.get(tools, partial(tool_blocks, tools)):
        b.add(text, label, "tools", None, None, cache)


def _content_pieces(content: Any, where: str) -> list[tuple[str, str, int]]:
    """(text, label suffix, marks) per content block."""
    if content is None or isinstance(content, str):
        return [(content or "", "", 0)]
    pieces = []
    for j, part in enumerate(content):
        text = render_part(part, f"{where}[{j}]")
        cache = marks_of(part)
        pieces.append((("\n" if j else "") + text, f" content[{j}]", cache))
    return pieces or [("", "", 0)]


def message_blocks(message: dict[str, Any], where: str) -> list[tuple[str, str, int]]:
    """(text, label suffix, marks) per content block of one message, wrapper included."""
    role = message["role"]
    name = message.get("name")
    head = IM_START + role + (f" name={name}" if isinstance(name, str) else "") + "\n"
    calls = message.get("tool_calls") or []
    content = message.get("content")
    pieces = [] if content is None and calls else _content_pieces(content, f"{where}.content")
    for k, call in enumerate(calls):
        sep = "\n" if pieces and (pieces[-1][0] or k) else ""
        pieces.append((sep + render_tool_call(call, f"{where}.tool_calls[{k}]"), f" tool_calls[{k}]", 0))
    last = len(pieces) - 1
    blocks = []
    for j, (text, suffix, cache) in enumerate(pieces):
        cache = cache | (marks_of(message) if j == last else 0)
        text = (head if j == 0 else "") + text + (IM_END if j == last else "")
        blocks.append((text, suffix if last else "", cache))
    return blocks


def _render_message(b: _Builder, i: int, message: dict[str, Any]) -> None:
    where = f"messages[{i}]"
    role = message["role"]
    kind: SegmentKind = "system" if role in ("system", "developer") else "message"
    start = b.pos
    for text, suffix, cache in _MESSAGES.get(message, partial(message_blocks, message, where)):
        b.add(text, f"{where} {role}{suffix}", kind, role, i, cache)
    b.messages.append((role, start, b.pos))


def render_chat(request: PromptRequest) -> tuple[str, list[Segment], list[tuple[str, int, int]]]:
    b = _Builder()
    if request.tools:
        _render_tools(b, request.tools)
    if request.response_format is not None:
        schema = dumps(request.response_format, "response_format")
        b.add(IM_START + "schema\n" + schema + "\n" + IM_END, "response_format", "schema")
    if request.system is not None:
        pieces = _content_pieces(request.system, "system")
        for j, (text, _, cache) in enumerate(pieces):
            text = (IM_START + "system\n" if j == 0 else "") + text + (IM_END if j == len(pieces) - 1 else "")
            b.add(text, f"system[{j}]", "system", "system", None, cache)
    for i, message in enumerate(request.messages or []):
        _render_message(b, i, message)
    b.add(GENERATION_PROMPT, "generation prompt", "generation")
    return "".join(b.parts), b.segments, b.messages


def scrub_surrogates(text: str) -> str:
    """Lone surrogates cannot be encoded; replace each with U+FFFD (same length, offsets hold)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)


def render_request(index: int, request: PromptRequest) -> RenderedPrompt:
    """Raises FieldError when a part cannot be rendered."""
    if request.token_ids is not None:
        raise FieldError("prompt_token_ids: token ids are the model's own; give --model to audit "
                         "them (they are hashed as given)")
    if not request.is_chat:
        text = scrub_surrogates(request.text or "")
        return RenderedPrompt(index, request, text, [Segment("prompt", "text", 0, len(text))], True)
    text, segments, messages = render_chat(request)
    return RenderedPrompt(index, request, scrub_surrogates(text), segments, False, messages)
