"""A small deterministic stand-in for LLMEngine, for the batch layer's fast tests (no torch).

It implements the engine API the batch layer uses (add_request, has_unfinished,
step, abort, stats, tokenizer, max_model_len, vocab_size) with simple, checkable
rules:

* tokenizer: byte-level, id = byte + 3 (0 pad, 1 BOS, 2 EOS), vocab 259; the chat
  template renders ``<role>content\\n`` per message (+ ``<tools>N`` and ``<assistant>``);
* a request's completion is its prompt's bytes reversed, then EOS ("stop");
  one token per step, so short prompts finish first (completion order != input order);
  ``max_tokens`` cuts it ("length"); ``stop`` strings cut the text like the engine;
  choice ``i`` of an ``n > 1`` request is rotated by ``i``;
* prefix caching: full blocks of ``block_size`` prompt tokens (salted) seen before count
  as cached, like the real hash chain;
* a prompt containing ``ENGINE_FAIL`` finishes with ``error`` set.

``step_delay`` (seconds) slows it down for kill/interrupt tests run as subprocesses.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from kvcli.engine.outputs import CompletionOutput, RequestOutput
from kvcli.sampling_params import SamplingParams

PAD, BOS, EOS, OFFSET = 0, 1, 2, 3


class FakeTokenizer:
    bos_token_id = BOS
    eos_token_ids = (EOS,)
    vocab_size = 259

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [b + OFFSET for b in text.encode()]
        return [BOS, *ids] if add_special_tokens else ids

    def decode(self, ids: list[int]) -> str:
        return bytes(i - OFFSET for i in ids if i >= OFFSET).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: list[Any] | None = None,
                            add_generation_prompt: bool = True) -> str:
        if any(m.get("content") == "TEMPLATE_FAIL" for m in messages):
            raise ValueError("template refuses this conversation")
        text = f"<tools>{len(tools)}\n" if tools else ""
        text += "".join(f"<{m['role']}>{m.get('content') or ''}\n" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


@dataclass
class _Live:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    cached: int
    plans: list[list[int]]  # per choice: the tokens it emits (then repeats)
    produced: int = 0


@dataclass
class FakeEngine:
    max_model_len: int = 512
    block_size: int = 4
    step_delay: float = 0.0
    tokenizer: FakeTokenizer = field(default_factory=FakeTokenizer)
    vocab_size: int = 259
    added: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    max_live: int = 0  # the most requests ever in the engine at once
    _live: dict[str, _Live] = field(default_factory=dict)
    _blocks: set[tuple[Any, ...]] = field(default_factory=set)
    _computed: int = 0
    _skipped: int = 0

    def add_request(self, request_id: str, prompt_token_ids: list[int],
                    params: SamplingParams | None = None, cache_salt: str | None = None) -> None:
        params = params or SamplingParams()
        params.validate()
        if request_id in self._live:
            raise ValueError(f"id: duplicate request id {request_id!r}")
        if any(not 0 <= t < self.vocab_size for t in prompt_token_ids):
            raise ValueError("prompt_token_ids: token id outside the vocabulary")
        if params.max_tokens > 10_000:
            raise ValueError("max_tokens: the fake engine refuses more than 10000")
        cached = self._cache(prompt_token_ids, cache_salt)
        more = params.n - 1  # every sample prefills its prompt, the first one's hit for each
        self._skipped += more * cached
        self._computed += more * (len(prompt_token_ids) - cached)
        body = [t for t in reversed(prompt_token_ids) if t >= OFFSET] or [OFFSET]
        plans = [(body[i % len(body):] + body[:i % len(body)]) + [EOS] for i in range(params.n)]
        self._live[request_id] = _Live(request_id, list(prompt_token_ids), params, cached, plans)
        self.added.append(request_id)
        self.max_live = max(self.max_live, len(self._live))

    def _cache(self, ids: list[int], salt: str | None) -> int:
        cached, key = 0, (salt,)
        for start in range(0, len(ids) - len(ids) % self.block_size, self.block_size):
            key = (key, tuple(ids[start:start + self.block_size]))
            if key in self._blocks and cached == start:
                cached += self.block_size
            self._blocks.add(key)
        cached = min(cached, len(ids) - 1)
        self._skipped += cached
        self._computed += len(ids) - cached
        return cached

    def has_unfinished(self) -> bool:
        return bool(self._live)

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self._live.pop(request_id, None)

    def step(self) -> list[RequestOutput]:
        if self.step_delay:
            time.sleep(self.step_delay)
        finished = []
        for live in list(self._live.values()):
            live.produced += 1
            outs = [self._choice(live, i) for i in range(live.params.n)]
            if all(o is not None for o in outs):
                del self._live[live.request_id]
                failed = "ENGINE_FAIL" in self.tokenizer.decode(live.prompt)
                n = live.params.n
                finished.append(RequestOutput(
                    live.request_id, live.prompt, [o for o in outs if o is not None], live.cached,
                    error="fake engine failure" if failed else None,
                    prefill_computed=n * (len(live.prompt) - live.cached),
                    prefill_skipped=n * live.cached))
        return finished

    def _choice(self, live: _Live, index: int) -> CompletionOutput | None:
        """Choice ``index`` once it is finished, else None."""
        params, plan, n = live.params, live.plans[index], live.produced
        tokens = [plan[i % len(plan)] for i in range(n)]  # ignore_eos: the plan repeats
        text = self.tokenizer.decode(tokens)
        for s in params.stop:
            if s in text:
                return CompletionOutput(index, text[:text.index(s)], tokens, "stop",
                                        self._logprobs(tokens, params), s)
        if tokens[-1] == EOS and not params.ignore_eos:
            reason = "stop"
        elif n >= params.max_tokens or len(live.prompt) + n >= self.max_model_len:
            reason = "length"
        else:
            return None
        return CompletionOutput(index, text, tokens, reason, self._logprobs(tokens, params))

    @staticmethod
    def _logprobs(tokens: list[int], params: SamplingParams) -> list[dict[int, float]] | None:
        if params.logprobs is None:
            return None
        return [{t: -0.25, **{t + 1 + j: -1.0 - j for j in range(params.logprobs)}} for t in tokens]

    def stats(self) -> dict[str, Any]:
        return {"prefill_tokens_computed": self._computed, "prefill_tokens_skipped": self._skipped,
                "num_blocks": 1000, "block_size": self.block_size, "peak_blocks_in_use": 10,
                "peak_kv_utilization": 0.5, "preemptions": 0}
