"""Any accepted line -> one :class:`InputRequest` (the request model both commands share).

Line shapes:

* plain: exactly one of ``prompt`` / ``messages`` (+ ``tools``) / ``prompt_token_ids``,
  an optional id, ``cache_salt`` and any SamplingParams field;
* an Anthropic Messages body (``messages`` with a top-level ``system``), or Anthropic's
  batch line ``{"custom_id", "params"}``;
* an OpenAI Responses body (``input``, ``instructions``);
* an OpenAI Batch line ``{"custom_id", "method": "POST", "url", "body"}`` for chat
  completions, completions, responses or embeddings;
* a plain embeddings line ``{"input", "task": "embed"}`` (``embeddings.py``).

Nothing is reordered or re-serialized: dicts keep their key order.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from kvcli.inputs import embeddings, openai
from kvcli.inputs.content import check_content
from kvcli.inputs.errors import LineError, type_name
from kvcli.inputs.fields import (
    ID_FIELDS,
    SAMPLING_FIELDS,
    SESSION_KEYS,
    get_str,
    line_id,
    present,
    renamed,
    sampling_overrides,
    session_key,
    unknown_fields,
)
from kvcli.inputs.messages import check_messages, check_tools
from kvcli.inputs.prompt import Prompt, check_text, check_token_ids, template_kwargs
from kvcli.structured.guided import GUIDED_FIELDS


class Format(enum.Enum):
    PLAIN = "plain"
    OPENAI_CHAT = "openai-chat"
    OPENAI_COMPLETION = "openai-completion"
    OPENAI_RESPONSES = "openai-responses"  # a Batch API line for /v1/responses
    RESPONSES = "responses"  # a bare Responses body
    ANTHROPIC = "anthropic"
    OPENAI_EMBEDDINGS = "openai-embeddings"  # a Batch API line for /v1/embeddings
    EMBED = "embed"  # a plain {"input", "task": "embed"} line


@dataclass(slots=True)
class InputRequest:
    format: Format
    prompt: Prompt
    id: str | None = None
    id_field: str | None = None  # "custom_id" | "id" | "request_id"
    sampling: dict[str, Any] = field(default_factory=dict)  # SamplingParams names, as given
    prefix: str = ""  # where the body's fields live: "", "body." or "params."
    cache_salt: str | None = None
    session: str | None = None
    model: str | None = None
    response_format: Any = None  # chat's response_format, or Responses' text.format
    guided: dict[str, Any] = field(default_factory=dict)  # vLLM's older guided_* fields, as given
    ignored: list[str] = field(default_factory=list)  # unknown fields (not strict)
    # An embeddings request: its inputs (``prompt`` is the first), encoding and dimensions.
    embed: embeddings.EmbedRequest | None = None


_META = (*ID_FIELDS, *SESSION_KEYS, "metadata", "cache_salt", "model")
PLAIN_FIELDS = (*_META, *SAMPLING_FIELDS, *GUIDED_FIELDS, "prompt", "text", "messages",
                "prompt_token_ids", "tools", "tool_choice", "parallel_tool_calls", "response_format",
                "chat_template_kwargs")
ANTHROPIC_FIELDS = (*_META, *GUIDED_FIELDS, "messages", "system", "tools", "tool_choice",
                    "max_tokens", "temperature", "top_p", "top_k", "stop_sequences", "stream",
                    "thinking")
_ANTHROPIC_SAMPLING = {"max_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p",
                       "top_k": "top_k", "stop_sequences": "stop"}
_URL_FORMATS = {openai.CHAT_URL: Format.OPENAI_CHAT, openai.COMPLETIONS_URL: Format.OPENAI_COMPLETION,
                openai.RESPONSES_URL: Format.OPENAI_RESPONSES,
                embeddings.EMBEDDINGS_URL: Format.OPENAI_EMBEDDINGS}


def parse_request(obj: Any, strict: bool = False) -> InputRequest:
    """The request a decoded JSON line asks for; raises :class:`LineError` naming the field."""
    if not isinstance(obj, dict):
        raise LineError(None, f"expected a JSON object, got {type_name(obj)}")
    ident, id_field = line_id(obj)
    if "body" in obj or "url" in obj or "method" in obj:
        req = _openai_line(obj, strict)
    elif "params" in obj and "custom_id" in obj:
        req = _body_request(_object(obj["params"], "params"), "params.", strict)
        req.ignored = unknown_fields(obj, ("custom_id", "params"), strict) + req.ignored
    else:
        req = _body_request(obj, "", strict)
    req.id, req.id_field = ident, id_field
    body = obj.get("body") or obj.get("params") or {}
    req.cache_salt = _cache_salt(obj, body, req.prefix)
    req.session = session_key(obj) or (session_key(body, req.prefix) if body else None)
    return req


def _object(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise LineError(name, f"expected an object, got {type_name(value)}")
    return present(value)


def _cache_salt(obj: dict[str, Any], body: Any, prefix: str) -> str | None:
    outer = get_str(obj, "cache_salt")
    inner = get_str(body, "cache_salt", prefix=prefix) if isinstance(body, dict) and prefix else None
    if outer and inner and outer != inner:
        raise LineError(f"{prefix}cache_salt", "differs from the line's cache_salt; give one")
    return inner or outer


def _openai_line(obj: dict[str, Any], strict: bool) -> InputRequest:
    ignored = unknown_fields(obj, ("custom_id", "method", "url", "body", "cache_salt"), strict)
    kind = _URL_FORMATS[openai.check_url(obj)]
    body = _object(obj.get("body"), "body")
    if kind is Format.OPENAI_EMBEDDINGS:
        ignored += unknown_fields(body, embeddings.EMBEDDING_FIELDS, strict, "body.")
        return _embed_request(kind, body, "body.", ignored)
    openai.check_no_stream(body, "body.")
    known, read = {
        Format.OPENAI_CHAT: (openai.CHAT_FIELDS, openai.chat_body),
        Format.OPENAI_COMPLETION: (openai.COMPLETION_FIELDS, openai.completion_body),
        Format.OPENAI_RESPONSES: (openai.RESPONSES_FIELDS, openai.responses_body),
    }[kind]
    ignored += unknown_fields(body, (*known, *GUIDED_FIELDS), strict, "body.")
    prompt, sampling = read(body, "body.")
    return InputRequest(kind, prompt, sampling=sampling, prefix="body.", model=get_str(body, "model", prefix="body."),
                        response_format=_response_format(body), guided=_guided(body),
                        ignored=ignored)


def _body_request(obj: dict[str, Any], prefix: str, strict: bool) -> InputRequest:
    """A request body without a Batch API envelope: plain, Anthropic Messages or Responses."""
    body = present(obj)
    if embeddings.is_embed_line(body):
        ignored = unknown_fields(body, (*embeddings.PLAIN_EMBED_FIELDS, *_META), strict, prefix)
        return _embed_request(Format.EMBED, body, prefix, ignored)
    if "input" in body:
        ignored = unknown_fields(body, (*openai.RESPONSES_FIELDS, *GUIDED_FIELDS, *_META), strict,
                                 prefix)
        prompt, sampling = openai.responses_body(body, prefix)
        kind = Format.RESPONSES
    elif "system" in body or prefix == "params.":
        openai.check_no_stream(body, prefix)
        ignored = unknown_fields(body, ANTHROPIC_FIELDS, strict, prefix)
        prompt, sampling = _anthropic(body, prefix), renamed(body, _ANTHROPIC_SAMPLING)
        kind = Format.ANTHROPIC
    else:
        ignored = unknown_fields(body, PLAIN_FIELDS, strict, prefix)
        prompt, sampling = _plain_prompt(body, prefix), sampling_overrides(body, SAMPLING_FIELDS, prefix)
        kind = Format.PLAIN
    return InputRequest(kind, prompt, sampling=sampling, prefix=prefix,
                        model=get_str(body, "model", prefix=prefix),
                        response_format=_response_format(body), guided=_guided(body),
                        ignored=ignored)


def _embed_request(kind: Format, body: dict[str, Any], prefix: str,
                   ignored: list[str]) -> InputRequest:
    embed = embeddings.embeddings_body(body, prefix)
    return InputRequest(kind, embed.inputs[0], prefix=prefix,
                        model=get_str(body, "model", prefix=prefix), ignored=ignored, embed=embed)


def _anthropic(body: dict[str, Any], prefix: str) -> Prompt:
    system = body.get("system")
    check_content(system, f"{prefix}system")
    return Prompt(messages=check_messages(body.get("messages"), f"{prefix}messages"),
                  tools=check_tools(body.get("tools"), f"{prefix}tools"), system=system,
                  source=f"{prefix}messages", system_source=f"{prefix}system")


def _plain_prompt(body: dict[str, Any], prefix: str) -> Prompt:
    """Exactly one of prompt (or text) / messages / prompt_token_ids."""
    given = [k for k in ("prompt", "text", "messages", "prompt_token_ids") if k in body]
    if len(given) != 1:
        what = "none" if not given else " and ".join(given)
        raise LineError(prefix + (given[1] if len(given) > 1 else "prompt"),
                        f"expected exactly one of prompt, messages, prompt_token_ids or input, got {what}")
    name = prefix + given[0]
    tools = check_tools(body.get("tools"), f"{prefix}tools")
    for name_only_chat in ("tools", "chat_template_kwargs"):
        if body.get(name_only_chat) is not None and given[0] != "messages":
            raise LineError(f"{prefix}{name_only_chat}", "only valid together with messages")
    if given[0] == "messages":
        return Prompt(messages=check_messages(body["messages"], name), tools=tools, source=name,
                      template_kwargs=template_kwargs(body, prefix))
    if given[0] == "prompt_token_ids":
        return Prompt(token_ids=check_token_ids(body["prompt_token_ids"], name), source=name)
    value = body[given[0]]
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        value = value[0]  # ["text"], as completions take it
    return Prompt(text=check_text(value, name), source=name)


def _response_format(body: dict[str, Any]) -> Any:
    """The structured-output request: chat's response_format, or Responses' text.format."""
    text = body.get("text")
    if isinstance(text, dict) and text.get("format") is not None:
        return text["format"]
    return body.get("response_format")


def _guided(body: dict[str, Any]) -> dict[str, Any]:
    """vLLM's older names for structured_outputs (kvcli.structured.guided reads them)."""
    return {name: body[name] for name in GUIDED_FIELDS if body.get(name) is not None}
