"""Per-token logprobs in the three output shapes (plain, chat.completion, text_completion).

The engine gives, for each generated token, ``{token_id: logprob}`` holding the
sampled token and the top-k alternatives; ``k`` is the request's ``logprobs``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Entry = dict[int, float]
Decode = Callable[[int], str]
RawBytes = Callable[[int], list[int]]


def _top(entry: Entry, k: int) -> list[tuple[int, float]]:
    return sorted(entry.items(), key=lambda kv: (-kv[1], kv[0]))[:k]


def plain_logprobs(token_ids: list[int], entries: list[Entry], k: int,
                   decode: Decode) -> list[dict[str, Any]]:
    return [
        {"token_id": tok, "token": decode(tok), "logprob": entry.get(tok),
         "top_logprobs": [{"token_id": t, "token": decode(t), "logprob": lp}
                          for t, lp in _top(entry, k)]}
        for tok, entry in zip(token_ids, entries, strict=False)
    ]


def chat_logprobs(token_ids: list[int], entries: list[Entry], k: int,
                  decode: Decode, raw: RawBytes) -> dict[str, Any]:
    """``bytes`` is the token's own bytes (``raw``), as OpenAI gives them: a token holding part
    of a UTF-8 character decodes alone to U+FFFD, whose bytes would say nothing."""
    def item(tok: int, lp: float | None) -> dict[str, Any]:
        return {"token": decode(tok), "logprob": lp, "bytes": raw(tok)}

    content = []
    for tok, entry in zip(token_ids, entries, strict=False):
        row = item(tok, entry.get(tok))
        row["top_logprobs"] = [item(t, lp) for t, lp in _top(entry, k)]
        content.append(row)
    return {"content": content}


def completion_logprobs(token_ids: list[int], entries: list[Entry], k: int,
                        decode: Decode) -> dict[str, Any]:
    tokens = [decode(t) for t in token_ids]
    offsets, pos = [], 0
    for text in tokens:
        offsets.append(pos)
        pos += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": [e.get(t) for t, e in zip(token_ids, entries, strict=False)],
        "top_logprobs": [{decode(t): lp for t, lp in _top(e, k)} for e in entries],
        "text_offset": offsets,
    }
