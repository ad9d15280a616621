"""Cache profiles as data: how each target decides what a prompt reuses.

Numbers are versioned with their source (shared/reference/prompt-caching.md has
the quotes). Providers change them: edit this table, not the code.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

HitModel = Literal["blocks", "tokens", "slots", "breakpoints"]


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    summary: str
    hit_model: HitModel  # "blocks": leading full blocks by hash; "tokens": a radix tree; "breakpoints": Anthropic
    block_size: int  # hashing unit; for "blocks" also the hit increment
    min_tokens: int  # shortest cacheable prefix (0: one block)
    keep_last_token: bool  # the engine always computes at least one token
    per_segment_tokens: bool  # count tokens per content block (Anthropic hashes per block)
    lookback_blocks: int = 0  # breakpoints: how far a read walks back
    slots: int = 0  # slots: llama-server's parallel slots (-np)
    max_breakpoints: int = 0
    model_min_tokens: tuple[tuple[str, int], ...] = ()  # (model id prefix, minimum)
    source: str = ""
    as_of: str = ""
    input_prices: tuple[tuple[str, float], ...] = ()  # (model prefix, US$/M input); () = timing.py's table
    prices_as_of: str = ""  # where input_prices come from ("" = timing.PRICES_AS_OF)
    # (model id prefix, takes explicit breakpoints): OpenAI's prompt_cache_breakpoint; longest prefix wins
    breakpoint_models: tuple[tuple[str, bool], ...] = ()

    def min_tokens_for(self, model: str | None) -> int:
        """The minimum for `model`: the longest matching prefix in the table, else the default."""
        if model:
            matches = [(len(p), m) for p, m in self.model_min_tokens if model.startswith(p)]
            if matches:
                return max(matches)[1]
        return self.min_tokens or self.block_size

    def takes_breakpoints(self, model: str | None) -> bool:
        """Whether `model` reads and writes at explicit breakpoints: every Anthropic model
        (cache_control); OpenAI's models in the table (prompt_cache_breakpoint)."""
        if self.hit_model == "breakpoints":
            return True
        matches = [(len(p), takes) for p, takes in self.breakpoint_models if model and model.startswith(p)]
        return max(matches)[1] if matches else False

    def with_overrides(self, block_size: int | None, min_tokens: int | None, slots: int | None = None) -> Profile:
        changed = self
        if slots is not None:
            if self.hit_model != "slots":
                raise ValueError(f"--slots: the {self.name} profile has no slots (llamacpp does)")
            changed = replace(changed, slots=slots)
        if block_size is not None:
            changed = replace(changed, block_size=block_size)
        if min_tokens is not None:
            changed = replace(changed, min_tokens=min_tokens, model_min_tokens=())
        return changed


# Anthropic's per-model minimum cacheable length, platform.claude.com prompt-caching page,
# copy dated 2026-05-04. Later copies differ (see the reference); --min-tokens overrides.
ANTHROPIC_MINIMUMS: tuple[tuple[str, int], ...] = (
    ("claude-mythos", 4096),
    ("claude-opus-4-7", 4096),
    ("claude-opus-4-6", 4096),
    ("claude-opus-4-5", 4096),
    ("claude-haiku-4-5", 4096),
    ("claude-sonnet-4-6", 2048),
    ("claude-3-5-haiku", 2048),
    ("claude-sonnet-4-5", 1024),
    ("claude-opus-4-1", 1024),
    ("claude-opus-4", 1024),
    ("claude-sonnet-4", 1024),
    ("claude-3-7-sonnet", 1024),
)

# OpenAI models that take `prompt_cache_breakpoint` on content blocks (with `prompt_cache_options`
# {"mode": "implicit"|"explicit", "ttl": "30m"}): "Supported for gpt-5.6 and later models";
# up to 4 breakpoint writes a request (the implicit one, at the newest user or tool message, takes
# one), the latest 80 breakpoints considered on a read with no content-block lookback limit, a
# match exactly at a breakpoint (no 128-token steps), writes at 1.25x the input price, 30 min TTL.
# developers.openai.com/api/docs/guides/prompt-caching and the API reference's
# PromptCacheOptionsParam, read 2026-12-02. Earlier models: automatic caching only ("not offered").
OPENAI_BREAKPOINT_MODELS: tuple[tuple[str, bool], ...] = (("gpt-5.6", True),)
OPENAI_BREAKPOINT_WRITES = 4
OPENAI_BREAKPOINT_TTL_S = 1800.0
OPENAI_BREAKPOINTS_AS_OF = "2026-12-02"

PROFILES: dict[str, Profile] = {
    "kvcli": Profile(
        name="kvcli",
        summary="this engine (vLLM v1 style): full blocks hashed by kvcli/hashing.py, "
        "longest run of leading cached blocks, the last prompt token always recomputed",
        hit_model="blocks",
        block_size=16,
        min_tokens=0,
        keep_last_token=True,
        per_segment_tokens=False,
        source="kvcli/hashing.py; vLLM v1 KVCacheManager.get_computed_blocks (max hit = prompt - 1)",
        as_of="kvcli 0.1.0",
    ),
    "sglang": Profile(
        name="sglang",
        summary="SGLang RadixAttention: the longest token prefix any earlier request has in the radix "
        "tree, token-granular (page size 1: no block rounding), at most the prompt length - 1",
        hit_model="tokens",
        block_size=16,  # the audit's index granularity only: hits are counted per token
        min_tokens=1,
        keep_last_token=True,
        per_segment_tokens=False,
        source="sglang python/sglang/srt/managers/schedule_batch.py _compute_max_prefix_len "
        "(input_len - 1); mem_cache/radix_cache.py (page_size 1 by default)",
        as_of="SGLang 0.5 (2025)",
    ),
    "llamacpp": Profile(
        name="llamacpp",
        summary="llama-server: each slot keeps its last prompt; a prompt reuses its longest common "
        "token prefix with the slot it lands in (most similar, else least recently used), at most "
        "the prompt length - 1; no sharing across slots; the RAM prompt cache (--cache-ram) not modelled",
        hit_model="slots",
        block_size=16,  # the audit's index granularity only
        min_tokens=1,
        keep_last_token=True,
        per_segment_tokens=False,
        slots=1,
        source="llama.cpp tools/server: get_available_slot (slot_prompt_similarity 0.1, common/common.h), "
        "n_past capped so one prompt token is evaluated; -np 1",
        as_of="llama.cpp 2025 builds",
    ),
    "openai": Profile(
        name="openai",
        summary="automatic exact-prefix caching from 1024 tokens, hits in 128-token increments; "
        "gpt-5.6 and later: reads and writes at breakpoints (prompt_cache_breakpoint, else one "
        "implicit at the newest user or tool message)",
        hit_model="blocks",
        block_size=128,
        min_tokens=1024,
        keep_last_token=True,
        per_segment_tokens=False,
        source="openai-cookbook examples/Prompt_Caching_201.ipynb (s1.1); "
        "developers.openai.com/api/docs/guides/prompt-caching",
        as_of="2026",
        max_breakpoints=OPENAI_BREAKPOINT_WRITES,
        breakpoint_models=OPENAI_BREAKPOINT_MODELS,
    ),
    "anthropic": Profile(
        name="anthropic",
        summary="tools -> system -> messages; reads only at breakpoints (explicit cache_control, "
        "else automatic on the last block), 20-block lookback, per-model minimum",
        hit_model="breakpoints",
        block_size=16,
        min_tokens=1024,
        keep_last_token=False,
        per_segment_tokens=True,
        lookback_blocks=20,
        max_breakpoints=4,
        model_min_tokens=ANTHROPIC_MINIMUMS,
        source="platform.claude.com/docs/en/build-with-claude/prompt-caching (2026-05-04)",
        as_of="2026-05-04",
    ),
}


# vLLM v1 caches exactly as kvcli does (kvcli follows it); only the hash function differs.
_VLLM = replace(
    PROFILES["kvcli"],
    name="vllm",
    summary="vLLM v1 automatic prefix caching: full blocks of 16 tokens hashed with their parent, "
    "longest run of leading cached blocks, the last prompt token always recomputed",
    source="vllm/v1/core/kv_cache_manager.py get_computed_blocks (max_cache_hit_length = num_tokens - 1), "
    "block_size 16 (vllm/config/cache.py); docs.vllm.ai design/prefix_caching",
    as_of="vLLM 0.10-0.11 (2025)",
)
# In this order `kvcli audit --profile` lists them: the engines (kvcli, vLLM), then the others.
PROFILES = {"kvcli": PROFILES.pop("kvcli"), "vllm": _VLLM, **PROFILES}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"--profile {name}: expected one of {', '.join(PROFILES)}") from None
