"""Request shapes: per-tool and per-message fingerprints, and which earlier request a
request should extend (its conversation's previous request).

Only fingerprints are kept (not texts), one shape per open conversation.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from kvcli.audit.records import RenderedPrompt
from kvcli.audit.render import JsonMemo, canonical_json, compact_key, dumps, tool_name


def digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def canonical(value: Any) -> bytes:
    """Fingerprint of a JSON value regardless of key order and separators."""
    text = canonical_json(value)
    return digest(text if text is not None else repr(value))


@dataclass(slots=True)
class ToolPrint:
    name: str
    raw: bytes  # the definition as rendered (key order included)
    canonical: bytes  # the definition, key order ignored
    fields: dict[str, bytes]  # canonical fingerprint per field (description, parameters, ...)
    start: int
    end: int


@dataclass(slots=True)
class MessagePrint:
    role: str
    digest: int  # exactly as rendered (Python's str hash: equality within one run is all it serves)
    start: int
    end: int


@dataclass(slots=True)
class RequestShape:
    index: int
    id: str | None
    session: str | None
    model: str | None
    tools: list[ToolPrint] = field(default_factory=list)
    messages: list[MessagePrint] = field(default_factory=list)
    conversation: int = -1  # set when recorded: requests of one conversation share it

    @property
    def opening(self) -> int | None:
        """The first non-system message: what identifies a conversation without a session key."""
        return next((m.digest for m in self.messages if m.role not in SYSTEM_ROLES), None)

    @property
    def instructions(self) -> int | None:
        """The leading system/developer message: what identifies an application's prompts."""
        first = self.messages[0] if self.messages else None
        return first.digest if first is not None and first.role in SYSTEM_ROLES else None

    def non_system(self) -> set[int]:
        return {m.digest for m in self.messages if m.role not in SYSTEM_ROLES}


def _tool_fields(tool: Any) -> dict[str, bytes]:
    if not isinstance(tool, dict):
        return {}
    body = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    return {key: canonical(value) for key, value in body.items()}


ToolFacts = tuple[str, bytes, bytes, dict[str, bytes]]  # name, as rendered, canonical, per field


def tool_facts(tools: list[Any]) -> list[ToolFacts]:
    facts = []
    for tool in tools:
        key = compact_key(tool)
        raw = digest(key.decode() if key is not None else dumps(tool, "tool"))
        facts.append((tool_name(tool), raw, canonical(tool), _tool_fields(tool)))
    return facts


class ToolPrinter:
    """Tool fingerprints, memoized per tool list: every request repeats the same tools."""

    __slots__ = ("_memo",)

    def __init__(self) -> None:
        self._memo = JsonMemo(8 << 20)

    def __call__(self, tools: list[Any]) -> list[ToolFacts]:
        return self._memo.get(tools, partial(tool_facts, tools))


def shape_of(rendered: RenderedPrompt, printer: ToolPrinter) -> RequestShape | None:
    request = rendered.request
    if not request.is_chat:
        return None
    shape = RequestShape(rendered.index, request.id, request.session, request.model)
    tools = [] if rendered.tools_ignored else request.tools or []  # what never reaches the cache
    if tools:
        spans = [(s.start, s.end) for s in rendered.segments if s.kind == "tools"]
        if len(spans) != len(tools):  # a model's template renders all tools in one header
            spans = [spans[0] if spans else (0, 0)] * len(tools)
        for (name, raw, whole, fields), (start, end) in zip(printer(tools), spans, strict=True):
            shape.tools.append(ToolPrint(name, raw, whole, fields, start, end))
    text = rendered.text
    keys = rendered.message_keys or [hash(text[start:end]) for _, start, end in rendered.messages]
    shape.messages = [MessagePrint(role, key, start, end)
                      for (role, start, end), key in zip(rendered.messages, keys, strict=True)]
    return shape


SYSTEM_ROLES = ("system", "developer")
MIN_RUN = 2  # consecutive non-system messages two requests must share to be one conversation
INDEX_TAIL = 4  # each request indexes its last few non-system messages (kept turns of a compaction)
INDEX_CAP = 1 << 18  # message index entries (bounded memory: the oldest entries go first)


def longest_common_run(a: list[int], b: list[int]) -> tuple[int, int, int]:
    """(length, start in a, start in b) of the longest run of equal consecutive items."""
    positions: dict[int, list[int]] = {}
    for i, d in enumerate(a):
        positions.setdefault(d, []).append(i)
    best = (0, 0, 0)
    for j, d in enumerate(b):
        for i in positions.get(d, ()):
            k = 1
            while i + k < len(a) and j + k < len(b) and a[i + k] == b[j + k]:
                k += 1
            best = max(best, (k, i, j), key=lambda run: run[0])
    return best


def non_system_digests(shape: RequestShape) -> list[int]:
    return [m.digest for m in shape.messages if m.role not in SYSTEM_ROLES]


@dataclass(slots=True)
class Overlap:
    """Why a request without a session key was taken as a later request of a conversation
    whose opening it does not share: `length` messages at `new_start` repeat `old_start`."""

    length: int
    old_start: int  # message index in the previous request
    new_start: int  # message index in this request


class Conversations:
    """The previous request of each conversation: by session key, else by opening message,
    else by the longest run of messages it repeats (a rewritten opening, a compacted history)."""

    __slots__ = ("_by_session", "_by_opening", "_by_instructions", "_conv_of", "_latest", "_memo", "_overlaps")

    def __init__(self) -> None:
        self._by_session: dict[str, RequestShape] = {}
        self._by_opening: dict[int, RequestShape] = {}
        self._by_instructions: dict[int, RequestShape] = {}
        # Conversation ids, not shapes, in the message index: a stale entry keeps no old shape alive.
        self._conv_of: dict[int, int] = {}
        self._latest: dict[int, RequestShape] = {}
        self._memo: tuple[int, RequestShape | None] = (-1, None)  # rules ask again for the same prompt
        self._overlaps: dict[int, Overlap] = {}  # prompt index -> evidence, for matches by overlap

    def previous(self, shape: RequestShape) -> RequestShape | None:
        """The request this one should extend, if any (it must share a non-system message)."""
        if self._memo[0] == shape.index:
            return self._memo[1]
        prev = self._find(shape)
        self._memo = (shape.index, prev)
        return prev

    def overlap(self, shape: RequestShape) -> Overlap | None:
        """The shared run that matched `shape` to its previous request, when the opening differed."""
        return self._overlaps.get(shape.index)

    def _find(self, shape: RequestShape) -> RequestShape | None:
        if shape.session is not None:
            prev = self._by_session.get(shape.session)
        else:
            opening = shape.opening
            prev = self._by_opening.get(opening) if opening is not None else None
            if prev is None:
                return self._by_overlap(shape)
            # The same opening message is weak evidence (many users ask the same first
            # question): the request must also be longer, i.e. a later turn.
            if len(prev.messages) >= len(shape.messages):
                return None
        if prev is None or not (prev.non_system() & shape.non_system()):
            return None
        return prev

    def _by_overlap(self, shape: RequestShape) -> RequestShape | None:
        """The conversation sharing the longest run of >= MIN_RUN consecutive non-system messages
        (never the system prompt alone: independent conversations of one application share it)."""
        mine = non_system_digests(shape)
        best: tuple[int, int, int] = (MIN_RUN - 1, 0, 0)
        found: RequestShape | None = None
        tried: set[int] = set()
        for d in mine:
            conv = self._conv_of.get(d)
            if conv is None or conv in tried:
                continue
            tried.add(conv)
            prev = self._latest[conv]
            run = longest_common_run(non_system_digests(prev), mine)
            if run[0] > best[0]:
                best, found = run, prev
        if found is not None:
            self._overlaps[shape.index] = Overlap(best[0], _message_at(found, best[1]), _message_at(shape, best[2]))
        return found

    def previous_tools(self, shape: RequestShape) -> RequestShape | None:
        """The request whose tools this one should repeat: its session's last; without a session
        key, the last request with the same system prompt (the same application), if both have tools."""
        if shape.session is not None:
            return self._by_session.get(shape.session)
        key = shape.instructions
        prev = self._by_instructions.get(key) if key is not None else None
        return prev if prev is not None and prev.tools and shape.tools else None

    def previous_in_session(self, shape: RequestShape) -> RequestShape | None:
        return self._by_session.get(shape.session) if shape.session is not None else None

    def record(self, shape: RequestShape) -> None:
        prev = self.previous(shape)
        self._overlaps.pop(shape.index, None)  # only needed while this prompt's rules run
        shape.conversation = prev.conversation if prev is not None else len(self._latest)
        self._latest[shape.conversation] = shape
        for d in non_system_digests(shape)[-INDEX_TAIL:]:
            self._conv_of.pop(d, None)  # re-insert: the newest entries are the last evicted
            self._conv_of[d] = shape.conversation
        while len(self._conv_of) > INDEX_CAP:
            del self._conv_of[next(iter(self._conv_of))]
        if shape.session is not None:
            self._by_session[shape.session] = shape
        opening = shape.opening
        if opening is not None:
            self._by_opening[opening] = shape
        instructions = shape.instructions
        if instructions is not None:
            self._by_instructions[instructions] = shape


def _message_at(shape: RequestShape, non_system_index: int) -> int:
    """The message index of the n-th non-system message."""
    positions = [i for i, m in enumerate(shape.messages) if m.role not in SYSTEM_ROLES]
    return positions[non_system_index]
