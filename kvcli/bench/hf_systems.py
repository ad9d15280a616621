"""The transformers peers: generate() in padded batches, and generate_batch() (paged).

Both load the model directory kvcli resolved (same weights, float32, SDPA attention)
and count the tokens every forward pass receives, so "prefill tokens computed" is
measured rather than derived: all forwarded tokens minus the decode rows.
End-of-sequence is switched off (no stop, no masking), as kvcli's ignore_eos does,
so every system generates exactly max_new_tokens and greedy outputs are comparable.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvcli.bench.systems import RunResult, count_new_token_rows, pages_needed

HF_GENERATE = "hf-generate"
HF_GENERATE_BATCH = "hf-generate-batch"
_CB_LOGGER = "ContinuousBatchingLogger"


@dataclass(slots=True)
class ForwardTokenCounter:
    """Counts input tokens of every forward call of a model (padding included)."""

    count: int = 0

    def attach(self, model: Any) -> None:
        model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module: Any, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None:
            self.count += int(ids.numel())


def load_hf_model(model_dir: Path) -> tuple[Any, ForwardTokenCounter, int]:
    """(model, its forward token counter, pad token id) with EOS switched off."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 attn_implementation="sdpa")
    model.eval()
    gc = model.generation_config
    pad = gc.pad_token_id if gc.pad_token_id is not None else model.config.pad_token_id
    pad = int(pad if pad is not None else 0)
    gc.eos_token_id = None  # never stop and never mask EOS: kvcli's ignore_eos
    gc.pad_token_id = pad
    counter = ForwardTokenCounter()
    counter.attach(model)
    return model, counter, pad


class _FirstTokenClock:
    """A generate() streamer: put() gets the prompt first, then each step's new tokens."""

    def __init__(self) -> None:
        self.calls = 0
        self.first: float | None = None

    def put(self, value: Any) -> None:
        self.calls += 1
        if self.calls == 2:
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


@dataclass(slots=True)
class _HFModel:
    """A transformers model loaded once (outside any timing) with its forward-token counter."""

    model_dir: Path
    _loaded: tuple[Any, ForwardTokenCounter, int] = field(init=False)

    def __post_init__(self) -> None:
        self._loaded = load_hf_model(self.model_dir)

    def _start(self) -> tuple[Any, ForwardTokenCounter, int]:
        model, counter, pad = self._loaded
        counter.count = 0
        return model, counter, pad


@dataclass(slots=True)
class HFGenerateSystem(_HFModel):
    """transformers generate(), greedy, left-padded batches of `batch_size` in input order."""

    batch_size: int = 8
    name: str = HF_GENERATE

    def run(self, prompts: list[list[int]], max_new_tokens: int) -> RunResult:
        import torch

        model, counter, pad = self._start()
        start = time.perf_counter()
        outputs: list[list[int]] = []
        ttfts: list[float] = []
        live = slots = 0
        for i in range(0, len(prompts), self.batch_size):
            batch = prompts[i:i + self.batch_size]
            width = max(len(p) for p in batch)
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
            clock = _FirstTokenClock()
            with torch.inference_mode():
                out = model.generate(ids, attention_mask=mask, do_sample=False, streamer=clock,
                                     max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens)
            outputs.extend(out[:, width:].tolist())
            ttfts.extend([(clock.first or time.perf_counter()) - start] * len(batch))
            # Dense cache of the batch: real tokens over padded slots, for the largest batch.
            if len(batch) * width >= slots:
                slots = len(batch) * (width + max_new_tokens)
                live = sum(len(p) for p in batch) + len(batch) * max_new_tokens
        prefill = counter.count - count_new_token_rows(prompts, max_new_tokens)
        return RunResult(outputs, prefill, ttfts, cached_tokens=0,
                         kv_utilization=round(live / slots, 4) if slots else None,
                         details={"batch_size": self.batch_size})


def _drop_psutil_notes(record: logging.LogRecord) -> bool:
    """generate_batch logs an ERROR on every CPU run without psutil (memory probing only)."""
    return "psutil" not in record.getMessage()


@dataclass(slots=True)
class HFGenerateBatchSystem(_HFModel):
    """transformers' continuous batching (generate_batch) with paged attention and block sharing."""

    page_size: int = 32
    max_batch_tokens: int = 1024
    name: str = HF_GENERATE_BATCH

    def run(self, prompts: list[list[int]], max_new_tokens: int) -> RunResult:
        from transformers import ContinuousBatchingConfig, GenerationConfig

        model, counter, pad = self._start()
        # On CPU the paged cache would otherwise be sized from ~90% of RAM: size it to the work.
        pages = pages_needed(prompts, max_new_tokens, self.page_size)
        cb_config = ContinuousBatchingConfig(page_size=self.page_size, num_blocks=pages,
                                             max_batch_tokens=self.max_batch_tokens,
                                             allow_block_sharing=True)
        gen_config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens,
                                      eos_token_id=-1, pad_token_id=pad)  # -1: no EOS
        cb_logger = logging.getLogger(_CB_LOGGER)
        cb_logger.addFilter(_drop_psutil_notes)
        try:
            start = time.perf_counter()
            results = model.generate_batch(prompts, generation_config=gen_config,
                                           continuous_batching_config=cb_config,
                                           record_timestamps=True, progress_bar=False)
        finally:
            cb_logger.removeFilter(_drop_psutil_notes)
        done = [r for r in results.values() if r.error is None]
        if len(done) != len(prompts):
            errors = sorted({str(r.error) for r in results.values() if r.error is not None})
            raise RuntimeError(f"{HF_GENERATE_BATCH}: {len(done)} of {len(prompts)} requests "
                               f"finished; errors: {errors or ['missing results']}")
        ttfts = [r.timestamps[0] - start for r in done if r.timestamps]
        prefill = counter.count - count_new_token_rows(prompts, max_new_tokens)
        return RunResult([list(r.generated_tokens) for r in done], prefill, ttfts,
                         details={"page_size": self.page_size, "num_blocks": cb_config.num_blocks})
