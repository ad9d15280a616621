"""One input line (bytes) -> a validated :class:`LineRequest`, or a :class:`FailedLine`; never raises.

The line is read by the shared request model (:func:`kvcli.inputs.parse_request`,
the same code the audit uses); here its sampling fields meet the CLI defaults and
the fields generate cannot honour become that line's error. Unknown fields are
reported (an error with ``--strict``). Everything but the tokenizer-dependent
checks happens here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from kvcli.batch.fields import build_params
from kvcli.batch.records import FailedLine, LineError, LineId, LineRequest, Style
from kvcli.batch.source import DEFAULT_MAX_LINE_BYTES, RawLine
from kvcli.engine.request import SamplingParams
from kvcli.inputs import Format, InputRequest, parse_request, type_name
from kvcli.inputs.fields import line_id
from kvcli.structured import line_constraint

_STYLES = {Format.OPENAI_CHAT: Style.CHAT, Format.OPENAI_COMPLETION: Style.COMPLETION}


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
        style = _style_guess(obj)  # an OpenAI-shaped error result even if the url is bad
        ident = _ident(obj, raw.line_no)
        req = parse_request(obj, opts.strict)
        style = _style(req)
        _check_supported(req)
        _constrain(req)
        params = build_params(opts.defaults, req.sampling, ident.key, opts.seed, req.prefix)
        return LineRequest(ident, style, req.prompt, params, req.cache_salt, req.ignored)
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
        raise LineError(None, f"expected a JSON object, got {type_name(obj)}", "invalid_json")
    return obj


def _style_guess(obj: dict[str, Any]) -> Style:
    openai_line = "body" in obj or "url" in obj or "method" in obj
    return Style.COMPLETION if obj.get("url") == "/v1/completions" else (
        Style.CHAT if openai_line else Style.PLAIN)


def _ident(obj: dict[str, Any], line_no: int) -> LineId:
    key, name = line_id(obj)
    return LineId(line_no, key, name) if key is not None else LineId.from_line_no(line_no)


def _style(req: InputRequest) -> Style:
    if req.format is Format.OPENAI_RESPONSES:
        raise LineError("url", "generate answers /v1/chat/completions and /v1/completions; "
                        "give a Responses body as a plain line", code="invalid_url")
    return _STYLES.get(req.format, Style.PLAIN)


def _check_supported(req: InputRequest) -> None:
    """Fields the shared model reads (the audit uses them) that generate cannot honour yet."""
    if req.prompt.messages is not None:
        req.prompt.chat()  # non-text content parts fail here, naming the part


def _constrain(req: InputRequest) -> None:
    """``response_format`` / ``structured_outputs`` -> the one constraint the engine enforces."""
    name = "text.format" if req.format is Format.RESPONSES else "response_format"
    try:
        constraint = line_constraint(req.sampling.pop("structured_outputs", None),
                                     req.response_format, req.prefix, name)
    except ValueError as err:
        raise LineError.from_value_error(err) from None
    if constraint is not None:
        req.sampling["structured_outputs"] = constraint
