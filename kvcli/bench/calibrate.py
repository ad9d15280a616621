"""`kvcli bench --calibrate`: this machine's prefill and decode rate for one model and dtype.

Measured once, stored (kvcli/calibration.py, keyed by model directory, CPU model and dtype) and
read by `kvcli audit`, which turns the prefill tokens a cache saves into seconds with it. The
prompts are random token ids with the prefix cache off, so every prompt token is computed:
prefill rate = prompt tokens / the time of one batch of prompts that each generate one token;
decode rate = the new tokens after the first of one sequence / the time after its first token.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kvcli.calibration import Calibration, cpu_model

PROMPT_TOKENS = 512  # long enough that prefill is matmul-bound, short enough for a minute
PROMPTS = 4
DECODE_TOKENS = 64


@dataclass(slots=True)
class CalibrateConfig:
    model: str | None = None
    dtype: str = "float32"
    prompts: int = PROMPTS
    prompt_tokens: int = PROMPT_TOKENS
    decode_tokens: int = DECODE_TOKENS
    threads: int | None = None
    seed: int = 0


def calibrate(cfg: CalibrateConfig, progress: Callable[[str], None]) -> Calibration:
    import torch

    from kvcli.engine.llm import LLM
    from kvcli.engine.llm_engine import EngineConfig, LLMEngine
    from kvcli.model.gguf_convert import resolve_model
    from kvcli.sampling_params import SamplingParams

    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    directory = resolve_model(cfg.model)
    progress(f"calibrating on {cpu_model()}: loading {directory} ({cfg.dtype})")
    engine = LLMEngine.from_config(EngineConfig(model=str(directory), dtype=cfg.dtype,
                                                enable_prefix_caching=False, quiet=True))
    try:
        prefill, decode, length = _measure(LLM.from_engine(engine), engine, cfg, SamplingParams, progress)
    finally:
        engine.close()
    return Calibration(
        model=str(directory), cpu=cpu_model(), dtype=cfg.dtype, prefill_tok_s=round(prefill, 1),
        decode_tok_s=round(decode, 2), measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
        prompt_tokens=length, threads=torch.get_num_threads(), load_avg=_load(),
    )


def _measure(llm: Any, engine: Any, cfg: CalibrateConfig, params: Any,
             progress: Callable[[str], None]) -> tuple[float, float, int]:
    """(prefill tokens/s, decode tokens/s, prompt length) on the loaded engine."""
    length = max(2, min(cfg.prompt_tokens, engine.max_model_len - cfg.decode_tokens - 1))
    rng = random.Random(cfg.seed)
    prompts = [[rng.randrange(engine.vocab_size) for _ in range(length)] for _ in range(cfg.prompts)]
    one = params(max_tokens=1, ignore_eos=True)
    llm.generate(prompts[:1], one)  # warm-up: kernels compiled, pages touched, untimed
    progress(f"prefill: {cfg.prompts} prompts of {length} tokens")
    start = time.perf_counter()
    llm.generate(prompts, one)
    prefill = cfg.prompts * length / (time.perf_counter() - start)
    progress(f"decode: {cfg.decode_tokens} tokens of one sequence")
    start = time.perf_counter()
    out = llm.generate(prompts[:1], params(max_tokens=cfg.decode_tokens, ignore_eos=True))[0]
    after_first = time.perf_counter() - start - (out.time_to_first_token or 0.0)
    decode = (cfg.decode_tokens - 1) / after_first if after_first > 0 and cfg.decode_tokens > 1 else 0.0
    return prefill, decode, length


def _load() -> tuple[float, ...] | None:
    try:
        return tuple(round(x, 2) for x in os.getloadavg())
    except OSError:
        return None
