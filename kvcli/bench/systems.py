"""Systems under benchmark: what one run returns, and kvcli's own engine as a system.

Every system gets the same token ids and the same number of new tokens, greedy,
with end-of-sequence ignored, so their outputs can be compared token for token.
Model loading happens once, outside the timed runs. kvcli's KV pool is allocated before
a workload's runs (untimed, sized by pages_needed), as vLLM allocates its pool at load;
every timed run starts from an empty prefix cache (kvcli and vLLM reset theirs,
transformers' paged cache is built inside the run), so a repeat never profits from
the previous run's cache.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from kvcli.bench.workloads import Workload

KVCLI = "kvcli"


@dataclass(slots=True)
class RunResult:
    outputs: list[list[int]]
    prefill_tokens_computed: int | None  # None: the system does not say (the OpenVINO peer)
    ttfts: list[float]  # seconds from the start of the run to each request's first token
    cached_tokens: int | None = None
    kv_utilization: float | None = None
    # Set by systems in a process of their own (the peers, isolated kvcli rows): that
    # process's peak during the run, and (kvcli's) that peak minus its RSS at the start.
    peak_rss_mb: float | None = None
    rss_growth_mb: float | None = None
    details: dict[str, Any] = field(default_factory=dict)


class BenchSystem(Protocol):
    name: str

    def run(self, prompts: list[list[int]], max_new_tokens: int) -> RunResult: ...


def pages_needed(prompts: list[list[int]], max_new_tokens: int, page_size: int) -> int:
    """KV pages (blocks) the workload needs without any sharing, plus one spare per request.

    Every system's cache is sized with this rule: big enough that nothing is preempted
    or evicted, and no bigger, so no system pays for zeroing a default-sized pool.
    """
    return sum(-(-(len(p) + max_new_tokens) // page_size) + 1 for p in prompts)


def count_new_token_rows(prompts: list[list[int]], max_new_tokens: int) -> int:
    """Decode rows a run feeds back: every new token but each request's last."""
    return len(prompts) * max(0, max_new_tokens - 1)


@dataclass(slots=True)
class KvcliSystem:
    """kvcli's LLMEngine over loaded weights; its KV pool is kept between runs, its prefix
    cache is not."""

    base: Any  # a loaded LLMEngine whose model, tokenizer and config the runs reuse
    name: str = KVCLI
    enable_prefix_caching: bool = True
    _engine: Any = None  # the engine of the runs, with a pool sized by prepare()

    @classmethod
    def load(cls, model: str | None, max_num_batched_tokens: int,
             quantization: str | None = None, name: str = KVCLI, precision: str = "exact",
             dtype: str | None = None, kv_cache_dtype: str = "auto",
             enable_prefix_caching: bool = True) -> KvcliSystem:
        """An engine for ``model`` (a directory or a --model spec), as `kvcli generate
        --quantization --precision --dtype --kv-cache-dtype` would load it."""
        from kvcli.engine.llm_engine import EngineConfig, LLMEngine

        config = EngineConfig(model=model, max_num_batched_tokens=max_num_batched_tokens,
                              quantization=quantization, precision=precision, dtype=dtype,
                              kv_cache_dtype=kv_cache_dtype)
        return cls(LLMEngine.from_config(config), name, enable_prefix_caching)

    def variant(self, name: str, enable_prefix_caching: bool) -> KvcliSystem:
        return KvcliSystem(self.base, name, enable_prefix_caching)

    @property
    def exact(self) -> bool:
        """float32 weights and cache: greedy outputs equal the float32 reference's. Quantized or
        bfloat16 weights, or an int8 / bfloat16 KV cache, change the logits, so their agreement
        with it is measured instead (runner.greedy_agreement)."""
        from kvcli.model.attention import kv_cache_dtype_name

        kv = kv_cache_dtype_name(self.base.model.platform.kv_dtype)
        return self.base.config.quantization is None and self.weights == kv == "float32"

    @property
    def weights(self) -> str:
        return str(self.base.model.platform.weights).removeprefix("torch.")

    @property
    def weights_kind(self) -> str:
        """"quantized" or the float weights' dtype, for the report's match cell."""
        return "quantized" if self.base.config.quantization else self.weights

    @property
    def precision(self) -> str:
        """The row's precision in the report: its weights, a quantized model's activations, its
        KV cache, and the preset, which is not named "exact" where activations are int8."""
        from kvcli.model.attention import kv_cache_dtype_name
        from kvcli.model.precision import activations

        kv = kv_cache_dtype_name(self.base.model.platform.kv_dtype)  # int8 for its uint8 rows
        weights, quantization = self.weights, self.base.config.quantization
        chosen = getattr(self.base.model, "precision", None)
        preset = getattr(chosen, "preset", "")
        if quantization:
            weights = f"{quantization} weights, {activations(quantization)}"
            if getattr(chosen, "prefill", None):  # fast's prefill copy (quant/int_weights.py)
                weights += f" ({chosen.prefill} prefill)"
            if getattr(chosen, "few_rows", None):  # fast's batched decode copy (quant/w8a8.py)
                weights += f" ({chosen.few_rows}-channel batched decode)"
            preset = "" if preset == "exact" and "int8" in weights else preset
        else:
            weights = f"{weights} weights"
        return f"{weights}, {kv} KV" + (f" ({preset})" if preset else "")

    @property
    def max_model_len(self) -> int:
        return int(self.base.max_model_len)

    def workload(self, name: str, **options: Any) -> Workload:
        """Workload ``name`` tokenized by this engine's tokenizer (the reference row's is the
        bench's); ``options`` as build_workload's."""
        from kvcli.bench.workloads import build_workload

        return build_workload(name, self.base.tokenizer, **options)

    def prepare(self, prompts: list[list[int]], max_new_tokens: int) -> None:
        """Untimed, before a workload's runs: a KV pool big enough for the workload, its pages
        faulted in here. Zeroing it (~0.1-0.2 s, ~180k page faults for 700 MB; 1.5 s of kernel
        time with vLLM's process beside it) is start-up work, not per-batch work."""
        from kvcli.engine.llm_engine import LLMEngine
        from kvcli.model.kv_pool import fault_in

        blocks = pages_needed(prompts, max_new_tokens, self.base.config.block_size)
        if self._engine is not None and self._engine.num_blocks == blocks:
            return
        # Each workload gets the pool it needs, not a bigger one kept from an earlier workload
        # (its peak RSS is then its own); the old engine's reference cycles hold the old pool,
        # so it is collected before the new one is zeroed.
        self._engine = None
        gc.collect()
        base = self.base
        config = replace(base.config, enable_prefix_caching=self.enable_prefix_caching,
                         num_blocks=blocks)
        self._engine = LLMEngine(base.model, base.tokenizer, config, base.eos_token_ids)
        fault_in(self._engine.runner.kv_cache)

    def run(self, prompts: list[list[int]], max_new_tokens: int) -> RunResult:
        from kvcli.engine.llm import LLM
        from kvcli.sampling_params import SamplingParams

        start = time.monotonic()
        # A pool where the bench prepared none or too small a one; the workload's serves its
        # warm-up too (rebuilt for it, the first timed run built and faulted in a new one).
        if self._engine is None or self._engine.num_blocks < pages_needed(
                prompts, max_new_tokens, self.base.config.block_size):
            self.prepare(prompts, max_new_tokens)
        engine = self._engine
        engine.reset_prefix_cache()
        params = SamplingParams(max_tokens=max_new_tokens, ignore_eos=True)
        # The engine's TTFT counts from a request's arrival; shift it to the run's start so
        # it includes the reset (and any pool allocation), as the peers' TTFT counts theirs.
        offset = time.monotonic() - start
        outs = LLM.from_engine(engine).generate([list(p) for p in prompts], params)
        stats = engine.stats()
        ttfts = [o.time_to_first_token + offset for o in outs
                 if o.time_to_first_token is not None]
        return RunResult(
            outputs=[list(o.outputs[0].token_ids) for o in outs],
            prefill_tokens_computed=int(stats["prefill_tokens_computed"]),
            ttfts=ttfts,
            cached_tokens=int(stats["cached_tokens"]),
            kv_utilization=stats["peak_kv_utilization"],
            details={**{k: stats[k] for k in ("steps", "preemptions", "peak_blocks_in_use",
                                              "num_blocks", "block_size")},
                     "backend": engine.runner.backend.describe()},
        )
