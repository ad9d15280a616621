"""Result lines: a finished request or a failed line -> one JSON line (bytes, newline included).

Plain inputs get ``{"id", "text", "finish_reason", "usage"}`` (``choices`` when
n > 1); OpenAI Batch inputs get the Batch output line with a ``chat.completion``
or ``text_completion`` body. Failures carry ``{"code", "message", "param", "line"}``.
A line that is not even JSON gets both ``id`` and ``custom_id`` (``line-<N>``) so
either kind of consumer can join it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from kvcli.batch.logprobs import chat_logprobs, completion_logprobs, plain_logprobs
from kvcli.batch.records import FailedLine, LineError, LineId, LineRequest, Style
from kvcli.batch.reply import Reply, read_reply
from kvcli.engine.outputs import CompletionOutput, RequestOutput


def dumps_line(obj: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(obj) + b"\n"
    except orjson.JSONEncodeError:
        # Lone surrogates in decoded text: orjson refuses them, json escapes them.
        return json.dumps(obj, ensure_ascii=True).encode() + b"\n"


def _disk_hits(out: RequestOutput) -> dict[str, int]:
    """kvcli's split of cached_tokens: those loaded from --kv-cache-dir (absent when off)."""
    if out.num_disk_cached_tokens is None:
        return {}
    return {"kvcli_disk_cached_tokens": out.num_disk_cached_tokens}


def engine_failure(req: LineRequest, out: RequestOutput) -> FailedLine | None:
    """The request failed inside the engine (``error`` set or a choice finished with "error")."""
    if out.error is None and all(c.finish_reason != "error" for c in out.outputs):
        return None
    return FailedLine(req.ident, req.style, LineError(None, out.error or "generation failed",
                                                     "engine_error"))


@dataclass(slots=True)
class ResultFormatter:
    model_name: str
    tokenizer: Any  # for the text of logprob tokens
    include_token_ids: bool = False
    cache_block: int = 0  # the prefix cache's block size (0: caching off), for cache writes
    _token_text: dict[int, str] = field(default_factory=dict)
    _token_raw: dict[int, list[int]] = field(default_factory=dict)
    _special_ids: frozenset[int] | None = None
    # --deterministic-ids: OpenAI ids derived from custom_id + prompt, `created` fixed
    deterministic_ids: bool = False

    def _id(self, prefix: str, key: str, out: RequestOutput | None = None) -> str:
        if not self.deterministic_ids:
            return _new_id(prefix)
        return derived_id(prefix, key, out.prompt_token_ids if out is not None else ())

    def _created(self) -> int:
        return reproducible_time() if self.deterministic_ids else int(time.time())

    def success(self, req: LineRequest, out: RequestOutput) -> bytes:
        if req.style is Style.PLAIN:
            return dumps_line(self._plain(req, out))
        if req.embed is not None:
            from kvcli.batch.embeddings_out import embedding_body

            body = embedding_body(req, out, self.model_name, _disk_hits(out))
            if req.style is Style.EMBED:
                return dumps_line({**self._plain_ids(req.ident), **body})
        elif req.style is Style.RESPONSES:
            body = self._responses(req, out)
        else:
            body = self._openai_body(req, out)
        key = req.ident.key
        return dumps_line({
            "id": self._id("batch_req_", key, out), "custom_id": key,
            "response": {"status_code": 200, "request_id": self._id("req_", key, out),
                         "body": body},
            "error": None,
        })

    def failure(self, failed: FailedLine) -> bytes:
        err = failed.error
        error = {"code": err.code, "message": str(err), "param": err.field,
                 "line": failed.ident.line_no}
        key = failed.ident.key
        if failed.style is None:
            return dumps_line({"id": key, "custom_id": key, "response": None, "error": error})
        if failed.style.plain:
            return dumps_line({**self._plain_ids(failed.ident), "error": error})
        return dumps_line({"id": self._id("batch_req_", key), "custom_id": key,
                           "response": None, "error": error})

    # ------------------------------------------------------------------ plain
    @staticmethod
    def _plain_ids(ident: LineId) -> dict[str, Any]:
        ids = {"id": ident.key}
        if ident.field == "custom_id":
            ids["custom_id"] = ident.key
        return ids

    def _plain(self, req: LineRequest, out: RequestOutput) -> dict[str, Any]:
        result = self._plain_ids(req.ident)
        choices = [self._plain_choice(req, c) for c in out.outputs]
        if req.params.n == 1 and len(choices) == 1:
            del choices[0]["index"]
            result.update(choices[0])
        else:
            result["choices"] = choices
        result["usage"] = {"prompt_tokens": len(out.prompt_token_ids),
                           "completion_tokens": _completion_tokens(out),
                           **self._reasoning_usage(req, out),
                           "cached_tokens": out.num_cached_tokens, **_disk_hits(out)}
        if self.include_token_ids:
            result["prompt_token_ids"] = out.prompt_token_ids
        return result

    def _plain_choice(self, req: LineRequest, c: CompletionOutput) -> dict[str, Any]:
        reply = self._reply(req, c)
        choice: dict[str, Any] = {"index": c.index, "text": reply.content,
                                  **reply.fields(), "finish_reason": c.finish_reason}
        content, calls = _tool_calls(req, c, reply)
        if calls:  # as the OpenAI line's message: text is its content (a string, "" if none)
            choice.update(text=content or "", tool_calls=calls,
                          finish_reason=_calls_finish(c))
        if c.logprobs is not None and req.params.logprobs is not None:
            choice["logprobs"] = plain_logprobs(c.token_ids, c.logprobs, req.params.logprobs,
                                                self._decode)
        if self.include_token_ids:
            choice["token_ids"] = c.token_ids
        return choice

    # ----------------------------------------------------------------- openai
    def _openai_body(self, req: LineRequest, out: RequestOutput) -> dict[str, Any]:
        chat = req.style is Style.CHAT
        body: dict[str, Any] = {
            "id": self._id("chatcmpl-" if chat else "cmpl-", req.ident.key, out),
            "object": "chat.completion" if chat else "text_completion",
            "created": self._created(),
            "model": self.model_name,
            "choices": [self._openai_choice(req, c, chat) for c in out.outputs],
            "usage": {"prompt_tokens": len(out.prompt_token_ids),
                      "completion_tokens": _completion_tokens(out),
                      "total_tokens": len(out.prompt_token_ids) + _completion_tokens(out),
                      **self._reasoning_usage(req, out),
                      "prompt_tokens_details": {"cached_tokens": out.num_cached_tokens,
                                                **_disk_hits(out)}},
        }
        if self.include_token_ids:
            body["prompt_token_ids"] = out.prompt_token_ids
        return body

    def _openai_choice(self, req: LineRequest, c: CompletionOutput, chat: bool) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": c.index}
        reply = self._reply(req, c) if chat else Reply(c.text)
        content, calls = _tool_calls(req, c, reply) if chat else (c.text, [])
        if chat:
            choice["message"] = {"role": "assistant", "content": content, **reply.fields(),
                                 **({"tool_calls": calls} if calls else {})}
        else:
            choice["text"] = c.text
        k = req.params.logprobs
        logprobs = None
        if c.logprobs is not None and k is not None and chat:
            logprobs = chat_logprobs(c.token_ids, c.logprobs, k, self._decode, self._raw_bytes)
        elif c.logprobs is not None and k is not None:
            logprobs = completion_logprobs(c.token_ids, c.logprobs, k, self._decode)
        choice.update(logprobs=logprobs, finish_reason=_calls_finish(c) if calls else c.finish_reason,
                      stop_reason=c.stop_reason)
        if self.include_token_ids:
            choice["token_ids"] = c.token_ids
        return choice

    def _responses(self, req: LineRequest, out: RequestOutput) -> dict[str, Any]:
        """A Responses ``Response`` (Responses have no ``n``: one choice)."""
        from kvcli.batch.responses_out import response_body, response_usage

        (c,) = out.outputs
        reply = self._reply(req, c)
        content, calls = _tool_calls(req, c, reply)  # the text outside the calls is the message
        reply = replace(reply, content=content)
        prompt = len(out.prompt_token_ids)
        # The cache keeps the prompt's full blocks: those not read from it are written to it.
        written = max(0, prompt - prompt % self.cache_block - out.num_cached_tokens) \
            if self.cache_block else 0
        usage = response_usage(prompt, out.num_cached_tokens, written, len(c.token_ids),
                               reply.reasoning_tokens)
        key = req.ident.key
        return response_body(req, c, reply, calls, self.model_name, usage,
                             lambda prefix, n: self._id(prefix, f"{key}#{n}" if n else key, out),
                             self._created())

    def _reply(self, req: LineRequest, c: CompletionOutput) -> Reply:
        return read_reply(req, c, lambda ids: self.tokenizer.decode(ids))

    def _reasoning_usage(self, req: LineRequest, out: RequestOutput) -> dict[str, Any]:
        """OpenAI's ``completion_tokens_details.reasoning_tokens`` where a parser reads replies."""
        if req.reasoning is None:
            return {}
        count = sum(self._reply(req, c).reasoning_tokens for c in out.outputs)
        return {"completion_tokens_details": {"reasoning_tokens": count}}

    def _decode(self, token_id: int) -> str:
        text = self._token_text.get(token_id)
        if text is None:
            text = self._token_text[token_id] = self.tokenizer.decode([token_id])
        return text

    def _raw_bytes(self, token_id: int) -> list[int]:
        """A token's own bytes (a byte-fallback token's one byte); a special token's are those
        of its shown text, like ``token``. A tokenizer without ``token_bytes``: the text's."""
        raw = self._token_raw.get(token_id)
        if raw is None:
            if self._special_ids is None:
                self._special_ids = frozenset(getattr(self.tokenizer, "all_special_ids", ()))
            token_bytes = getattr(self.tokenizer, "token_bytes", None)
            if token_bytes is None or token_id in self._special_ids:
                raw = list(self._decode(token_id).encode())
            else:
                raw = list(token_bytes(token_id))
            self._token_raw[token_id] = raw
        return raw


def _tool_calls(req: LineRequest, c: CompletionOutput, reply: Reply
                ) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool_calls) of a reply on a line with tools (kvcli.structured): the complete
    calls to the line's own functions, also of a reply cut by max_tokens; read from the
    answer, after any reasoning."""
    if req.tool_format is None or c.finish_reason not in ("stop", "length") \
            or reply.content is None:
        return reply.content, []
    from kvcli.structured.tools import parse_tool_calls, tool_names

    return parse_tool_calls(reply.content, req.tool_format, tool_names(req.prompt.tools))


def _calls_finish(c: CompletionOutput) -> str:
    """"tool_calls" for a reply that stopped; one cut by max_tokens stays "length", so a
    consumer sees that more may have followed."""
    return "tool_calls" if c.finish_reason == "stop" else c.finish_reason


def _completion_tokens(out: RequestOutput) -> int:
    return sum(len(c.token_ids) for c in out.outputs)


def _new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex


def derived_id(prefix: str, key: str, prompt_token_ids: Sequence[int]) -> str:
    """An id as long as a random one, from what the line asked: its custom_id and prompt
    (the same line gives the same id in every run; another line, another id)."""
    digest = hashlib.sha256(b"kvcli-id/v1\0" + prefix.encode() + b"\0"
                            + key.encode("utf-8", "surrogatepass") + b"\0"
                            + array("I", prompt_token_ids).tobytes())
    return prefix + digest.hexdigest()[:32]


def reproducible_time() -> int:
    """``created`` of --deterministic-ids: $SOURCE_DATE_EPOCH (the reproducible-builds
    convention) when it is an integer, else 0."""
    value = os.environ.get("SOURCE_DATE_EPOCH", "")
    return int(value) if value.strip().isdigit() else 0
