"""One JSON record -> a PromptRequest, through the request model `kvcli generate` uses.

Every shape generate accepts is read by the same code (kvcli/inputs), so the
audit predicts the prompt generate computes: plain prompts, chat messages with
tools, token ids, OpenAI Batch lines; plus the forms only the audit needs
(Anthropic Messages bodies and batch lines, OpenAI Responses bodies), which are
adapters onto the same model. Nothing is reordered or re-serialized.
"""

from __future__ import annotations

from typing import Any

from kvcli.audit.records import InputProblem, PromptRequest
from kvcli.inputs import LineError, parse_request


def parse_request_record(value: Any, where: str) -> PromptRequest:
    """Raises LineError on a malformed request."""
    req = parse_request(value)
    if req.embed is not None:  # its hits depend on the model's pooling (mean reads none)
        raise LineError(None, "an embeddings line: kvcli audit does not predict embeddings "
                        "jobs yet (kvcli generate runs them)")
    prompt = req.prompt
    return PromptRequest(
        source=where, id=req.id, text=prompt.text, messages=prompt.messages, tools=prompt.tools,
        system=prompt.system, response_format=req.response_format, model=req.model,
        cache_salt=req.cache_salt, session=req.session, token_ids=prompt.token_ids,
        prompt=prompt,
    )


def to_request(value: Any, where: str, is_text: bool = False) -> PromptRequest | InputProblem:
    if is_text:
        return PromptRequest(source=where, text=value)
    try:
        request = parse_request_record(value, where)
    except LineError as err:
        if looks_like_trace(value):
            return InputProblem(where, "a hash-id trace line (timestamp, input_length, hash_ids), not a request: "
                                "give --trace-block-size N (Mooncake's traces: 512, Alibaba Bailian's: 16)")
        return InputProblem(where, str(err))
    request.cache_mode = cache_mode(value)
    return request


def cache_mode(value: Any) -> str | None:
    """OpenAI's prompt_cache_options.mode, top level or in a batch line's body."""
    for body in (value, value.get("body") if isinstance(value, dict) else None):
        options = body.get("prompt_cache_options") if isinstance(body, dict) else None
        if isinstance(options, dict) and isinstance(options.get("mode"), str):
            return options["mode"]
    return None


def looks_like_trace(value: Any) -> bool:
    """A hash-id trace line, not a request: what a text audit should say instead of 'no prompt'."""
    return isinstance(value, dict) and "hash_ids" in value and "input_length" in value and not (
        {"messages", "prompt", "body", "params", "input"} & value.keys())
