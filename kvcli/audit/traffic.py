"""Real traffic in: request+response pairs, the provider's actual cached tokens beside the prediction.

A logged pair is `{"request": BODY, "response": RESPONSE}` (optionally with `custom_id`/`id`):
the request is audited as any request, and the response's usage says what the provider served
from its cache: OpenAI `usage.prompt_tokens_details.cached_tokens` (of `prompt_tokens`),
Anthropic `usage.cache_read_input_tokens` (of `input_tokens` + cache reads + cache writes).
The response's `created` is the request's time when the request has none. Each request whose
actual cached tokens differ from the prediction by a block or more is named, with the likelier
side: the provider cached less (routing to another machine, expiry, eviction) or more (the
audit's rendering or tokenizer, or a prefix from traffic outside this file).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kvcli.audit.records import InputProblem, PromptRequest, PromptResult, RenderedPrompt
from kvcli.audit.sources import check_paths, iter_records
from kvcli.audit.style import Style
from kvcli.numbers import percent

LESS = ("the provider cached less than predicted: the request went to another machine (routing), "
        "or the prefix expired or was evicted")
MORE = ("the provider cached more than predicted: the audit's rendering or tokenizer differs from the "
        "provider's, or a prefix came from traffic outside this file")


@dataclass(slots=True)
class Actual:
    cached: int
    prompt_tokens: int


def is_pair(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("request"), dict) and isinstance(value.get("response"), dict)


def _count(node: Any, *path: str) -> int | None:
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, int) and not isinstance(node, bool) else None


def actual_of(response: dict[str, Any]) -> Actual | None:
    """The response's cached prompt tokens, OpenAI or Anthropic usage; None without usage."""
    body = response.get("body") if isinstance(response.get("body"), dict) else response  # a batch output line
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return None
    if "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage:
        read = _count(usage, "cache_read_input_tokens") or 0
        total = read + (_count(usage, "input_tokens") or 0) + (_count(usage, "cache_creation_input_tokens") or 0)
        return Actual(read, total)
    prompt = _count(usage, "prompt_tokens")
    if prompt is None:
        prompt = _count(usage, "input_tokens")  # the Responses API
    cached = _count(usage, "prompt_tokens_details", "cached_tokens")
    if cached is None:
        cached = _count(usage, "input_tokens_details", "cached_tokens")
    return Actual(cached or 0, prompt or 0)


def unwrap(value: dict[str, Any]) -> tuple[dict[str, Any], Actual | None]:
    """The request to audit (with the pair's id and the response's time) and what the provider did."""
    request = dict(value["request"])
    for key in ("custom_id", "id", "request_id"):
        if key in value and key not in request:
            request[key] = value[key]
    created = value["response"].get("created")
    if isinstance(created, (int, float)) and "created" not in request and "timestamp" not in request:
        request["created"] = created
    return request, actual_of(value["response"])


def batch_actual(line: Any) -> tuple[str, Actual | None] | None:
    """A batch output line's (custom_id, usage): OpenAI `{"custom_id", "response": {"body"}}`,
    Anthropic `{"custom_id", "result": {"message"}}`; None for a line that is neither."""
    if not isinstance(line, dict) or not isinstance(line.get("custom_id"), str):
        return None
    response = line.get("response")
    if isinstance(response, dict):
        return line["custom_id"], actual_of(response)
    result = line.get("result")
    message = result.get("message") if isinstance(result, dict) else None
    return line["custom_id"], actual_of(message) if isinstance(message, dict) else None


@dataclass(slots=True)
class Responses:
    """--responses FILE: a batch output file, joined with the audited input by custom_id."""

    path: str
    by_id: dict[str, Actual | None] = field(default_factory=dict)
    joined: int = 0

    def join(self, items: Iterable[Any]) -> Iterator[Any]:
        for item in items:
            if isinstance(item, PromptRequest) and item.actual is None and item.id in self.by_id:
                item.actual = self.by_id[item.id]
                self.joined += 1
            yield item


def load_responses(path: str, on_problem: Callable[[InputProblem], None]) -> Responses:
    """The batch output file's usage by custom_id; a line that is not a batch output line is a problem."""
    responses = Responses(path)
    for item in iter_records(check_paths([path])):
        if isinstance(item, InputProblem):
            on_problem(item)
            continue
        found = None if item.is_text else batch_actual(item.value)
        if found is None:
            on_problem(InputProblem(item.where, "--responses: not a batch output line (custom_id with response or result)"))
            continue
        responses.by_id[found[0]] = found[1]
    return responses


@dataclass(slots=True)
class Disagreement:
    prompt: int
    id: str | None
    source: str
    predicted: int
    actual: int
    tokens: int
    provider_tokens: int
    why: str


@dataclass(slots=True)
class TrafficCompare:
    """An auditor observer: predicted against actual cached tokens, for requests with usage."""

    block_size: int
    requests: int = 0
    predicted: int = 0
    actual: int = 0
    tokens: int = 0
    provider_tokens: int = 0
    disagree: list[Disagreement] = field(default_factory=list)
    responses: Responses | None = None  # --responses: the batch output joined by custom_id

    def __call__(self, prompt: RenderedPrompt, ids: array, hashes: list[bytes], result: PromptResult) -> None:
        actual = prompt.request.actual
        if actual is None:
            return
        self.requests += 1
        self.predicted += result.cached_tokens
        self.actual += actual.cached
        self.tokens += result.tokens
        self.provider_tokens += actual.prompt_tokens
        if abs(result.cached_tokens - actual.cached) >= self.block_size:
            why = LESS if actual.cached < result.cached_tokens else MORE
            self.disagree.append(Disagreement(result.index, result.id, result.source, result.cached_tokens,
                                              actual.cached, result.tokens, actual.prompt_tokens, why))


def traffic_lines(t: TrafficCompare, limit: int, style: Style) -> list[str]:
    if not t.requests:
        return []
    rate = t.actual / t.provider_tokens if t.provider_tokens else 0.0
    lines = ["", style("── provider's actual cache ", "bold") + "─" * 45,
             f"  {t.requests:,} request(s) with usage: the provider served {t.actual:,} of {t.provider_tokens:,} "
             f"prompt tokens from its cache ({percent(rate)}); the audit predicted {t.predicted:,} of {t.tokens:,} "
             f"({percent(t.predicted, max(t.tokens, 1))})",
             *_joined(t),
             f"  {t.requests - len(t.disagree):,} agree within a block ({t.block_size} tokens), "
             f"{len(t.disagree):,} disagree"]  # fmt: skip
    for d in t.disagree[:limit]:
        name = f' "{d.id}"' if d.id else ""
        lines.append(f"  prompt {d.prompt}{name}  {d.source}: predicted {d.predicted:,}, actual {d.actual:,} "
                     f"cached tokens: {d.why}")
    if len(t.disagree) > limit:
        lines.append(style(f"  ... {len(t.disagree) - limit:,} more (--limit, or --format json)", "dim"))
    return lines


def _joined(t: TrafficCompare) -> list[str]:
    r = t.responses
    if r is None:
        return []
    return [f"  joined {r.joined:,} request(s) with {r.path} by custom_id ({len(r.by_id):,} output lines)"]


def traffic_dict(t: TrafficCompare) -> dict[str, Any] | None:
    if not t.requests:
        return None
    r = t.responses
    return {"joined": None if r is None else {"file": r.path, "output_lines": len(r.by_id), "joined": r.joined},
            "requests": t.requests, "actual_cached_tokens": t.actual, "provider_prompt_tokens": t.provider_tokens,
            "predicted_cached_tokens": t.predicted, "tokens": t.tokens, "agree": t.requests - len(t.disagree),
            "disagree": [{"prompt": d.prompt, "id": d.id, "source": d.source, "predicted": d.predicted,
                          "actual": d.actual, "tokens": d.tokens, "provider_tokens": d.provider_tokens,
                          "why": d.why} for d in t.disagree]}  # fmt: skip
