"""Benchmark workloads: deterministic chat prompts, tokenized once, shared by every system.

Each workload renders synthetic conversations (see textgen) with the model's chat
template and tokenizes them with kvcli's tokenizer, so every system under test gets
the very same token ids. Token targets are multiplied by `scale` (smoke tests use a
small scale so a tiny model's short context fits).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvcli.bench import textgen

WORKLOAD_NAMES = ("shared-prefix", "chat-sessions", "distinct", "decode-1")
DEFAULT_PROMPTS = {"shared-prefix": 32, "chat-sessions": 16, "distinct": 32, "decode-1": 1}
DEFAULT_NEW_TOKENS = {"shared-prefix": 32, "chat-sessions": 32, "distinct": 64, "decode-1": 128}
TURNS_PER_SESSION = 4


class BenchConfigError(ValueError):
    """A benchmark option that cannot work (bad name, count or size): a usage error."""


@dataclass(slots=True)
class Workload:
    name: str
    description: str
    prompts: list[list[int]]
    max_new_tokens: int
    # chat-sessions: prompt indices of each session in turn order (append-only chains).
    sessions: list[list[int]] = field(default_factory=list)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)


@dataclass(slots=True)
class _Builder:
    tokenizer: Any
    rng: random.Random
    scale: float

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def tokens(self, target: int) -> int:
        return max(1, round(target * self.scale))

    def render(self, messages: list[dict[str, str]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return self.tokenizer.encode(text, add_special_tokens=False)


def _shared_prefix(b: _Builder, n: int) -> tuple[list[list[int]], list[list[int]], str]:
    system = textgen.system_prompt(b.rng, b.tokens(400), b.count)
    prompts = [b.render([{"role": "system", "content": system},
                         {"role": "user", "content": textgen.question(b.rng, b.tokens(40), b.count)}])
               for _ in range(n)]
    return prompts, [], f"{n} requests: one ~{b.tokens(400)}-token system prompt + a distinct " \
                        f"~{b.tokens(40)}-token question"


def _chat_sessions(b: _Builder, n: int) -> tuple[list[list[int]], list[list[int]], str]:
    num_sessions = -(-n // TURNS_PER_SESSION)
    turns = [n // num_sessions + (1 if s < n % num_sessions else 0) for s in range(num_sessions)]
    chains: list[list[list[int]]] = []
    for num_turns in turns:
        messages = [{"role": "system",
                     "content": textgen.system_prompt(b.rng, b.tokens(150), b.count)}]
        chain = []
        for turn in range(num_turns):
            if turn:  # the previous turn's answer (synthetic, so every system sees the same ids)
                messages.append({"role": "assistant",
                                 "content": textgen.answer(b.rng, b.tokens(40), b.count)})
            messages.append({"role": "user",
                             "content": textgen.question(b.rng, b.tokens(40), b.count)})
            chain.append(b.render(messages))
            if turn and chain[-1][:len(chain[-2])] != chain[-2]:
                raise RuntimeError("chat-sessions: the chat template or tokenizer does not keep "
                                   "a conversation's earlier turns as a token prefix")
        chains.append(chain)
    # Turn-major order: every session's first turn, then every second turn, ...
    prompts: list[list[int]] = []
    sessions: list[list[int]] = [[] for _ in chains]
    for turn in range(max(turns)):
        for s, chain in enumerate(chains):
            if turn < len(chain):
                sessions[s].append(len(prompts))
                prompts.append(chain[turn])
    desc = f"{num_sessions} append-only conversations, {n} turns in all (~{b.tokens(40)}-token " \
           "questions and answers after a per-session system prompt)"
    return prompts, sessions, desc


def _distinct(b: _Builder, n: int) -> tuple[list[list[int]], list[list[int]], str]:
    prompts = []
    for _ in range(n):
        target = b.tokens(b.rng.randint(50, 500))
        # A per-conversation number up front: unrelated prompts share no full KV block.
        system = f"Conversation {b.rng.randrange(10**6):06d}. You are a helpful support assistant."
        messages = [{"role": "system", "content": system}]
        overhead = len(b.render(messages + [{"role": "user", "content": ""}]))
        user = textgen.question(b.rng, max(1, target - overhead), b.count)
        prompts.append(b.render(messages + [{"role": "user", "content": user}]))
    return prompts, [], f"{n} unrelated prompts of {b.tokens(50)}-{b.tokens(500)} tokens"


def _decode_1(b: _Builder, n: int) -> tuple[list[list[int]], list[list[int]], str]:
    ask = textgen.question(b.rng, b.tokens(20), b.count)
    return [b.render([{"role": "user", "content": ask}])], [], "one request with a short prompt"


_BUILDERS: dict[str, Callable[[_Builder, int], tuple[list[list[int]], list[list[int]], str]]] = {
    "shared-prefix": _shared_prefix,
    "chat-sessions": _chat_sessions,
    "distinct": _distinct,
    "decode-1": _decode_1,
}


def build_workload(name: str, tokenizer: Any, *, num_prompts: int | None = None, seed: int = 0,
                   scale: float = 1.0, max_new_tokens: int | None = None) -> Workload:
    """The named workload's prompts as token ids; same arguments, same ids."""
    if name not in _BUILDERS:
        raise BenchConfigError(f"workload: expected one of {', '.join(WORKLOAD_NAMES)}, got {name!r}")
    if num_prompts is not None and num_prompts < 1:
        raise BenchConfigError(f"num_prompts: expected >= 1, got {num_prompts}")
    if scale <= 0:
        raise BenchConfigError(f"scale: expected > 0, got {scale}")
    n = 1 if name == "decode-1" else (num_prompts or DEFAULT_PROMPTS[name])
    # The name is mixed into the seed so workloads do not reuse each other's text.
    builder = _Builder(tokenizer, random.Random(f"{name}:{seed}"), scale)
    prompts, sessions, description = _BUILDERS[name](builder, n)
    new_tokens = max_new_tokens if max_new_tokens is not None else DEFAULT_NEW_TOKENS[name]
    return Workload(name, description, prompts, new_tokens, sessions)
