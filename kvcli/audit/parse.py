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
        return parse_request_record(value, where)
    except LineError as err:
        return InputProblem(where, str(err))
