"""OpenAI Batch API request lines: ``{"custom_id", "method", "url", "body"}`` -> prompt and sampling.

The body is read like the OpenAI endpoint would read it (``max_completion_tokens``
over ``max_tokens``, chat ``logprobs``/``top_logprobs`` vs completions' integer
``logprobs``) plus vLLM's extra sampling fields (``top_k``, ``min_p``, ...).
``body.model`` is accepted and ignored: the batch runs on ``--model``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvcli.batch.fields import (
    SAMPLING_FIELDS,
    get_str,
    present,
    sampling_overrides,
    show_value,
    unknown_fields,
)
from kvcli.batch.prompts import check_messages, check_text, check_token_ids, check_tools
from kvcli.batch.records import LineError, PromptSpec, Style

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
URL_STYLES = {CHAT_URL: Style.CHAT, COMPLETIONS_URL: Style.COMPLETION}
LINE_FIELDS = ("custom_id", "method", "url", "body")

_BODY_SAMPLING = tuple(n for n in SAMPLING_FIELDS if n != "logprobs")
# Accepted and ignored: they do not change what a single offline completion computes.
_BODY_IGNORED = ("model", "user", "metadata", "store", "service_tier", "stream", "stream_options",
                 "tool_choice", "parallel_tool_calls")
_BODY_COMMON = (*_BODY_SAMPLING, *_BODY_IGNORED, "max_completion_tokens", "cache_salt", "logprobs")
_CHAT_BODY = (*_BODY_COMMON, "messages", "tools", "top_logprobs")
_COMPLETION_BODY = (*_BODY_COMMON, "prompt", "echo", "suffix", "best_of")


@dataclass(slots=True)
class OpenAIRequest:
    style: Style
    prompt: PromptSpec
    overrides: dict[str, Any]
    cache_salt: str | None = None
    ignored_fields: list[str] = field(default_factory=list)


def is_openai_line(obj: dict[str, Any]) -> bool:
    return "body" in obj or "url" in obj or "method" in obj


def openai_style(obj: dict[str, Any]) -> Style:
    method = obj.get("method", "POST")
    if method != "POST":
        raise LineError("method", f"expected \"POST\", got {show_value(method)}")
    url = obj.get("url")
    if not isinstance(url, str) or url not in URL_STYLES:  # a list or object is unhashable
        raise LineError("url", f"unsupported endpoint {show_value(url)}; supported: "
                        f"{CHAT_URL}, {COMPLETIONS_URL}", code="invalid_url")
    return URL_STYLES[url]


def parse_openai(obj: dict[str, Any], style: Style, strict: bool) -> OpenAIRequest:
    ignored = unknown_fields(obj, LINE_FIELDS, strict)
    body = obj.get("body")
    if not isinstance(body, dict):
        raise LineError("body", f"expected an object, got {show_value(body)}")
    body = present(body)
    if body.get("stream") not in (None, False):
        raise LineError("body.stream", "streaming is not supported in a batch")
    chat = style is Style.CHAT
    ignored += unknown_fields(body, _CHAT_BODY if chat else _COMPLETION_BODY, strict, "body.")
    overrides = sampling_overrides(body, _BODY_SAMPLING, "body.")
    if "max_completion_tokens" in body:
        overrides["max_tokens"] = body["max_completion_tokens"]
    if chat:
        prompt = PromptSpec(messages=check_messages(body.get("messages"), "body.messages"),
                            tools=check_tools(body.get("tools"), "body.tools"),
                            source="body.messages")
        logprobs = _chat_logprobs(body)
    else:
        prompt = _completion_prompt(body)
        logprobs = body.get("logprobs")
        _check_completion_extras(body, overrides.get("n", 1))
    if logprobs is not None:
        overrides["logprobs"] = logprobs
    return OpenAIRequest(style, prompt, overrides, get_str(body, "cache_salt", prefix="body."),
                         ignored)


def _chat_logprobs(body: dict[str, Any]) -> int | None:
    """Chat: ``logprobs`` is a bool and ``top_logprobs`` how many alternatives (0-20)."""
    wanted = body.get("logprobs", False)
    if not isinstance(wanted, bool):
        raise LineError("body.logprobs", f"expected true or false, got {show_value(wanted)}")
    top = body.get("top_logprobs")
    if top is not None and not wanted:
        raise LineError("body.top_logprobs", "requires \"logprobs\": true")
    if not wanted:
        return None
    if top is not None and (not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= 20):
        raise LineError("body.top_logprobs", f"expected an integer in [0, 20], got {show_value(top)}")
    return top or 0


def _completion_prompt(body: dict[str, Any]) -> PromptSpec:
    """``prompt`` may be a string, one token-id list, or a one-element list of either."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(p, list | str) for p in prompt):
        if len(prompt) != 1:
            raise LineError("body.prompt", f"{len(prompt)} prompts in one line; a batch line "
                            "holds one prompt (split them into separate lines)")
        prompt = prompt[0]
    if isinstance(prompt, list):
        return PromptSpec(token_ids=check_token_ids(prompt, "body.prompt"), source="body.prompt")
    return PromptSpec(text=check_text(prompt, "body.prompt"), source="body.prompt")


def _check_completion_extras(body: dict[str, Any], n: Any) -> None:
    if body.get("echo") not in (None, False):
        raise LineError("body.echo", "echoing the prompt is not supported")
    if "suffix" in body:
        raise LineError("body.suffix", "insertion (suffix) is not supported")
    if "best_of" in body and body["best_of"] != n:
        raise LineError("body.best_of", "best_of other than n is not supported")
