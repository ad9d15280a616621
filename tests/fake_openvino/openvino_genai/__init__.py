"""A stand-in for openvino_genai's continuous batching, for kvcli's openvino_runner tests.

Put on PYTHONPATH only by tests/test_bench_openvino.py. Each request's "generated" tokens
are (sum of its prompt + index) % 97. Like OpenVINO, a pipeline keeps the prefixes of
finished requests: a request whose first 4 tokens a finished request of the same pipeline
had skips its prefill step (its first token comes one step earlier), so the tests can
tell whether the runner really starts every run from a fresh pipeline. The pipeline
refuses to build with partial float32 properties: all of kvcli's forced ones (openvino), or
none (its defaults, where from the third token on the outputs drift, as bf16 would, by 1 on
the fp32 IR, 2 on an int8 one and 3 on an int4 one: each row shows which IR it ran).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__version__ = "0.0-fake"
F32_KEYS = ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION", "KEY_CACHE_PRECISION",
            "VALUE_CACHE_PRECISION")
BYTES_PER_BLOCK = 1000
DRIFT = {"fp32": 1, "int8": 2, "int4": 3}  # at its defaults, by the IR's weights


@dataclass
class SchedulerConfig:
    enable_prefix_caching: bool = False
    max_num_batched_tokens: int = 256
    num_kv_blocks: int = 0
    dynamic_split_fuse: bool = True


@dataclass
class GenerationConfig:
    max_new_tokens: int = 16
    ignore_eos: bool = False


@dataclass
class _Output:
    generated_ids: list[int]


@dataclass
class _Handle:
    ids: list[int]
    config: GenerationConfig
    prefill_left: int
    tokens: list[int] = field(default_factory=list)
    unread: int = 0

    def can_read(self) -> bool:
        return self.unread > 0

    def read(self) -> dict[int, _Output]:
        new, self.unread = self.tokens[len(self.tokens) - self.unread:], 0
        return {0: _Output(new)}

    def done(self) -> bool:
        return len(self.tokens) >= self.config.max_new_tokens


@dataclass
class PipelineMetrics:
    kv_cache_size_in_bytes: int
    max_cache_usage: float


class ContinuousBatchingPipeline:
    def __init__(self, models_path: str, scheduler_config: SchedulerConfig, device: str,
                 properties: dict[str, Any]) -> None:
        if os.environ.get("FAKE_OPENVINO_FAIL_LOAD"):
            raise RuntimeError("fake compile failure")
        ir = Path(models_path) / "openvino_model.xml"
        if not ir.is_file():
            raise RuntimeError(f"fake openvino: no openvino_model.xml in {models_path}")
        weights = ir.read_text(encoding="utf-8").split("weights='")[1].split("'")[0]
        # kvcli's float32 everywhere (on the fp32 IR only), or no precision property at all
        defaults = not any(k in properties for k in F32_KEYS)
        wrong = [] if defaults else [k for k in F32_KEYS if properties.get(k) != "f32"]
        if wrong or device != "CPU" or not scheduler_config.enable_prefix_caching or (
                not defaults and weights != "fp32"):
            raise ValueError(f"fake openvino: not kvcli's settings: {wrong} {device} {weights}")
        self.drift = DRIFT[weights] if defaults else 0
        self.config = scheduler_config
        self.cached: set[tuple[int, ...]] = set()
        self.live: list[_Handle] = []

    def add_request(self, request_id: int, input_ids: Any,
                    generation_config: GenerationConfig) -> _Handle:
        hit = tuple(input_ids.ids[:4]) in self.cached
        handle = _Handle(input_ids.ids, generation_config, prefill_left=0 if hit else 1)
        self.live.append(handle)
        return handle

    def has_non_finished_requests(self) -> bool:
        return any(not h.done() for h in self.live)

    def step(self) -> None:
        for handle in self.live:
            if handle.done():
                continue
            if handle.prefill_left:
                handle.prefill_left -= 1
                continue
            # at its defaults (bf16, int weights) the third token onwards "rounds" differently
            drift = self.drift if len(handle.tokens) >= 2 else 0
            handle.tokens.append((sum(handle.ids) + len(handle.tokens) + drift) % 97)
            handle.unread += 1
            if handle.done():  # only finished requests' blocks are reused, as in OpenVINO
                self.cached.add(tuple(handle.ids[:4]))

    def get_metrics(self) -> PipelineMetrics:
        return PipelineMetrics(self.config.num_kv_blocks * BYTES_PER_BLOCK, 50.0)
