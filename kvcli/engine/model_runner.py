"""Model runner: turns a scheduled step into one packed forward pass and samples.

All scheduled tokens (prefill chunks of some requests, single decode tokens of
others) are flattened into one unpadded batch. Logits are computed only for the
rows that sample: the last token of each request whose chunk reaches the end of
its known tokens.
"""

from __future__ import annotations

import torch

from kvcli.engine import pooling, prompt_logprobs
from kvcli.engine.request import Request
from kvcli.engine.sampler import Sampler, SampleResult, greedy_rows
from kvcli.engine.scheduler import SchedulerOutput
from kvcli.model.attention import build_attention_metadata
from kvcli.model.backend import Backend, model_backend


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        kv_cache: torch.Tensor,
        block_size: int,
        sampler: Sampler,
        device: str | torch.device = "cpu",
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = block_size
        self.sampler = sampler
        self.device = torch.device(device)
        # Chosen once, when the model was built: which kernels run each phase (model/backend.py).
        self.backend: Backend = model_backend(model)
        self.native = self.backend.native
        self.pooled_done: list[Request] = []  # the last step's embedding requests now complete

    @torch.inference_mode()
    def execute(
        self, out: SchedulerOutput, block_tables: list[list[int]]
    ) -> tuple[list[Request], SampleResult]:
        """Run one step; returns the requests that sampled and their new tokens. Embedding
        requests never sample: their chunks are pooled (engine/pooling.py), and those whose
        prompt is complete are listed in ``self.pooled_done``."""
        input_ids: list[int] = []
        positions: list[int] = []
        num_computed: list[int] = []
        sample_rows: list[int] = []
        samplers: list[Request] = []
        scored: list[tuple[Request, int, int, range]] = []  # requests asking prompt logprobs
        pooled: list[tuple[Request, int, int, int]] = []  # embedding requests' chunks
        for req, n in zip(out.requests, out.num_new_tokens, strict=True):
            start = req.num_computed_tokens
            if req.sampling_params.prompt_logprobs is not None:
                scored.append((req, start, len(input_ids), prompt_logprobs.prompt_rows(req, start, n)))
            if req.pooling is not None:
                pooled.append((req, start, len(input_ids), n))
            input_ids.extend(req.token_ids[start : start + n])
            positions.extend(range(start, start + n))
            num_computed.append(start)
            if req.pooling is None and start + n == req.num_tokens:  # the chunk's last row samples
                sample_rows.append(len(input_ids) - 1)
                samplers.append(req)
        # The common fields, once per step; the model's attention backend builds its own.
        meta = build_attention_metadata(
            block_tables, num_computed, list(out.num_new_tokens), self.block_size, self.device,
        )
        ids_t = torch.tensor(input_ids, dtype=torch.long, device=self.device)
        pos_t = torch.tensor(positions, dtype=torch.long, device=self.device)
        hidden = self.model(ids_t, pos_t, meta, self.kv_cache)
        for req, start, row0, wanted in scored:
            prompt_logprobs.collect(self.model.compute_logits, hidden, req, start, row0, wanted)
        for req, start, row0, n in pooled:
            pooling.collect(hidden, req, start, row0, n)
        self.pooled_done = [req for req, start, _, n in pooled if start + n == req.num_tokens]
        if not samplers:
            return [], SampleResult([], [])
        rows = torch.tensor(sample_rows, dtype=torch.long, device=self.device)
        logits = self.model.compute_logits(hidden.index_select(0, rows))
        first_max, nonfinite = greedy_rows(logits)  # the model's own logits, before any mask
        if nonfinite:  # NaN would be argmax 0 for greedy rows and crash multinomial for others
            logits[nonfinite] = 0.0
        result = self.sampler(logits, samplers, None if nonfinite else first_max)
        result.nonfinite = nonfinite
        return samplers, result

