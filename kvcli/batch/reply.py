"""A chat reply as the result reports it: reasoning split from the answer (--reasoning-parser)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvcli.batch.records import LineRequest
from kvcli.engine.outputs import CompletionOutput
from kvcli.reasoning import END


@dataclass(frozen=True, slots=True)
class Reply:
    content: str | None  # the answer; None when the reply ended inside its reasoning
    reasoning: str | None = None
    reasoning_tokens: int = 0
    parsed: bool = False  # a reasoning parser read it: the result carries the reasoning fields

    def fields(self) -> dict[str, str | None]:
        """``reasoning_content`` and ``reasoning``: both, as vLLM now writes them."""
        return {"reasoning_content": self.reasoning, "reasoning": self.reasoning} \
            if self.parsed else {}


def read_reply(req: LineRequest, c: CompletionOutput,
               decode: Callable[[Sequence[int]], str]) -> Reply:
    if req.reasoning is None:
        return Reply(c.text)
    opener = req.params.structured_opener
    if opener is not None and c.token_ids[:1] != [opener]:
        return Reply(c.text, parsed=True)  # the grammar had the first token: all answer
    split = req.reasoning.split(c.text, req.reasoning_inside)
    if split.reasoning is None:
        return Reply(split.content, parsed=True)
    count = _tokens_through_end(c.token_ids, decode) if split.closed else len(c.token_ids)
    return Reply(split.content, split.reasoning, count, parsed=True)


def _tokens_through_end(ids: Sequence[int], decode: Callable[[Sequence[int]], str]) -> int:
    """The fewest leading tokens whose text holds ``</think>``: the reasoning's tokens, markup
    included (a binary search: a few decodes, whatever the reply's length)."""
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if END in decode(ids[:mid]):
            hi = mid
        else:
            lo = mid + 1
    return lo
