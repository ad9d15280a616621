"""One input line on its way to the engine: what it asks for, or why it cannot run.

Torch-free. A line is parsed into a :class:`LineRequest` (everything validated
except what needs the tokenizer) or fails with a :class:`LineError`, which the
job turns into a :class:`FailedLine` result so the rest of the batch continues.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from kvcli.inputs import LineError, clip
from kvcli.inputs import Prompt as PromptSpec
from kvcli.inputs.embeddings import EmbedRequest
from kvcli.reasoning import ReasoningParser
from kvcli.sampling_params import SamplingParams

__all__ = ["FailedLine", "LineError", "LineId", "LineRequest", "PromptSpec", "RejectedRequest",
           "Style", "clip"]


class Style(enum.Enum):
    """Which output format a line gets: its input's own."""

    PLAIN = "plain"  # {"prompt"} / {"messages"} / {"prompt_token_ids"} -> plain result line
    CHAT = "chat"  # OpenAI Batch line for /v1/chat/completions
    COMPLETION = "completion"  # OpenAI Batch line for /v1/completions
    RESPONSES = "responses"  # OpenAI Batch line for /v1/responses
    EMBEDDINGS = "embeddings"  # OpenAI Batch line for /v1/embeddings
    EMBED = "embed"  # plain {"input", "task": "embed"} -> {"id", ...CreateEmbeddingResponse}

    @property
    def plain(self) -> bool:
        """Its result carries the line's own id, not a Batch envelope."""
        return self in (Style.PLAIN, Style.EMBED)


@dataclass(slots=True)
class LineId:
    """How results are joined back to inputs and how --resume recognises done work.

    ``key`` is the line's ``custom_id`` / ``id``, or ``line-<N>`` (1-based line
    number) when it has none; ``field`` is the input field it came from.
    """

    line_no: int
    key: str
    field: str | None = None  # "id" | "custom_id" | None for a line-number id

    @classmethod
    def from_line_no(cls, line_no: int) -> LineId:
        return cls(line_no, f"line-{line_no}")


@dataclass(slots=True)
class LineRequest:
    ident: LineId
    style: Style
    prompt: PromptSpec
    params: SamplingParams
    cache_salt: str | None = None
    ignored_fields: list[str] = field(default_factory=list)  # unknown fields (not --strict)
    field_prefix: str = ""  # where the line's fields live ("body." on OpenAI Batch lines)
    tool_format: str | None = None  # replies are parsed for tool calls in this format
    other_model: str | None = None  # its "model" names another than the loaded one
    reasoning: ReasoningParser | None = None  # chat replies are split into reasoning + answer
    reasoning_inside: bool = False  # the reply starts inside its reasoning (the prompt opens it)
    echo: dict[str, Any] = field(default_factory=dict)  # request fields a Response repeats
    embed: EmbedRequest | None = None  # an embeddings line: its inputs, encoding, dimensions


@dataclass(slots=True)
class FailedLine:
    """A line that produced no completion; ``style`` is None when it was not even JSON."""

    ident: LineId
    style: Style | None
    error: LineError
    cause: BaseException | None = None  # an unexpected exception (kvcli/batch/guard.py)

    @property
    def describe(self) -> str:
        return str(self.error)


@dataclass(slots=True)
class RejectedRequest:
    """An engine that checks requests away from the caller (a Ray worker) cannot raise from
    ``add_request``; it hands the ``ValueError("field: reason")`` back through ``step()`` as this,
    and the job turns it into the same error result a local engine's exception gives."""

    request_id: str
    message: str
