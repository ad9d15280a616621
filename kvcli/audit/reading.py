"""Where `kvcli audit` gets its prompts: the records of its PATHs as requests (with their
times), and the two prompts `--diff` picks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import IO

from kvcli.audit.otel import is_otel, otel_requests
from kvcli.audit.parse import to_request
from kvcli.audit.records import InputProblem, PromptRequest, PromptResult
from kvcli.audit.sources import InputError, RawRecord, check_paths, iter_records
from kvcli.audit.timing import TimeFieldError, request_time
from kvcli.audit.traffic import is_pair, unwrap


def requests(paths: list[str], stdin: IO[bytes] | None, time_field: str | None = None) -> Iterator[PromptRequest | InputProblem]:
    for item in iter_records(paths, stdin):
        if not isinstance(item, RawRecord):
            yield item
        elif not item.is_text and is_otel(item.value):
            yield from span_requests(item, time_field)
        else:
            yield request_of(item, time_field)


def span_requests(item: RawRecord, time_field: str | None) -> Iterator[PromptRequest | InputProblem]:
    """An OpenTelemetry export: one request per GenAI span, with the span's usage."""
    for where, body, actual in otel_requests(item.value, item.where):
        if isinstance(body, str):
            yield InputProblem(where, body)
            continue
        request = to_request(body, where)
        if isinstance(request, PromptRequest):
            request.actual = actual
            request = _timed(request, body, time_field, where)
        yield request


def _timed(request: PromptRequest, value: object, time_field: str | None, where: str) -> PromptRequest | InputProblem:
    try:
        request.time = request_time(value, time_field)
    except TimeFieldError as err:
        return InputProblem(where, str(err))
    return request


def request_of(item: RawRecord, time_field: str | None = None) -> PromptRequest | InputProblem:
    """One record as a request, with its time."""
    value, actual = unwrap(item.value) if not item.is_text and is_pair(item.value) else (item.value, None)
    request = to_request(value, item.where, item.is_text)
    if isinstance(request, PromptRequest) and not item.is_text:
        request.actual = actual
        return _timed(request, value, time_field, item.where)
    return request


Problem = Callable[[InputProblem], None]


def select(items: Iterator[PromptRequest | InputProblem], keys: tuple[str, str], on_problem: Problem) -> list[PromptRequest]:
    """The prompts named by `keys`: by id, else by 0-based index (streamed: nothing else is kept)."""
    by_id: dict[str, PromptRequest] = {}
    by_index: dict[str, PromptRequest] = {}
    position = 0
    for item in items:
        if isinstance(item, InputProblem):
            on_problem(item)
            continue
        if item.id in keys:
            by_id.setdefault(item.id, item)
        if str(position) in keys:
            by_index[str(position)] = item
        item.position = position
        position += 1
    picked = []
    for key in keys:
        found = by_id.get(key) or by_index.get(key)
        if found is None:
            raise InputError(f"--diff {key}: no prompt with that id or index (the input has {position})")
        picked.append(found)
    return picked


def diff_requests(paths: tuple[str, ...], diff: tuple[str, str], stdin: IO[bytes] | None, on_problem: Problem) -> list[PromptRequest]:
    if paths:
        return select(requests(check_paths(paths), stdin), diff, on_problem)
    picked = []
    for spec in diff:  # two files: the first prompt of each
        first = next((r for r in requests(check_paths([spec]), stdin) if not problem(r, on_problem)), None)
        if first is None:
            raise InputError(f"--diff {spec}: no prompt in it")
        picked.append(first)
    return picked


def problem(item: PromptRequest | InputProblem, on_problem: Problem) -> bool:
    if isinstance(item, InputProblem):
        on_problem(item)
        return True
    return False


def relabel(results: list[PromptResult], picked: list[PromptRequest]) -> None:
    """--diff audits the two prompts alone: name them by their places in the input again."""
    where = {r.index: req.position for r, req in zip(results, picked, strict=False)
             if req.position is not None}
    for result in results:
        result.index = where.get(result.index, result.index)
        for f in result.findings:
            f.prompt = where.get(f.prompt, f.prompt)
            f.against = where.get(f.against, f.against) if f.against is not None else None
