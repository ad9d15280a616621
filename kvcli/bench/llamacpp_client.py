"""What the llama.cpp peer sends to `llama-server` and how it reads the answers (stdlib only).

Each prompt is one ``POST /completion``: the prompt as token ids (so llama.cpp tokenizes
nothing and adds no BOS), greedy (temperature 0, top-k 1), ``n_predict`` new tokens with
end-of-sequence ignored, ``cache_prompt`` on, ``return_tokens`` so the generated ids come back.
Not streamed: a streamed token whose text is an incomplete UTF-8 sequence is never sent on its
own, so a stream can drop ids; the one answer has them all. Its ``timings`` give the prompt
tokens the server computed (``prompt_n``), those it reused from its prompt cache
(``cache_n``) and the decode time after the first token (``predicted_ms``), from which the
request's time to first token is the answer's arrival minus that decode time.
"""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass, field
from typing import Any


class LlamaCppError(RuntimeError):
    """llama-server answered something the peer cannot use."""


def completion_request(prompt: list[int], max_new_tokens: int) -> dict[str, Any]:
    """The /completion body for one prompt (see the module docstring)."""
    return {"prompt": [int(t) for t in prompt], "n_predict": int(max_new_tokens),
            "temperature": 0.0, "top_k": 1, "ignore_eos": True, "cache_prompt": True,
            "return_tokens": True, "stream": False}


@dataclass(slots=True)
class Completion:
    tokens: list[int] = field(default_factory=list)
    ttft_s: float | None = None  # from the run's start to this request's first token
    prompt_n: int | None = None  # prompt tokens the server computed
    cache_n: int | None = None  # prompt tokens it took from its cache


def read_answer(answer: dict[str, Any], max_new_tokens: int, elapsed_s: float) -> Completion:
    """A /completion answer received ``elapsed_s`` after the run started."""
    if "error" in answer:
        raise LlamaCppError(f"llama-server: {answer['error']}")
    tokens = answer.get("tokens")
    if not isinstance(tokens, list) or len(tokens) != max_new_tokens:
        got = len(tokens) if isinstance(tokens, list) else "no"
        raise LlamaCppError(f"llama-server returned {got} token ids, asked for {max_new_tokens} "
                            "(ignore_eos is on; a llama-server without return_tokens is too old)")
    timings = answer.get("timings") or {}
    decode_ms = timings.get("predicted_ms")
    ttft = None if decode_ms is None else max(0.0, elapsed_s - float(decode_ms) / 1000)
    return Completion([int(t) for t in tokens], ttft, timings.get("prompt_n"),
                      timings.get("cache_n"))


def complete(port: int, prompt: list[int], max_new_tokens: int, started: float,
             timeout: float = 3600.0) -> Completion:
    """One completion on ``127.0.0.1:port``; ``started``: the run's ``perf_counter()``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        body = json.dumps(completion_request(prompt, max_new_tokens))
        conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        elapsed = time.perf_counter() - started
    finally:
        conn.close()
    if resp.status != 200:
        raise LlamaCppError(f"llama-server: HTTP {resp.status}: "
                            f"{data.decode('utf-8', 'replace')[:500]}")
    return read_answer(json.loads(data), max_new_tokens, elapsed)


def healthy(port: int) -> bool:
    """Whether the server on ``port`` has loaded its model (GET /health is 200)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()
