"""A stand-in for vLLM's offline API, just enough for kvcli's vllm_runner protocol tests.

It is put on PYTHONPATH only by tests/test_bench_vllm.py. Each request's "generated"
tokens are (sum of its prompt + step) % 97, and a request whose first 4 tokens were seen
since the last reset_prefix_cache() reports 4 cached tokens, so the tests can check that
outputs, counters and cache resets travel through the runner unchanged.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

__version__ = "0.0-fake"


@dataclass
class SamplingParams:
    temperature: float = 1.0
    max_tokens: int = 16
    min_tokens: int = 0
    ignore_eos: bool = False


@dataclass
class _Completion:
    token_ids: list[int] = field(default_factory=list)


@dataclass
class _Output:
    request_id: str
    outputs: list[_Completion]
    finished: bool
    num_cached_tokens: int


@dataclass
class _Engine:
    prefixes: set = field(default_factory=set)
    live: dict[str, Any] = field(default_factory=dict)

    def add_request(self, request_id: str, prompt: dict, params: SamplingParams) -> None:
        ids = prompt["prompt_token_ids"]
        cached = 4 if tuple(ids[:4]) in self.prefixes else 0
        self.prefixes.add(tuple(ids[:4]))
        self.live[request_id] = (ids, params, _Completion(), cached)

    def has_unfinished_requests(self) -> bool:
        return bool(self.live)

    def step(self) -> list[_Output]:
        outs = []
        for rid, (ids, params, done, cached) in list(self.live.items()):
            done.token_ids.append((sum(ids) + len(done.token_ids)) % 97)
            finished = len(done.token_ids) >= params.max_tokens
            if finished:
                del self.live[rid]
            outs.append(_Output(rid, [done], finished, cached))
        return outs


class LLM:
    def __init__(self, model: str, **kwargs: Any) -> None:
        if os.environ.get("FAKE_VLLM_FAIL_LOAD"):
            raise ValueError("fake load failure")
        self.kwargs = kwargs
        self.llm_engine = _Engine()

    def reset_prefix_cache(self) -> bool:
        self.llm_engine.prefixes.clear()
        return True
