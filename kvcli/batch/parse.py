"""One input line (bytes) -> a validated :class:`LineRequest`, or a :class:`FailedLine`; never raises.

Accepted lines (one JSON object each):

* plain: exactly one of ``prompt`` / ``messages`` (+ ``tools``) / ``prompt_token_ids``,
  optional ``id`` or ``custom_id``, ``cache_salt`` and any SamplingParams field;
* OpenAI Batch: ``{"custom_id", "method": "POST", "url", "body"}`` (see openai_input).

Sampling fields override the CLI defaults. Unknown fields are reported (an error
with ``--strict``). Everything but the tokenizer-dependent checks happens here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from kvcli.batch.fields import (
    SAMPLING_FIELDS,
    build_params,
    get_str,
    present,
    sampling_overrides,
    unknown_fields,
)
from kvcli.batch.openai_input import is_openai_line, openai_style, parse_openai
from kvcli.batch.prompts import prompt_spec
from kvcli.batch.records import FailedLine, LineError, LineId, LineRequest, Style
from kvcli.batch.source import DEFAULT_MAX_LINE_BYTES, RawLine
from kvcli.engine.request import SamplingParams

PLAIN_FIELDS = ("prompt", "messages", "prompt_token_ids", "tools", "id", "custom_id", "cache_salt",
                *SAMPLING_FIELDS)


@dataclass(slots=True)
class ParseOptions:
    defaults: SamplingParams = field(default_factory=SamplingParams)  # from the CLI flags
    strict: bool = False
    seed: int = 0  # run seed; a line without "seed" gets one derived from it and its id
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES


def parse_line(raw: RawLine, opts: ParseOptions) -> LineRequest | FailedLine:
    ident = LineId.from_line_no(raw.line_no)
    style: Style | None = None
    try:
        obj = _decode(raw, opts.max_line_bytes)
        if is_openai_line(obj):
            style = Style.CHAT  # an OpenAI-shaped error result even if the url is bad
            ident = _line_id(obj, raw.line_no, ("custom_id",))
            style = openai_style(obj)
            req = parse_openai(obj, style, opts.strict)
            params = build_params(opts.defaults, req.overrides, ident.key, opts.seed, "body.")
            return LineRequest(ident, style, req.prompt, params, req.cache_salt, req.ignored_fields)
        style = Style.PLAIN
        ident = _line_id(obj, raw.line_no, ("id", "custom_id"))
        fields_ = present(obj)
        ignored = unknown_fields(fields_, PLAIN_FIELDS, opts.strict)
        prompt = prompt_spec(fields_)
        params = build_params(opts.defaults, sampling_overrides(fields_), ident.key, opts.seed)
        return LineRequest(ident, style, prompt, params, get_str(fields_, "cache_salt"), ignored)
    except LineError as err:
        return FailedLine(ident, style, err)


def _decode(raw: RawLine, limit: int) -> dict[str, Any]:
    if raw.data is None:
        raise LineError(None, f"line is {raw.size} bytes, over the limit of {limit} "
                        "(--max-line-bytes)", "line_too_long")
    try:
        obj = orjson.loads(raw.data)  # rejects invalid UTF-8 and nesting deeper than 1024
    except orjson.JSONDecodeError as err:
        raise LineError(None, f"invalid JSON: {err}", "invalid_json") from None
    if not isinstance(obj, dict):
        raise LineError(None, f"expected a JSON object, got {_json_type(obj)}", "invalid_json")
    return obj


def _line_id(obj: dict[str, Any], line_no: int, names: Iterable[str]) -> LineId:
    given = {n: v for n in names if (v := get_str(obj, n)) is not None}
    if not given:
        return LineId.from_line_no(line_no)
    if len(set(given.values())) > 1:
        raise LineError("custom_id", "differs from id; give one of them")
    # Prefer custom_id so that the result echoes the field the input used for joining.
    name = "custom_id" if "custom_id" in given else next(iter(given))
    return LineId(line_no, given[name], name)


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    return "a boolean" if isinstance(value, bool) else "a number"
