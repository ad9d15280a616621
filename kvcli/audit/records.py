"""The audit's data: requests as read, prompts as rendered, per-prompt results and findings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from kvcli.inputs import PartText, Prompt

Severity = Literal["error", "warning", "info"]
SEVERITY_RANK: dict[str, int] = {"info": 0, "warning": 1, "error": 2}


class FieldError(ValueError):
    """A field of a request has the wrong type or value: str(err) is "field: reason"."""


@dataclass(slots=True)
class InputProblem:
    """A record or file that could not be audited: `where` is "file:line"."""

    where: str
    message: str
    empty: bool = False  # an input with no requests at all (not a malformed one)

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@dataclass(slots=True)
class PromptRequest:
    """One request as read: a plain prompt or a chat request (messages kept as given)."""

    source: str  # "file:line" or "file"
    id: str | None = None
    text: str | None = None  # plain prompt
    messages: list[Any] | None = None
    tools: list[Any] | None = None
    system: Any = None  # Anthropic-style top-level system (str or content blocks)
    response_format: Any = None
    model: str | None = None
    cache_salt: str | None = None
    session: str | None = None
    token_ids: list[int] | None = None  # prompt_token_ids: hashed as given (needs --model)
    prompt: Prompt | None = None  # the shared request model's prompt (None: a text file)
    position: int | None = None  # 0-based place in the input, where --diff picked it
    time: float | None = None  # seconds since the epoch (created, timestamp, --time-field)
    actual: Any = None  # traffic.Actual: what the provider cached, for a logged request+response pair
    cache_mode: str | None = None  # OpenAI prompt_cache_options.mode: "explicit" drops the implicit breakpoint

    @property
    def is_chat(self) -> bool:
        return self.messages is not None

    def template_messages(self, part_text: PartText) -> list[dict[str, Any]]:
        """What the model's chat template renders: the content cleaned as generate cleans it."""
        prompt = self.prompt or Prompt(messages=self.messages, system=self.system)
        return prompt.chat(part_text)


SegmentKind = Literal["tools", "schema", "system", "message", "generation", "text"]


@dataclass(slots=True)
class Segment:
    """A span of the rendered text that came from one part of the request."""

    label: str  # "tools[1] get_weather", "messages[2] user", "system"
    kind: SegmentKind
    start: int
    end: int
    role: str | None = None
    message: int | None = None  # index into messages
    cache_control: bool = False  # Anthropic breakpoint on this block
    breakpoint: bool = False  # OpenAI prompt_cache_breakpoint on this block
    long_ttl: bool = False  # the Anthropic breakpoint has {"ttl": "1h"}


@dataclass(slots=True)
class RenderedPrompt:
    index: int
    request: PromptRequest
    text: str
    segments: list[Segment]
    add_special_tokens: bool = False
    messages: list[tuple[str, int, int]] = field(default_factory=list)  # (role, start, end) per message
    token_ids: list[int] | None = None  # given ids (prompt_token_ids): not tokenized again
    # A key per message when its span cannot hold all of it (a model's template wraps messages
    # in text of its own): the message as the template saw it. None: hash the span's text.
    message_keys: list[int] | None = None
    tools_ignored: bool = False  # the model's template renders the same prompt without the tools

    def segment_at(self, char: int) -> Segment | None:
        for seg in self.segments:
            if seg.start <= char < seg.end:
                return seg
        return self.segments[-1] if self.segments and char >= self.segments[-1].end else None


@dataclass(slots=True)
class Divergence:
    """Where a prompt first differs from the earlier prompt sharing its longest token prefix."""

    token: int
    block: int
    char: int
    against: int
    against_id: str | None = None


@dataclass(slots=True)
class Excerpt:
    """One line of each prompt around a position; `caret` is the column in both lines."""

    this: str
    other: str | None
    caret: int
    against: int | None = None


@dataclass(slots=True)
class Finding:
    rule: str
    severity: Severity
    prompt: int
    char: int | None
    message: str
    fix: str
    prompt_id: str | None = None
    segment: str | None = None
    against: int | None = None
    tokens_at_stake: int = 0  # estimated tokens that fixing this would let the cache reuse
    excerpt: Excerpt | None = None
    count: int = 1  # occurrences merged into this finding


@dataclass(slots=True)
class BlockView:
    """One block of a prompt's hash chain, for --show-blocks / --html / --diff."""

    hash: str  # short hex
    start: int
    end: int
    state: Literal["hit", "capped", "miss"]


@dataclass(slots=True)
class PromptResult:
    index: int
    id: str | None
    source: str
    session: str | None
    tokens: int
    cached_tokens: int
    divergence: Divergence | None
    findings: list[Finding] = field(default_factory=list)
    blocks: list[BlockView] | None = None
    tokens_at_stake: int = 0
    matched_tokens: int = 0  # tokens in blocks seen before (cached_tokens, or more when not counted)
    excerpt: Excerpt | None = None  # the first divergence, both sides
    bounded_cached_tokens: int | None = None  # at --cache-size (the engine's pool replayed)
