"""OpenAI request bodies: chat completions, completions and (as messages) Responses.

A body is read as the OpenAI endpoint reads it (``max_completion_tokens`` over
``max_tokens``, chat ``logprobs``/``top_logprobs`` vs completions' integer
``logprobs``) plus vLLM's extra sampling fields (``top_k``, ``min_p``, ...).
``model`` is accepted: the batch runs on ``--model`` (the audit uses it for
per-model minimums).
"""

from __future__ import annotations

from typing import Any

from kvcli.inputs.embeddings import EMBEDDINGS_URL
from kvcli.inputs.errors import LineError, show_value
from kvcli.inputs.fields import SAMPLING_FIELDS, renamed, sampling_overrides
from kvcli.inputs.messages import check_messages, check_tools
from kvcli.inputs.prompt import Prompt, check_text, check_token_ids, template_kwargs
from kvcli.inputs.responses import responses_to_messages

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
RESPONSES_URL = "/v1/responses"
URLS = (CHAT_URL, COMPLETIONS_URL, RESPONSES_URL, EMBEDDINGS_URL)

BODY_SAMPLING = tuple(n for n in SAMPLING_FIELDS if n != "logprobs")
# Accepted and ignored: they do not change what a single offline completion computes.
_IGNORED = ("model", "user", "metadata", "store", "service_tier", "stream", "stream_options",
            "tool_choice", "parallel_tool_calls", "prompt_cache_key", "session_id",
            "prompt_cache_options", "prompt_cache_retention")
_COMMON = (*BODY_SAMPLING, *_IGNORED, "max_completion_tokens", "cache_salt", "logprobs")
CHAT_FIELDS = (*_COMMON, "messages", "tools", "top_logprobs", "response_format",
               "chat_template_kwargs")
COMPLETION_FIELDS = (*_COMMON, "prompt", "echo", "suffix", "best_of", "response_format")
RESPONSES_FIELDS = (*_IGNORED, "input", "instructions", "text", "tools", "max_output_tokens",
                    "temperature", "top_p", "cache_salt", "previous_response_id", "truncation")
_RESPONSES_SAMPLING = {"max_output_tokens": "max_tokens", "temperature": "temperature",
                       "top_p": "top_p"}


def check_url(obj: dict[str, Any]) -> str:
    method = obj.get("method", "POST")
    if method != "POST":
        raise LineError("method", f"expected \"POST\", got {show_value(method)}")
    url = obj.get("url")
    if not isinstance(url, str) or url not in URLS:  # a list or object is unhashable
        raise LineError("url", f"unsupported endpoint {show_value(url)}; supported: "
                        + ", ".join(URLS), code="invalid_url")
    return url


def check_no_stream(body: dict[str, Any], prefix: str) -> None:
    if body.get("stream") not in (None, False):
        raise LineError(f"{prefix}stream", "streaming is not supported in a batch")


def chat_body(body: dict[str, Any], prefix: str) -> tuple[Prompt, dict[str, Any]]:
    prompt = Prompt(messages=check_messages(body.get("messages"), f"{prefix}messages"),
                    tools=check_tools(body.get("tools"), f"{prefix}tools"),
                    source=f"{prefix}messages", template_kwargs=template_kwargs(body, prefix))
    overrides = _common_sampling(body, prefix)
    logprobs = _chat_logprobs(body, prefix)
    if logprobs is not None:
        overrides["logprobs"] = logprobs
    return prompt, overrides


def completion_body(body: dict[str, Any], prefix: str) -> tuple[Prompt, dict[str, Any]]:
    overrides = _common_sampling(body, prefix)
    _check_completion_extras(body, overrides.get("n", 1), prefix)
    if body.get("logprobs") is not None:
        overrides["logprobs"] = body["logprobs"]
    return _completion_prompt(body, prefix), overrides


def responses_body(body: dict[str, Any], prefix: str) -> tuple[Prompt, dict[str, Any]]:
    if body.get("previous_response_id") is not None:
        raise LineError(f"{prefix}previous_response_id", "needs a server's stored conversation; "
                        "give the whole conversation in input")
    messages = check_messages(responses_to_messages(body, prefix), f"{prefix}input")
    tools = check_tools(_chat_tools(body.get("tools")), f"{prefix}tools")
    prompt = Prompt(messages=messages, tools=tools, source=f"{prefix}input")
    return prompt, renamed(body, _RESPONSES_SAMPLING)


def _chat_tools(tools: Any) -> Any:
    """The Responses API's flat function tools ``{"type": "function", "name", "parameters"}``
    in chat's form ``{"type": "function", "function": {...}}``, as vLLM hands them to the
    chat template and the tool-call parser."""
    if not isinstance(tools, list):
        return tools
    return [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
            if isinstance(t, dict) and t.get("type") == "function" and "function" not in t
            else t for t in tools]


def _common_sampling(body: dict[str, Any], prefix: str) -> dict[str, Any]:
    overrides = sampling_overrides(body, BODY_SAMPLING, prefix)
    if "max_completion_tokens" in body:
        overrides["max_tokens"] = body["max_completion_tokens"]
    return overrides


def _chat_logprobs(body: dict[str, Any], prefix: str) -> int | None:
    """Chat: ``logprobs`` is a bool and ``top_logprobs`` how many alternatives (0-20)."""
    wanted = body.get("logprobs", False)
    if not isinstance(wanted, bool):
        raise LineError(f"{prefix}logprobs", f"expected true or false, got {show_value(wanted)}")
    top = body.get("top_logprobs")
    if top is not None and not wanted:
        raise LineError(f"{prefix}top_logprobs", "requires \"logprobs\": true")
    if not wanted:
        return None
    if top is not None and (not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= 20):
        raise LineError(f"{prefix}top_logprobs", f"expected an integer in [0, 20], got {show_value(top)}")
    return top or 0


def _completion_prompt(body: dict[str, Any], prefix: str) -> Prompt:
    """``prompt`` may be a string, one token-id list, or a one-element list of either."""
    prompt, name = body.get("prompt"), f"{prefix}prompt"
    if isinstance(prompt, list) and prompt and all(isinstance(p, list | str) for p in prompt):
        if len(prompt) != 1:
            raise LineError(name, f"{len(prompt)} prompts in one line; a batch line "
                            "holds one prompt (split them into separate lines)")
        prompt = prompt[0]
    if isinstance(prompt, list):
        return Prompt(token_ids=check_token_ids(prompt, name), source=name)
    return Prompt(text=check_text(prompt, name), source=name)


def _check_completion_extras(body: dict[str, Any], n: Any, prefix: str) -> None:
    if body.get("echo") not in (None, False):
        raise LineError(f"{prefix}echo", "echoing the prompt is not supported")
    if "suffix" in body:
        raise LineError(f"{prefix}suffix", "insertion (suffix) is not supported")
    if "best_of" in body and body["best_of"] != n:
        raise LineError(f"{prefix}best_of", "best_of other than n is not supported")
