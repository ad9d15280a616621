"""LLMEngine: requests in, finished outputs out; one scheduler step = one forward pass.

Data flow of a step: Scheduler.schedule() (asks KVCacheManager for prefix hits and
slots) -> ModelRunner.execute() (packed forward over the paged KV cache, logits
for sampling rows only, Sampler) -> stop checks -> finished requests freed.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from kvcli.checkpoint.pooling import EmbeddingSpec, PoolingParams, read_embedding_spec
from kvcli.engine import pooling
from kvcli.engine.admission import check_embedding_prompt, check_prompt
from kvcli.engine.config import EngineConfig, budget_num_blocks
from kvcli.engine.kv_cache import KVCacheManager
from kvcli.engine.loading import computed_dtype, kv_dtype
from kvcli.engine.metrics import EngineMetrics
from kvcli.engine.model_runner import ModelRunner
from kvcli.engine.outputs import CompletionOutput, RequestOutput
from kvcli.engine.request import Request, RequestStatus
from kvcli.engine.sampler import Sampler
from kvcli.engine.scheduler import Scheduler, SchedulerConfig
from kvcli.engine.stop import check_stop, final_text, reported_stop_reason
from kvcli.sampling_params import SamplingParams

NONFINITE_LOGITS = "non-finite logits — damaged weights or an overflow"


class LLMEngine:
    def __init__(self, model: torch.nn.Module, tokenizer: Any, config: EngineConfig,
                 eos_token_ids: tuple[int, ...] = (), model_dir: Path | None = None) -> None:
        from kvcli.model.attention import allocate_kv_cache, kv_cache_bytes_per_block

        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(eos_token_ids)
        self.max_model_len = int(model.max_position_embeddings)
        self.vocab_size = int(model.vocab_size)
        dtype = kv_dtype(model, config)
        self._use_kv_dtype(dtype)
        num_blocks = config.num_blocks
        if num_blocks is None:
            per_block = kv_cache_bytes_per_block(model, config.block_size, dtype)
            num_blocks = budget_num_blocks(config, per_block)
        self.num_blocks = int(num_blocks)
        kv = allocate_kv_cache(model, self.num_blocks, config.block_size, dtype, config.device)
        self.disk = self._open_disk_tier(kv, model_dir)
        self._reset_bookkeeping()
        self.sampler = Sampler(config.seed)
        self.structured: Any = None  # kvcli.structured's StructuredDecoding, made on first use
        self.runner = ModelRunner(model, kv, config.block_size, self.sampler, config.device)
        # How this model embeds (kvcli/checkpoint/pooling.py): its sentence-transformers layout,
        # else last token + L2 norm; a model built without a directory gets the default.
        raw = getattr(getattr(model, "config", None), "raw", None) or {}
        self.embedding: EmbeddingSpec = (
            read_embedding_spec(model_dir, raw) if model_dir is not None
            else EmbeddingSpec(hidden_size=int(raw.get("hidden_size") or 0)))
        self.headless = bool(getattr(model, "headless", False))

    def _use_kv_dtype(self, dtype: torch.dtype) -> None:
        """The model attends a pool of ``dtype`` (--kv-cache-dtype; its backend is picked again
        where that differs from the model's dtype)."""
        setter = getattr(self.model, "set_kv_cache_dtype", None)
        if setter is not None:
            setter(dtype)
        elif dtype != computed_dtype(self.model, self.config):
            raise ValueError(f"kv_cache_dtype: {type(self.model).__name__} attends caches in "
                             f"its own dtype only")

    def _open_disk_tier(self, kv: torch.Tensor, model_dir: Path | None) -> Any:
        if self.config.kv_cache_dir is None:
            return None
        from kvcli.engine.kv_disk import disk_tier_for

        return disk_tier_for(self.config, self.model, model_dir, kv)

    def _reset_bookkeeping(self) -> None:
        config = self.config
        self.kv_manager = KVCacheManager(self.num_blocks, config.block_size,
                                         enable_caching=config.enable_prefix_caching,
                                         disk=self.disk,  # and frees out-of-window blocks:
                                         sliding_window=getattr(self.model,
                                                                "common_sliding_window", None))
        self.scheduler = Scheduler(
            SchedulerConfig(config.max_num_batched_tokens, config.max_num_seqs,
                            self.max_model_len, config.scheduling),
            self.kv_manager,
        )
        self.metrics = EngineMetrics(self.num_blocks, config.block_size)
        self._requests: dict[str, Request] = {}
        self._groups: dict[str, list[Request]] = {}  # parent id -> its n children
        self._arrivals = 0

    def reset_prefix_cache(self) -> None:
        """Forget every cached block and the metrics, keep the allocated KV pool (vLLM's
        ``LLM.reset_prefix_cache``): the next batch starts cold without re-zeroing ~1 GB."""
        if self.has_unfinished():
            raise RuntimeError("reset_prefix_cache: requests are still running")
        self._reset_bookkeeping()

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLMEngine:
        """The engine ``config`` describes: its model, weights and tokenizer loaded
        (engine/loading.py)."""
        from kvcli.engine.loading import load_parts

        parts = load_parts(config)
        return cls(parts.model, parts.tokenizer, parts.config, parts.eos_token_ids,
                   model_dir=parts.model_dir)

    # ----------------------------------------------------------------- requests
    def add_request(self, request_id: str, prompt_token_ids: list[int],
                    params: SamplingParams | None = None, cache_salt: str | None = None) -> None:
        """Queue a request; raises ``ValueError("field: reason")`` when it can never run."""
        if self.headless:
            raise ValueError(f"this model ({self.model.config.architecture}) has no "
                             "language-model head: it computes embeddings only")
        params = params or SamplingParams()
        params.validate()
        if params.max_tokens is None:  # "until the context ends", as vLLM's server defaults it
            params = replace(params, max_tokens=max(1, self.max_model_len - len(prompt_token_ids)))
        self._validate_prompt(request_id, prompt_token_ids, params)
        grammar = self._grammar(params)
        children = []
        for i in range(params.n):
            rid = request_id if params.n == 1 else f"{request_id}#{i}"
            req = Request(rid, list(prompt_token_ids), params, cache_salt=cache_salt,
                          block_size=self.config.block_size, eos_token_ids=self.eos_token_ids,
                          arrival_index=self._arrivals, parent_id=request_id)
            self._arrivals += 1
            children.append(req)
        self._groups[request_id] = children
        for req in children:
            self._requests[req.request_id] = req
        if grammar is not None:  # scheduled once it is compiled (see _admit_compiled)
            self.structured.hold(grammar, children)
            return
        for req in children:
            self.scheduler.add_request(req)

    def add_embedding_request(self, request_id: str, inputs: list[list[int]],
                              params: PoolingParams, cache_salt: str | None = None) -> None:
        """Queue one embedding per input (prefill only); their output comes back together, as
        one ``RequestOutput`` with ``embeddings`` in input order."""
        if request_id in self._groups:
            raise ValueError(f"id: duplicate request id {request_id!r}")
        for i, ids in enumerate(inputs):
            check_embedding_prompt(ids, self.max_model_len, self.vocab_size, self.num_blocks,
                                   self.config.block_size, f"input[{i}]" if inputs[1:] else "input")
        children = pooling.requests(request_id, inputs, params, cache_salt,
                                    self.config.block_size, self._arrivals)
        self._arrivals += len(children)
        self._groups[request_id] = children
        for req in children:
            self._requests[req.request_id] = req
            self.scheduler.add_request(req)

    def _grammar(self, params: SamplingParams) -> Any:
        """A constrained request's compiled grammar (once per distinct constraint per engine).

        xgrammar is imported only when the first constrained request arrives.
        """
        if params.structured_outputs is None:
            return None
        if self.structured is None:
            from kvcli.engine.structured_decoding import StructuredDecoding

            self.structured = StructuredDecoding(self.tokenizer, self.vocab_size,
                                                 self.eos_token_ids,
                                                 self.config.structured_compile_timeout)
            self.sampler.logits_mask = self.structured.mask
        return self.structured.compile(params.structured_outputs)

    def _validate_prompt(self, request_id: str, ids: list[int], params: SamplingParams) -> None:
        if request_id in self._groups:
            raise ValueError(f"id: duplicate request id {request_id!r}")
        check_prompt(ids, params, self.max_model_len, self.vocab_size, self.num_blocks,
                     self.config.block_size)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or (self.structured is not None
                                                   and self.structured.pending)

    def abort(self, request_id: str) -> None:
        for req in self._groups.pop(request_id, []):
            self.scheduler.finish(req, RequestStatus.FINISHED_ABORTED)
            self._forget(req)

    # --------------------------------------------------------------------- step
    def step(self) -> list[RequestOutput]:
        admitted = self._admit_compiled()
        out = self.scheduler.schedule()
        if not out.requests:
            return admitted + self._fail_unschedulable()
        t0 = time.perf_counter()
        tables = [self.kv_manager.get_block_ids(r.request_id) for r in out.requests]
        self.metrics.on_schedule(out, self.kv_manager)
        samplers, result = self.runner.execute(out, tables)
        if self.disk is not None:  # copy the blocks this step filled out before any reuse
            self.disk.save(self.kv_manager.drain_new_full_blocks())
        self.scheduler.update_after_step(out)
        self.metrics.on_computed(out)
        now = time.monotonic()
        finished = [done for i, req in enumerate(samplers)
                    if (done := self._advance(req, result, i, now)) is not None]
        finished += [done for req in self.runner.pooled_done  # embeddings: done after prefill
                     if (done := self._finish(req, pooling.complete(req, now))) is not None]
        self.metrics.on_step(out, len(samplers), time.perf_counter() - t0)
        return admitted + finished

    def _advance(self, req: Request, result: Any, row: int, now: float) -> RequestOutput | None:
        """Append the row's sampled token; the request's output once its whole group finished."""
        if row in result.nonfinite:  # its token would be garbage: the request fails instead
            req.error = NONFINITE_LOGITS
            return self._finish(req, RequestStatus.FINISHED_ERROR)
        req.append_output_token(result.token_ids[row])
        if result.logprobs[row] is not None:
            req.logprobs.append(result.logprobs[row])
        if req.first_token_time is None:
            req.first_token_time = now
        status = self._grammar_rejected(req) or check_stop(req, self.max_model_len, self.tokenizer.decode)
        return None if status is None else self._finish(req, status)

    def _finish(self, req: Request, status: RequestStatus) -> RequestOutput | None:
        self.scheduler.finish(req, status)
        return self._on_finished(req)

    def _admit_compiled(self) -> list[RequestOutput]:
        """Constrained requests join the scheduler once their grammar is compiled (compiling in
        a thread holds up no running row); a grammar that failed or ran past its time limit
        fails its request. With nothing to run, this waits at most 0.1 s for a compile: the
        caller's loop then sees a stop signal promptly."""
        if self.structured is None or not self.structured.pending:
            return []
        if not self.scheduler.has_unfinished():
            self.structured.wait()  # nothing else to run meanwhile
        ready, failed = self.structured.ready()
        for req in ready:
            self.scheduler.add_request(req)
        outs = []
        for req, error in failed:
            req.error, req.status = error, RequestStatus.FINISHED_ERROR
            done = self._on_finished(req)
            if done is not None:
                outs.append(done)
        return outs

    def _grammar_rejected(self, req: Request) -> RequestStatus | None:
        """Advance a constrained request's matcher; a token it rejects fails the request
        (the mask makes that impossible unless sampling broke: never emit such an output)."""
        if self.structured is None or self.structured.accept(req, req.output_token_ids[-1]):
            return None
        req.error = (f"structured_outputs: sampled token {req.output_token_ids[-1]} is not "
                     "allowed by the grammar")
        return RequestStatus.FINISHED_ERROR

    def _fail_unschedulable(self) -> list[RequestOutput]:
        """Nothing could run although requests wait: fail the head one instead of spinning.

        add_request rejects requests larger than the pool, so this is a safety net that turns
        a would-be livelock into a per-request error.
        """
        if self.scheduler.running or not self.scheduler.waiting:
            return []
        req = self.scheduler.waiting[0]
        req.error = "could not be scheduled: not enough free KV blocks even with nothing running"
        done = self._finish(req, RequestStatus.FINISHED_ERROR)
        if done is not None:
            done.error = req.error
            return [done]
        return []

    def _on_finished(self, req: Request) -> RequestOutput | None:
        parent = req.parent_id or req.request_id
        group = self._groups.get(parent)
        if group is None or not all(r.is_finished for r in group):
            return None
        del self._groups[parent]
        if group[0].pooling is not None:
            return self._embedding_output(parent, group)
        disk_hits = self.kv_manager.disk_hit_tokens.get(group[0].request_id, 0)
        outs = []
        for i, r in enumerate(group):
            outs.append(CompletionOutput(
                i, final_text(r, self.tokenizer.decode), list(r.output_token_ids),
                r.status.value, r.logprobs if r.sampling_params.logprobs is not None else None,
                reported_stop_reason(r)))
            if self.structured is not None:
                self.structured.on_finished(r, outs[-1].text)
            self._forget(r)
        first = group[0]
        ttft = None if first.first_token_time is None else first.first_token_time - first.arrival_time
        result = RequestOutput(parent, list(first.prompt_token_ids), outs,
                               max(first.num_cached_tokens, 0),
                               sum(r.num_preemptions for r in group), ttft)
        result.error = next((r.error for r in group if r.error), None)
        result.prefill_computed = sum(r.prefill_computed for r in group)
        result.prefill_skipped = sum(r.prefill_skipped for r in group)
        if first.sampling_params.prompt_logprobs is not None:
            result.prompt_logprobs = [None, *first.prompt_logprobs]
        if self.disk is not None:  # like num_cached_tokens: the first sample's admission
            result.num_disk_cached_tokens = disk_hits
        self.metrics.on_finished(result)
        return result

    def _embedding_output(self, parent: str, group: list[Request]) -> RequestOutput:
        result = pooling.group_output(parent, group, self.kv_manager.disk_hit_tokens
                                      if self.disk is not None else None)
        for r in group:
            self._forget(r)
        self.metrics.on_finished(result)
        return result

    def _forget(self, req: Request) -> None:
        self._requests.pop(req.request_id, None)
        self.sampler.forget(req.request_id)
        self.kv_manager.disk_hit_tokens.pop(req.request_id, None)
        if self.structured is not None:
            self.structured.forget(req.request_id)

    def stats(self) -> dict[str, Any]:
        stats = self.metrics.to_dict(self.kv_manager, self.scheduler.num_preemptions)
        # Counted where each sequence's own prefill_skipped is, so the two always agree.
        stats["prefill_tokens_skipped"] = self.scheduler.prefill_tokens_skipped
        if self.disk is not None:  # queued writes are waited for only once the run is done
            stats["disk_cache"] = self.disk.report(self.kv_manager.stats.disk_hits,
                                                   flush=not self.has_unfinished())
        if self.structured is not None:
            stats["structured"] = self.structured.report()
        return stats

    def close(self) -> None:
        """Finish the disk cache's queued writes (also done at interpreter exit)."""
        if self.disk is not None:
            self.disk.close()
