"""unsorted-json: the same JSON value serialized differently (key order, separators, escaping).

At a divergence: the innermost JSON value around the first differing character is
parsed on both sides; equal values with different text break the prefix (error).
Tool-call arguments and tool definitions are also indexed by their canonical form,
so the same value written two ways is reported even away from a divergence
(warning), and arguments whose keys are not sorted get a one-time hint (info).
"""

from __future__ import annotations

import orjson

from kvcli.audit.records import Finding
from kvcli.audit.render import canonical_json
from kvcli.audit.rules.base import AuditContext, PromptView, Rule, prompt_name
from kvcli.audit.rules.jsonspan import (
    decode_at,
    difference_kind,
    openers,
    unsorted_path,
)
from kvcli.audit.shapes import digest
from kvcli.audit.tokenizers import common_prefix_length

FIX = (
    "Serialize JSON deterministically everywhere it enters a prompt: sorted keys and fixed "
    'separators, e.g. json.dumps(value, sort_keys=True, separators=(",", ":")) in Python, or a '
    "canonical JSON encoder (Go maps and Swift dictionaries iterate in random order)."
)
INDEX_LIMIT = 200_000


class UnsortedJson(Rule):
    id = "unsorted-json"
    phase = "divergence"
    summary = "the same JSON value serialized with a different key order, separators or escaping"

    def check(self, view: PromptView) -> list[Finding]:
        contrast = view.contrast()
        if contrast is None or contrast.this_ends_first or contrast.other_ends_first:
            return []
        this, other, start = contrast.this, contrast.other, contrast.start
        seg = view.rendered.segment_at(start)
        for opener in openers(this, start, seg.start if seg else 0):  # JSON does not span segments
            mine = decode_at(this, opener)
            if mine is None or mine[1] <= start:
                continue  # not JSON, or a value that ends before the difference
            theirs = decode_at(other, opener)
            if theirs is None:
                return []
            a_raw, b_raw = this[opener : mine[1]], other[opener : theirs[1]]
            same = canonical_json(mine[0])
            if same is None or same != canonical_json(theirs[0]) or a_raw == b_raw:
                return []
            kind = difference_kind(a_raw, b_raw, mine[0], theirs[0])
            after = common_prefix_length(this[mine[1] :], other[theirs[1] :])
            stake = view.tokens_in(mine[1] - start + after)
            message = (
                f"the same JSON value (char {opener}{', ' + seg.label if seg else ''}) is serialized "
                f"differently than in {prompt_name(self.ctx, contrast.against)}, by {kind}: the shared prefix "
                f"ends at token {view.lcp}; ~{stake} more tokens could be cached"
            )
            excerpt = view.contrast_excerpt(contrast)
            return [view.finding(self.id, "error", start, message, FIX, against=contrast.against, stake=stake, excerpt=excerpt)]
        return []


class JsonConsistency(Rule):
    """Tool-call arguments and tool definitions seen before in another serialization."""

    id = "unsorted-json"
    phase = "static"
    summary = UnsortedJson.summary

    def __init__(self, ctx: AuditContext) -> None:
        super().__init__(ctx)
        self._raw_seen: set[bytes] = set()
        self._messages_seen: set[int] = set()
        self._by_canonical: dict[bytes, tuple[bytes, int]] = {}
        self._reported: set[bytes] = set()
        self._hinted: set[str] = set()

    def _remember(self, canonical: bytes, raw: bytes, prompt: int) -> tuple[bytes, int]:
        if len(self._by_canonical) >= INDEX_LIMIT:
            self._by_canonical.clear()
        return self._by_canonical.setdefault(canonical, (raw, prompt))

    def check(self, view: PromptView) -> list[Finding]:
        if view.shape is None or any(f.rule == self.id for f in view.findings):
            return []
        found: list[Finding] = []
        for tool in view.shape.tools:
            if tool.raw in self._raw_seen:
                continue
            self._raw_seen.add(tool.raw)
            first = self._remember(tool.canonical, tool.raw, view.index)
            if first[0] != tool.raw and tool.canonical not in self._reported:
                self._reported.add(tool.canonical)
                found.append(self._mismatch(view, tool.start, f"tool '{tool.name}'", first[1]))
        for start, name, text in self._arguments(view):
            found.extend(self._check_arguments(view, start, name, text))
        return found

    def _arguments(self, view: PromptView) -> list[tuple[int, str, str]]:
        """(char, function name, arguments text) of each tool call in a message not seen before."""
        calls = []
        messages = view.rendered.request.messages or []
        prints = view.shape.messages if view.shape else []
        for _i, (message, printed) in enumerate(zip(messages, prints, strict=False)):
            if printed.digest in self._messages_seen or not message.get("tool_calls"):
                continue
            if len(self._messages_seen) >= INDEX_LIMIT:
                self._messages_seen.clear()
            self._messages_seen.add(printed.digest)
            seg_start = printed.start
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                arguments = function.get("arguments")
                if isinstance(arguments, str) and arguments.lstrip().startswith("{"):
                    at = view.text.find(arguments, seg_start)
                    calls.append((max(at, seg_start), str(function.get("name")), arguments))
        return calls

    def _check_arguments(self, view: PromptView, start: int, name: str, text: str) -> list[Finding]:
        raw = digest(text)
        if raw in self._raw_seen:
            return []
        self._raw_seen.add(raw)
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            return []
        canonical = digest(canonical_json(value) or text)
        first = self._remember(canonical, raw, view.index)
        if first[0] != raw and canonical not in self._reported:
            self._reported.add(canonical)
            return [self._mismatch(view, start, f"arguments of '{name}'", first[1])]
        path = unsorted_path(value)
        if path is not None and name not in self._hinted:
            self._hinted.add(name)
            message = (
                f"keys of the arguments of '{name}' are not sorted (at {path}): fine while every "
                "request writes them the same way, a cache miss as soon as one serializer differs"
            )
            return [view.finding(self.id, "info", start, message, FIX)]
        return []

    def _mismatch(self, view: PromptView, char: int, what: str, first: int) -> Finding:
        message = (
            f"{what} is the same JSON value as in {prompt_name(self.ctx, first)} but serialized "
            "differently (key order, separators or escaping): any prefix reaching it cannot be shared"
        )
        return view.finding(self.id, "warning", char, message, FIX, against=first)
