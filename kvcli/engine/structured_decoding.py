"""Grammar-constrained sampling inside the engine: one matcher per request, masks per step.

The engine hands a constrained request's samples to :meth:`StructuredDecoding.hold` while
its grammar compiles (once per run, shared by every request with the same constraint, on
a worker thread with a time limit) and schedules them once :meth:`ready` returns them; the sampler calls :meth:`mask` on each step's logits before anything else reads them, and
the engine calls :meth:`accept` with every token it appends. Only the rows of constrained
requests are filled and masked: the other rows' logits are never written, so their outputs
stay byte-identical to a run without structured outputs.

A matcher's state is a function of the request's output tokens. The engine keeps those
tokens through a preemption (it recomputes their K/V), and :meth:`mask` re-derives the
state from them whenever the two disagree, so a recomputed request resumes exactly where
its grammar was. Where the grammar starts is a function of the output too: after
``structured_after`` (``</think>``) when the reply starts inside its reasoning; when the
model may open the reasoning itself (``structured_opener``), the first token may be the
grammar's or the opener, and which one it was decides.
"""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any

import torch

from kvcli.engine.request import Request
from kvcli.structured.grammars import GrammarCache
from kvcli.structured.params import StructuredOutputsParams
from kvcli.structured.validity import StructuredStats, is_valid


@dataclass(slots=True)
class _Matcher:
    matcher: Any  # xgrammar.GrammarMatcher
    num_accepted: int = 0  # output tokens the matcher has consumed
    after: tuple[int, ...] = ()  # SamplingParams.structured_after: the grammar waits for these
    start: int | None = 0  # where in the output the grammar starts (None: not yet)
    scanned: int = 0  # output positions already searched for ``after`` (each step adds one)
    opener: int | None = None  # SamplingParams.structured_opener: the first token decides

    def undecided(self, output: list[int]) -> bool:
        """Whether the first token may still open the reasoning (then the grammar waits)."""
        return self.opener is not None and not output

    def begin(self, output: list[int]) -> int | None:
        """The grammar's first output position, once ``after`` has been written (or at once,
        when the model could have opened its reasoning and did not)."""
        if self.opener is not None and self.start is None and not self.scanned and output \
                and output[0] != self.opener:
            self.start = 0
        n = len(self.after)
        while self.start is None and self.scanned < len(output):
            self.scanned += 1
            if self.scanned >= n and tuple(output[self.scanned - n:self.scanned]) == self.after:
                self.start = self.scanned
        return self.start


class StructuredDecoding:
    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: tuple[int, ...],
                 compile_timeout: float | None) -> None:
        self.grammars = GrammarCache(tokenizer, vocab_size, stop_token_ids, compile_timeout)
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._matchers: dict[str, _Matcher] = {}
        self._held: list[tuple[Future, list[Request]]] = []  # waiting for their grammar
        self.stats = StructuredStats()

    def compile(self, params: StructuredOutputsParams) -> Future:
        """The compiled grammar, as a future (``ValueError("field: reason")`` when there can
        be no grammar: that is found before compiling)."""
        return self.grammars.get(params)

    def hold(self, compiled: Future, samples: list[Request]) -> None:
        self._held.append((compiled, samples))

    @property
    def pending(self) -> bool:
        return bool(self._held)

    def wait(self) -> None:
        """Wait a little for a held grammar (when nothing else can run): at most 0.1 s, so the
        caller sees a stop signal and a compile's time limit promptly."""
        if self._held:
            left = self.grammars.worker.seconds_left()
            wait([f for f, _ in self._held], timeout=0.1 if left is None else min(0.1, left),
                 return_when=FIRST_COMPLETED)

    def ready(self) -> tuple[list[Request], list[tuple[Request, str]]]:
        """Held samples whose grammar is compiled (their matchers made), in arrival order, and
        those whose compile failed, with the reason."""
        self.grammars.expire()
        ok: list[Request] = []
        failed: list[tuple[Request, str]] = []
        still: list[tuple[Future, list[Request]]] = []
        for compiled, samples in self._held:
            if not compiled.done():
                still.append((compiled, samples))
            elif compiled.exception() is not None:
                failed += [(r, _reason(compiled.exception())) for r in samples]
            else:
                for req in samples:
                    sp = req.sampling_params
                    self.add(req.request_id, compiled.result(), sp.structured_after,
                             sp.structured_opener)
                ok += samples
        self._held = still
        return ok, failed

    def add(self, request_id: str, compiled: Any, after: list[int] | None = None,
            opener: int | None = None) -> None:
        import xgrammar as xgr

        self._matchers[request_id] = _Matcher(xgr.GrammarMatcher(compiled), after=tuple(
            after or ()), start=None if after else 0, opener=opener)

    def on_finished(self, req: Request, text: str) -> None:
        """Count a finished constrained sample; one that ended by its grammar is re-checked."""
        state = self._matchers.get(req.request_id)
        if state is None:
            return
        self.stats.requests += 1
        if req.stop_reason not in req.eos_token_ids or req.error is not None \
                or state.start is None:  # cut, failed, or ended inside its reasoning
            self.stats.cut += 1
            return
        self.stats.completed += 1
        if state.start:  # the grammar covered only what follows the reasoning
            text = self._tokenizer.decode(req.output_token_ids[state.start:])
        done = bool(state.matcher.is_terminated())
        if not is_valid(req.sampling_params.structured_outputs, text, done):
            self.stats.invalid += 1

    def report(self) -> dict[str, Any]:
        self.stats.grammars_compiled = self.grammars.num_compiled
        self.stats.compile_s = self.grammars.compile_s
        return self.stats.to_dict()

    def forget(self, request_id: str) -> None:
        self._matchers.pop(request_id, None)
        self._held = [(f, [r for r in samples if r.request_id != request_id])
                      for f, samples in self._held]
        self._held = [(f, samples) for f, samples in self._held if samples]

    def mask(self, logits: torch.Tensor, requests: list[Request]) -> None:
        """Disallowed tokens of constrained rows -> -inf, in place; other rows untouched."""
        rows, openers = [], []
        for i, r in enumerate(requests):
            state = self._matchers.get(r.request_id)
            if state is None:
                continue
            if state.begin(r.output_token_ids) is not None:
                rows.append(i)
            elif state.undecided(r.output_token_ids):  # the grammar's first tokens or <think>
                rows.append(i)
                openers.append((i, state.opener))
        if not rows:
            return
        import xgrammar as xgr

        t0 = time.perf_counter()
        bitmask = xgr.allocate_token_bitmask(logits.shape[0], self.vocab_size)
        for i in rows:
            self._synced(requests[i]).fill_next_token_bitmask(bitmask, i)
        for i, token in openers:
            allow_token(bitmask, i, token)
        xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), indices=rows)
        self.stats.mask_s += time.perf_counter() - t0

    def accept(self, req: Request, token_id: int) -> bool:
        """Advance ``req``'s matcher by its newest token; False if the grammar rejects it."""
        state = self._matchers.get(req.request_id)
        start = None if state is None else state.begin(req.output_token_ids)
        if start is None or start >= len(req.output_token_ids):
            return True  # unconstrained, still reasoning, or this token ended the reasoning
        self._synced(req, upto=len(req.output_token_ids) - 1)
        ok = bool(state.matcher.accept_token(token_id))
        state.num_accepted += ok
        return ok

    def _synced(self, req: Request, upto: int | None = None) -> Any:
        """The matcher after exactly ``output_token_ids[:upto]`` (all of them by default)."""
        state = self._matchers[req.request_id]
        tokens = req.output_token_ids if upto is None else req.output_token_ids[:upto]
        tokens = tokens[state.start or 0:]
        if state.num_accepted != len(tokens):
            state.matcher.reset()
            state.num_accepted = 0
            for token in tokens:  # a preempted / recomputed request: replay its output
                if not state.matcher.accept_token(token):
                    break
                state.num_accepted += 1
        return state.matcher


def allow_token(bitmask: torch.Tensor, row: int, token: int) -> None:
    """Set ``token``'s bit in an xgrammar bitmask row (int32 words: bit 31 is the sign bit)."""
    word, bit = divmod(token, 32)
    bitmask[row, word] |= -(1 << 31) if bit == 31 else 1 << bit


def _reason(err: BaseException) -> str:
    """A compile's error: a ``ValueError`` already names the field ("path: reason")."""
    return str(err) if isinstance(err, ValueError) else f"structured_outputs: {err}"
