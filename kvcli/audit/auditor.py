"""The audit pipeline: render, tokenize in batches, match against every earlier prompt, run rules.

Prompts stream through in chunks (batch tokenization), one at a time through the
prefix index in input order, so the cache model is exact for that order and
memory holds the index, a bounded set of recent texts and small per-prompt results.
"""

from __future__ import annotations

import gc
from array import array
from collections.abc import Callable, Container, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import accumulate

from kvcli.audit.capacity import CacheModels
from kvcli.audit.contrast import Contrast, build_contrast
from kvcli.audit.counting import HitCounter, segment_token_ends
from kvcli.audit.excerpt import make_excerpt
from kvcli.audit.groups import GroupsReport, SegmentStore, locate, prefix_groups
from kvcli.audit.hits import usable_blocks
from kvcli.audit.prefix_index import Match, PrefixIndex
from kvcli.audit.profiles import Profile
from kvcli.audit.records import (
    BlockView,
    Divergence,
    FieldError,
    Finding,
    InputProblem,
    PromptRequest,
    PromptResult,
    RenderedPrompt,
)  # fmt: skip
from kvcli.audit.render import render_request
from kvcli.audit.rules import AuditContext, PromptView, make_rules
from kvcli.audit.rules.breakpoints import unread_findings
from kvcli.audit.shapes import Conversations, ToolPrinter, shape_of
from kvcli.audit.template import render_with_template
from kvcli.audit.textstore import TextStore
from kvcli.audit.tokenize_worker import TokenizeWorker
from kvcli.audit.tokenizers import AuditTokenizer, TiktokenTokenizer
from kvcli.inputs import LineError

Tokens = tuple[bytes, list[int]]  # token ids as uint32 bytes, and each segment's end (per-segment mode)


@dataclass(slots=True)
class AuditConfig:
    profile: Profile
    show_blocks: bool = False
    excerpts: bool = False  # each prompt's first divergence, both sides (text report, HTML)
    chunk_size: int = 128
    text_budget_chars: int = 32_000_000
    # Freeze the cyclic GC's view of everything alive after each chunk: the index and the
    # results are long-lived and acyclic, and rescanning them grows with the input. Global
    # to the process, so only the CLI and the benchmark turn it on.
    freeze_gc: bool = False
    tokenize_in_process: bool = True  # a forked worker process when the tokenizer allows
    capacity: bool = True  # the capacity curve (one pass for every size; off for --diff)
    cache_blocks: int | None = None  # --cache-size: replay through the engine's pool of this size
    concurrency: int = 1
    token_bytes: int | None = None  # KV bytes per token (--model): sizes in bytes too
    ttl: float | None = None  # --cache-ttl: a cached prefix's lifetime (default: the provider's)
    disk: Container[bytes] | None = None  # --kv-cache-dir: hashes a persistent KV cache holds


@dataclass(slots=True)
class Summary:
    prompts: int = 0
    tokens: int = 0
    cached_tokens: int = 0
    tokens_at_stake: int = 0
    findings: dict[str, int] = field(default_factory=lambda: {"error": 0, "warning": 0, "info": 0})

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.tokens if self.tokens else 0.0


class Auditor:
    def __init__(self, config: AuditConfig, tokenizer: AuditTokenizer) -> None:
        self.config = config
        self.profile = config.profile
        self.tokenizer = tokenizer
        self.index = PrefixIndex(self.profile.block_size)
        self.hits = HitCounter.make(self.profile, config.ttl, config.disk)
        self.texts = TextStore(config.text_budget_chars)
        self.summary = Summary()
        self._ids: list[str | None] = []
        self._sessions: list[str | None] = []
        self.conversations = Conversations()
        self.ctx = AuditContext(
            self.profile, self.text_of, self._ids.__getitem__, self._sessions.__getitem__, self.conversations
        )
        self.rules = make_rules(self.ctx)
        self._printer = ToolPrinter()
        self._own_rendering = isinstance(tokenizer, TiktokenTokenizer)
        self._rendered = 0  # prompts rendered so far: the next prompt's index
        self.tools_ignored: list[str] = []  # requests whose tools the model's template dropped
        self.cache_models = self._cache_models()
        self.segments = SegmentStore()  # where prompts' parts start, to say where a shared prefix ends
        # Called with each prompt, its ids, chain hashes and result (the CI baseline).
        self.observers: list[Callable[[RenderedPrompt, array[int], list[bytes], PromptResult], None]] = []

    def _cache_models(self) -> CacheModels | None:
        """Bounded caches (the curve, --cache-size) for the block profiles; Anthropic's
        breakpoint cache has no block pool to bound."""
        config, bs = self.config, self.profile.block_size
        if self.profile.hit_model != "blocks" or not config.capacity:
            return None
        return CacheModels.make(bs, config.cache_blocks, config.concurrency, config.token_bytes)

    # ---- public --------------------------------------------------------------
    def run(
        self, items: Iterable[PromptRequest | InputProblem], on_problem: Callable[[InputProblem], None]
    ) -> Iterator[PromptResult]:
        """Results in input order. Chunk k+1 is tokenized (see TokenizeWorker) while chunk k is
        audited, so on a machine with a spare core the audit costs little more than tokenizing."""
        with TokenizeWorker(self.tokenizer, self.config.tokenize_in_process) as worker:
            pending: tuple[list[RenderedPrompt], Callable[[], list[Tokens]]] | None = None
            for chunk in self._chunks(items, on_problem):
                rendered = self._render_all(chunk, on_problem)
                submitted = (rendered, self._submit(worker, rendered))
                if pending is not None:
                    yield from self._audit_all(*pending)
                pending = submitted
                if self.config.freeze_gc:
                    gc.freeze()
            if pending is not None:
                yield from self._audit_all(*pending)

    def _chunks(
        self, items: Iterable[PromptRequest | InputProblem], on_problem: Callable[[InputProblem], None]
    ) -> Iterator[list[PromptRequest]]:
        chunk: list[PromptRequest] = []
        for item in items:
            if isinstance(item, InputProblem):
                on_problem(item)
                continue
            chunk.append(item)
            if len(chunk) >= self.config.chunk_size:
                yield chunk
                chunk = []
        if chunk:
            yield chunk

    def finish(self) -> list[Finding]:
        found = [f for rule in self.rules for f in rule.finish()]
        found += unread_findings(self.hits.breakpoints, self.profile, self.ctx)
        for f in found:  # run-wide findings (one per place) count in the summary as the per-prompt ones
            self.summary.findings[f.severity] += 1
        return found

    def prefix_groups(self) -> GroupsReport:
        report = prefix_groups(self.index, self.summary.tokens, block_hits=self.profile.hit_model not in ("tokens", "slots"))
        locate(report, self.index, self.text_of, self.tokenizer.char_offset, self.segments)
        return report

    def text_of(self, index: int) -> str:
        """An earlier prompt's text: kept if recent, else decoded from its tokens in the index."""
        text = self.texts.get(index)
        return text if text is not None else self.tokenizer.decode(self.index.tokens_of(index))

    # ---- pipeline ------------------------------------------------------------
    def _render(self, index: int, request: PromptRequest) -> RenderedPrompt:
        if self._own_rendering:
            return render_request(index, request)
        return render_with_template(index, request, self.tokenizer)

    def _render_all(self, requests: list[PromptRequest], on_problem: Callable[[InputProblem], None]) -> list[RenderedPrompt]:
        rendered: list[RenderedPrompt] = []
        for request in requests:
            try:
                prompt = self._render(self._rendered, request)
                rendered.append(prompt)
                self._rendered += 1
                if prompt.tools_ignored:
                    self.tools_ignored.append(request.source)
            except (FieldError, LineError) as err:
                on_problem(InputProblem(request.source, str(err)))
        return rendered

    def _audit_all(self, rendered: list[RenderedPrompt], tokens: Callable[[], list[Tokens]]) -> Iterator[PromptResult]:
        for prompt, (raw, ends) in zip(rendered, tokens(), strict=True):
            ids = array("I")
            ids.frombytes(raw)
            yield self._audit(prompt, ids, raw, ends)

    def _submit(self, worker: TokenizeWorker, prompts: list[RenderedPrompt]) -> Callable[[], list[Tokens]]:
        """Send a chunk to the worker; the returned function collects (raw token bytes, segment ends)."""
        if self.profile.per_segment_tokens:  # Anthropic hashes per content block: count per block
            pieces = [p.text[s.start : s.end] for p in prompts for s in p.segments]
            future = worker.submit(pieces, False)

            def per_segment() -> list[Tokens]:
                encoded = iter(future.result())
                out = []
                for p in prompts:
                    parts = [next(encoded) for _ in p.segments]
                    ends = list(accumulate(len(part) // 4 for part in parts))
                    out.append((b"".join(parts), ends))
                return out

            return per_segment
        groups = [([i for i, p in enumerate(prompts) if p.add_special_tokens == flag and p.token_ids is None], flag)
                  for flag in (False, True)]
        futures = [(group, worker.submit([prompts[i].text for i in group], flag)) for group, flag in groups if group]

        def whole() -> list[Tokens]:
            result: list[Tokens] = [(array("I", p.token_ids or []).tobytes(), []) for p in prompts]
            for group, future in futures:
                for i, raw in zip(group, future.result(), strict=True):
                    result[i] = (raw, [])
            return result

        return whole

    def _audit(self, prompt: RenderedPrompt, ids: array[int], raw: bytes, ends: list[int]) -> PromptResult:
        request, bs = prompt.request, self.profile.block_size
        shape = shape_of(prompt, self._printer)
        previous = self.conversations.previous(shape) if shape is not None else None
        hint = previous.index if previous is not None else prompt.index - 1
        match = self.index.match(ids, raw, request.cache_salt, hint)
        min_tokens = self.profile.min_tokens_for(request.model)
        if not ends and self.profile.hit_model == "blocks" and self.profile.takes_breakpoints(request.model):
            ends = segment_token_ends(prompt, ids, self.tokenizer)  # OpenAI's breakpoints
        cached, read = self.hits.cached(prompt, ids, ends, match, min_tokens)
        divergence = None
        if match.against is not None:
            char = self.tokenizer.char_offset(prompt.text, ids, match.lcp)
            divergence = Divergence(match.lcp, match.lcp // bs, char, match.against, self._ids[match.against])
        view = PromptView(
            prompt, len(ids), cached, match.lcp, min_tokens, divergence, shape,
            self._contrast_factory(prompt, divergence),
            breakpoint_reachable=read.reachable if read else 0, breakpoints=read.breakpoints if read else 0,
            breakpoint_marks=read.marks if read else [],
        )  # fmt: skip
        self._ids.append(request.id)
        self._sessions.append(request.session)
        self._run_rules(view)
        nodes = self.index.insert(prompt.index, raw, request.cache_salt, match)
        self.hits.after(nodes, request.time)
        if len(nodes) > match.blocks:  # it owns new blocks: it may be a shared prefix's first prompt
            self.segments.put(prompt.index, prompt.segments)
        bounded = None
        if self.cache_models is not None:
            bounded = self.cache_models.observe(nodes, match.blocks, match.hashes, len(ids), min_tokens)
        self.texts.put(prompt.index, prompt.text)
        if view.shape is not None:
            self.conversations.record(view.shape)
        result = self._result(view, match)
        result.bounded_cached_tokens = bounded
        for observe in self.observers:
            observe(prompt, ids, match.hashes, result)
        return result

    def _contrast_factory(self, prompt: RenderedPrompt, divergence: Divergence | None) -> Callable[[], Contrast | None]:
        def build() -> Contrast | None:
            if divergence is None:
                return None
            return build_contrast(prompt.text, self.text_of(divergence.against), divergence.against, divergence.char)

        return build

    def _run_rules(self, view: PromptView) -> None:
        explained = False  # the first divergence rule that explains the divergence claims it
        for rule in self.rules:
            if rule.phase == "divergence" and explained:
                continue
            found = rule.check(view)
            explained = explained or (bool(found) and rule.phase == "divergence")
            view.findings.extend(found)

    def _result(self, view: PromptView, match: Match) -> PromptResult:
        prompt, request = view.rendered, view.rendered.request
        stake = max((f.tokens_at_stake for f in view.findings if f.severity != "info"), default=0)
        stake = min(stake, max(0, view.tokens - view.cached))
        s = self.summary
        s.prompts += 1
        s.tokens += view.tokens
        s.cached_tokens += view.cached
        s.tokens_at_stake += stake
        for f in view.findings:
            s.findings[f.severity] += 1
        result = PromptResult(
            prompt.index, request.id, request.source, request.session, view.tokens, view.cached,
            view.divergence, view.findings, tokens_at_stake=stake,
            matched_tokens=max(view.cached, match.blocks * self.profile.block_size if self.profile.hit_model == "blocks" else 0),
        )  # fmt: skip
        if self.config.show_blocks:
            result.blocks = self._blocks(view, match)
        if self.config.excerpts:
            contrast = view.contrast()
            if contrast is not None and not contrast.other_ends_first:
                result.excerpt = make_excerpt(contrast.this, contrast.start, contrast.other, against=contrast.against)
        return result

    def _blocks(self, view: PromptView, match: Match) -> list[BlockView]:
        bs, profile = self.profile.block_size, self.profile
        usable = usable_blocks(match.blocks, view.tokens, bs, profile.keep_last_token)
        blocks = []
        for j, h in enumerate(match.hashes):
            if profile.hit_model == "blocks":
                state = "hit" if j < usable and view.cached else "capped" if j < match.blocks else "miss"
            else:
                state = "hit" if (j + 1) * bs <= view.cached else "miss"
            blocks.append(BlockView(h.hex()[:8], j * bs, (j + 1) * bs, state))
        return blocks
