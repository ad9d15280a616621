"""A finished ``/v1/responses`` Batch line -> the body of an OpenAI Responses ``Response`` object.

The reply becomes output items as the Responses API writes them: a ``reasoning`` item (when
a reasoning parser split one off), the answer as a ``message`` with one ``output_text`` part,
and each parsed tool call as a ``function_call`` item. A reply cut by ``max_output_tokens``
is ``status: "incomplete"`` with ``incomplete_details.reason: "max_output_tokens"``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvcli.batch.records import LineRequest
from kvcli.batch.reply import Reply
from kvcli.engine.outputs import CompletionOutput

# The request fields a Response echoes, and what it says when the line left them out.
ECHOED = {"instructions": None, "metadata": None, "tools": [], "tool_choice": "auto",
          "parallel_tool_calls": True, "max_output_tokens": None, "truncation": "disabled",
          "text": {"format": {"type": "text"}}}


def response_body(req: LineRequest, c: CompletionOutput, reply: Reply,
                  calls: list[dict[str, Any]], model: str, usage: dict[str, Any],
                  new_id: Callable[[str, int], str], created: int) -> dict[str, Any]:
    """``new_id(prefix, n)``: the n-th item id with that prefix (the formatter's, random or
    --deterministic-ids); ``created``: its ``created_at``."""
    cut = c.finish_reason == "length"
    status = "incomplete" if cut else "completed"
    output = []
    if reply.reasoning is not None:
        output.append({"id": new_id("rs_", 0), "type": "reasoning", "summary": [], "status": status,
                       "content": [{"type": "reasoning_text", "text": reply.reasoning}]})
    if reply.content:
        output.append({"id": new_id("msg_", 0), "type": "message", "role": "assistant", "status": status,
                       "content": [{"type": "output_text", "text": reply.content,
                                    "annotations": [], "logprobs": []}]})
    output += [{"id": new_id("fc_", i), "type": "function_call", "call_id": call["id"],
                "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                "status": "completed"} for i, call in enumerate(calls)]
    return {
        "id": new_id("resp_", 0), "object": "response", "created_at": created,
        "status": status, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "model": model, "output": output,
        **{name: req.echo.get(name, default) for name, default in ECHOED.items()},
        "temperature": req.params.temperature, "top_p": req.params.top_p,
        "usage": usage,
    }


def response_usage(prompt_tokens: int, cached: int, written: int, output_tokens: int,
                   reasoning_tokens: int) -> dict[str, Any]:
    return {"input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": written},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": prompt_tokens + output_tokens}
