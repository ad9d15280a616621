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
from kvcli.batch.guard import internal_failure
from kvcli.batch.records import FailedLine, LineError, LineId, LineRequest, Style
from kvcli.batch.source import DEFAULT_MAX_LINE_BYTES, RawLine
from kvcli.inputs import Format, InputRequest, parse_request, type_name
from kvcli.inputs.embeddings import EMBEDDINGS_URL
from kvcli.inputs.errors import show_value
from kvcli.inputs.fields import line_id
from kvcli.inputs.openai import CHAT_URL, COMPLETIONS_URL, RESPONSES_URL
from kvcli.sampling_params import SamplingParams
from kvcli.structured import line_constraint
from kvcli.structured.tools import check_tool_choice, tool_constraint

_STYLES = {Format.OPENAI_CHAT: Style.CHAT, Format.OPENAI_COMPLETION: Style.COMPLETION,
           Format.OPENAI_RESPONSES: Style.RESPONSES, Format.OPENAI_EMBEDDINGS: Style.EMBEDDINGS,
           Format.EMBED: Style.EMBED}


@dataclass(slots=True)
class ParseOptions:
    defaults: SamplingParams = field(default_factory=SamplingParams)  # from the CLI flags
    strict: bool = False
    seed: int = 0  # run seed; a line without "seed" gets one derived from it and its id
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    tool_format: str | None = None  # the model's tool-call format (kvcli.structured.tools)
    models: tuple[str, ...] = ()  # names a line's "model" may give (--served-model-name); () any


def parse_line(raw: RawLine, opts: ParseOptions) -> LineRequest | FailedLine:
    ident = LineId.from_line_no(raw.line_no)
    style: Style | None = None
    try:
        obj = _decode(raw, opts.max_line_bytes)
        style = _style_guess(obj)  # an OpenAI-shaped error result even if the url is bad
        ident = _ident(obj, raw.line_no)
        _check_generate_url(obj)
        req = parse_request(obj, opts.strict)
        style = _style(req)
        _check_custom_id(req)
        other_model = _other_model(req, opts)
        if req.embed is not None:  # no sampling, template, grammar or tools: inputs only
            return LineRequest(ident, style, req.prompt, SamplingParams(), req.cache_salt,
                               req.ignored, field_prefix=req.prefix, other_model=other_model,
                               embed=req.embed)
        _check_supported(req)
        _constrain(req)
        tool_format = _tool_calls(req, obj, opts.tool_format)
        params = build_params(opts.defaults, req.sampling, ident.key, opts.seed, req.prefix)
        return LineRequest(ident, style, req.prompt, params, req.cache_salt, req.ignored,
                           field_prefix=req.prefix, tool_format=tool_format,
                           other_model=other_model, echo=_echo(req, obj))
    except LineError as err:
        return FailedLine(ident, style, err)
    except Exception as err:  # the per-line guard: a check no one wrote
        return internal_failure(ident, style, "reading the line", err)


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
    url = obj.get("url")
    by_url = {COMPLETIONS_URL: Style.COMPLETION, RESPONSES_URL: Style.RESPONSES,
              EMBEDDINGS_URL: Style.EMBEDDINGS}
    if isinstance(url, str) and url in by_url:
        return by_url[url]
    return Style.CHAT if openai_line else Style.EMBED if obj.get("task") == "embed" else Style.PLAIN


def _ident(obj: dict[str, Any], line_no: int) -> LineId:
    key, name = line_id(obj)
    return LineId(line_no, key, name) if key is not None else LineId.from_line_no(line_no)


#: The Batch API endpoints generate answers (all the shared request model reads).
GENERATE_URLS = (CHAT_URL, COMPLETIONS_URL, RESPONSES_URL, EMBEDDINGS_URL)


def _check_generate_url(obj: dict[str, Any]) -> None:
    """A Batch line's ``url``, refused with exactly the endpoints generate accepts."""
    url = obj.get("url")
    batch_line = any(name in obj for name in ("url", "body", "method"))
    if not batch_line or (isinstance(url, str) and url in GENERATE_URLS):
        return
    what = f"unsupported endpoint {show_value(url)}" if "url" in obj else "missing"
    raise LineError("url", f"{what}; kvcli generate accepts " + ", ".join(GENERATE_URLS[:-1])
                    + " and " + GENERATE_URLS[-1], code="invalid_url")


def _style(req: InputRequest) -> Style:
    return _STYLES.get(req.format, Style.PLAIN)


def _echo(req: InputRequest, obj: dict[str, Any]) -> dict[str, Any]:
    """The body fields a Responses result repeats (``ECHOED``), as the line gave them."""
    if req.format is not Format.OPENAI_RESPONSES:
        return {}
    from kvcli.batch.responses_out import ECHOED

    return {k: v for k, v in obj["body"].items() if k in ECHOED and v is not None}


def _check_custom_id(req: InputRequest) -> None:
    """An OpenAI Batch result is joined to its request by ``custom_id`` alone (vLLM's
    ``run-batch`` refuses a line without one): an invented id would join nothing."""
    if req.prefix == "body." and req.id_field != "custom_id":
        got = f" (it has {req.id_field!r}, which the Batch API does not read)" if req.id_field \
            else ""
        raise LineError("custom_id", "missing: an OpenAI Batch line needs a custom_id, the only "
                        f"field that joins its result to it{got}")


def _other_model(req: InputRequest, opts: ParseOptions) -> str | None:
    """The line's ``model`` when it names another than the one loaded (its line's error with
    ``--strict``, as vLLM answers 404; else run on the loaded model and counted)."""
    if req.model is None or not opts.models or req.model in opts.models:
        return None
    if opts.strict:
        raise LineError(f"{req.prefix}model", f"{req.model!r} is not the model this run serves "
                        f"({', '.join(map(repr, opts.models))}); --served-model-name NAME "
                        "accepts another name for it", "model_not_found")
    return req.model


def _check_supported(req: InputRequest) -> None:
    """Fields the shared model reads (the audit uses them) that generate cannot honour yet."""
    if req.sampling.get("prompt_logprobs") is not None:  # the engine has them; no output shape
        raise LineError(f"{req.prefix}prompt_logprobs", "not written by kvcli generate; "
                        "`kvcli perplexity` and the LLM API give them")
    if req.prompt.messages is not None:
        req.prompt.chat()  # non-text content parts fail here, naming the part


def _constrain(req: InputRequest) -> None:
    """``response_format`` / ``structured_outputs`` / vLLM's ``guided_*`` -> the one constraint
    the engine enforces."""
    responses = req.format in (Format.RESPONSES, Format.OPENAI_RESPONSES)
    name = "text.format" if responses else "response_format"
    try:
        constraint = line_constraint(req.sampling.pop("structured_outputs", None),
                                     req.response_format, req.prefix, name, req.guided)
    except ValueError as err:
        raise LineError.from_value_error(err) from None
    if constraint is not None:
        req.sampling["structured_outputs"] = constraint


def _tool_calls(req: InputRequest, obj: dict[str, Any], fmt: str | None) -> str | None:
    """``tool_choice``: "required" / a named function constrain the reply to calls in the
    model's format; the format replies are parsed with (None: no parsing)."""
    if req.format is Format.ANTHROPIC:  # its tool_choice has another shape: read by the audit
        return None
    body = obj.get("body") if req.prefix == "body." else obj
    try:
        choice = check_tool_choice(body.get("tool_choice"), req.prompt.tools,
                                   f"{req.prefix}tool_choice")
        if choice is None:
            return None
        constraint = tool_constraint(req.prompt.tools, choice, fmt, f"{req.prefix}tool_choice",
                                     f"{req.prefix}tools", body.get("parallel_tool_calls") is not False)
    except ValueError as err:
        raise LineError.from_value_error(err) from None
    if constraint is not None:
        if "structured_outputs" in req.sampling:
            raise LineError(f"{req.prefix}tool_choice", "conflicts with response_format / "
                            "structured_outputs on the same line; give one of them")
        req.sampling["structured_outputs"] = constraint
    return None if choice == "none" else fmt
