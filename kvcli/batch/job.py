"""The batch loop: read lines lazily, keep at most ``max_pending`` requests in the engine, write results.

Each iteration admits lines until the window is full (parse -> encode ->
``engine.add_request``), then runs one ``engine.step()`` and writes what
finished. A bad line becomes an error result right away and the batch goes on
(``--fail-fast`` stops it). Memory stays bounded whatever the input size: lines
are read one at a time, and with ``--ordered`` the window also counts results
waiting for an earlier one, so at most ``max_pending`` are ever held.

Engine requests are named by their input-order number, not the line's id:
duplicate ids in the input must not collide inside the engine. The engine is an
LLMEngine or anything with its interface: ``kvcli generate --ray`` drives a pool
of Ray actors (kvcli/distributed/pool.py) through this same loop.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kvcli.batch.encode import PromptEncoder
from kvcli.batch.guard import TracebackLog, internal_failure
from kvcli.batch.output import ResultFormatter, engine_failure
from kvcli.batch.parse import ParseOptions, parse_line
from kvcli.batch.records import FailedLine, LineError, LineId, LineRequest, RejectedRequest
from kvcli.batch.report import Reporter
from kvcli.batch.seen import SeenIds
from kvcli.batch.signals import StopSignal
from kvcli.batch.source import RawLine
from kvcli.batch.summary import FAILED, RunCounters, Tally
from kvcli.batch.writer import ResultWriter
from kvcli.engine.admission import CONTEXT_OVERFLOW
from kvcli.numbers import plural
from kvcli.reasoning import ReasoningParser
from kvcli.sampling_params import SamplingParams

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BROKEN_PIPE = 0, 1, 2, 141


class OutputError(Exception):
    """Writing a result failed (full disk, closed pipe...): the job cannot go on."""

    def __init__(self, err: OSError) -> None:
        super().__init__(str(err))
        self.os_error = err


class InputError(Exception):
    """Reading the input failed part-way."""


@dataclass(slots=True)
class JobOptions:
    parse: ParseOptions = field(default_factory=ParseOptions)
    max_pending: int = 256
    fail_fast: bool = False
    input_name: str = "-"
    # A line without max_tokens gets min(default, what the context leaves), so the default
    # never fails a line (None: the context); an explicit one that does not fit is the line's
    # error unless clamp_max_tokens (vLLM: explicit over-long is a 400, absent is clamped).
    default_max_tokens: int | None = 256
    clamp_max_tokens: bool = False
    where: Callable[[int], str] | None = None  # "FILE:LINE" of a line number (several INPUTs)
    debug: bool = False  # the full traceback of a line's unexpected exception (guard.py)
    reasoning: ReasoningParser | None = None  # --reasoning-parser, resolved for the model


@dataclass(slots=True)
class JobOutcome:
    exit_code: int
    status: str  # "completed" | "fail-fast" | "SIGINT" | "SIGTERM" | "broken pipe" | error text
    counters: RunCounters
    aborted: int = 0  # requests in flight when the job stopped early (not written)


class BatchJob:
    def __init__(self, engine: Any, lines: Iterator[RawLine], writer: ResultWriter,
                 formatter: ResultFormatter, reporter: Reporter, opts: JobOptions,
                 done: set[str] | None = None, counters: RunCounters | None = None) -> None:
        self.engine = engine
        self.lines = lines
        self.writer = writer
        self.formatter = formatter
        self.reporter = reporter
        self.opts = opts
        self.done = done or set()  # keys already in the output (--resume)
        self.counters = counters or RunCounters()
        writer.on_written = self._written  # results count once their line is on disk
        self.encoder = PromptEncoder(engine.tokenizer, engine.max_model_len, engine.vocab_size,
                                     reasoning=opts.reasoning)
        self._pending: dict[str, tuple[int, LineRequest]] = {}  # engine id -> (seq, request)
        self._seen = SeenIds()  # ids of earlier lines (duplicates)
        self._tracebacks = TracebackLog(reporter.error, opts.debug)
        self._other_model: tuple[int, str] | None = None  # the first line naming another model
        self._other_model_lines = 0
        self._warned_fields: set[str] = set()
        self._exhausted = False
        self._failed_fast = False

    # ------------------------------------------------------------------- loop
    def run(self, stop: StopSignal | None = None) -> JobOutcome:
        """``stop``: what asks the job to stop (default: SIGINT / SIGTERM; kvcli serve passes
        its own, truthy once a batch is cancelled or expires or the server shuts down)."""
        try:
            with stop if stop is not None else StopSignal() as stop:
                outcome = self._run_loop(stop)
        finally:
            # The writer holds this job's callback: without the cycle the job, and the engine
            # (weights, KV pool) it holds, are freed as soon as an in-process caller (LLM
            # users, kvcli serve, the tests) drops them, not at some later cyclic collection.
            self.writer.on_written = None
        return outcome

    def _run_loop(self, stop: StopSignal) -> JobOutcome:
        try:
            self._loop(stop)
        except OutputError as err:
            return self._stopped_by_output_error(err.os_error)
        except InputError as err:
            self.reporter.error(f"kvcli generate: {err}")
            return self._outcome(EXIT_USAGE, "input error")
        if stop:
            return self._outcome(stop.exit_code, stop.name)
        if self._failed_fast:
            return self._outcome(EXIT_FAILED, "fail-fast")
        self._warn_once_per_run()
        return JobOutcome(EXIT_FAILED if self.counters.failed else EXIT_OK, "completed",
                          self.counters)

    def _loop(self, stop: StopSignal) -> None:
        while True:
            self._admit(stop)
            # Admission only pauses while the engine has work, so an idle engine is the end.
            if stop or self._failed_fast or not self.engine.has_unfinished():
                return
            for out in self.engine.step():
                self._finish(out)

    def _admit(self, stop: StopSignal) -> None:
        limit = self.opts.max_pending
        while (not self._exhausted and not stop and not self._failed_fast
               and len(self._pending) < limit and self.writer.outstanding < limit):
            raw = self._next_line()
            if raw is None:
                self._exhausted = True
            else:
                self._take(raw)

    def _next_line(self) -> RawLine | None:
        try:
            return next(self.lines, None)
        except OSError as err:
            raise InputError(f"cannot read {self.opts.input_name}: {err.strerror or err}") from None

    # -------------------------------------------------------------- per line
    # Every stage of one line runs under the guard (kvcli/batch/guard.py): parse_line returns
    # its own unexpected exceptions as a FailedLine, _admit_line and the formatting in _finish
    # are wrapped here.
    def _take(self, raw: RawLine) -> None:
        parsed = parse_line(raw, self.opts.parse)
        key = parsed.ident.key
        rank = getattr(raw, "rank", None)  # --input-order prefix: its input position
        if key in self.done:
            if rank is not None:
                self.writer.skip(rank)
            self.counters.skipped += 1
            self.reporter.advance(self.counters)
            return
        self._note_duplicate(parsed.ident)
        seq = self.writer.reserve() if rank is None else self.writer.reserve_rank(rank)
        if isinstance(parsed, FailedLine):
            self._fail(seq, parsed)
            return
        try:
            self._admit_line(seq, parsed, raw.line_no)
        except LineError as err:
            self._fail(seq, FailedLine(parsed.ident, parsed.style, err))
        except ValueError as err:  # the engine's own checks ("field: reason")
            self._reject(seq, parsed, err)
        except Exception as err:  # the guard: whatever else one line raises stays its own
            self._forget(str(seq))
            self._fail(seq, internal_failure(parsed.ident, parsed.style, "preparing the request",
                                             err))

    def _admit_line(self, seq: int, parsed: LineRequest, line_no: int) -> None:
        self._warn_ignored(parsed, line_no)
        if parsed.other_model is not None:
            self._other_model_lines += 1
            self._other_model = self._other_model or (line_no, parsed.other_model)
        if parsed.embed is not None:
            self._admit_embedding(seq, parsed)
            return
        ids = self.encoder.encode_line(parsed, line_no)
        self._fit_max_tokens(parsed.params, len(ids))
        self.engine.add_request(str(seq), ids, parsed.params, parsed.cache_salt)
        parsed.prompt.text = parsed.prompt.messages = parsed.prompt.token_ids = None  # free it
        self._pending[str(seq)] = (seq, parsed)

    def _admit_embedding(self, seq: int, parsed: LineRequest) -> None:
        """Every input of the line as one engine request (engine/pooling.py)."""
        embed = parsed.embed
        assert embed is not None
        spec = getattr(self.engine, "embedding", None)
        if spec is None or not hasattr(self.engine, "add_embedding_request"):
            raise LineError(f"{parsed.field_prefix}input", "embeddings are not supported by this "
                            "engine (kvcli generate --ray runs chat and completions lines only)")
        params = spec.params(embed.dimensions)  # ValueError("dimensions: ...") is the line's
        inputs = [self.encoder.encode_input(p) for p in embed.inputs]
        self.engine.add_embedding_request(str(seq), inputs, params, parsed.cache_salt)
        embed.inputs = []
        parsed.prompt.text = parsed.prompt.token_ids = None  # free them
        self._pending[str(seq)] = (seq, parsed)

    def _forget(self, engine_id: str) -> None:
        """After add_request raised part-way, nothing of the request may stay in the engine."""
        self._pending.pop(engine_id, None)
        try:
            self.engine.abort(engine_id)
        except Exception:  # noqa: BLE001 - it was never added: nothing to abort
            pass

    def _fit_max_tokens(self, params: SamplingParams, prompt_len: int) -> None:
        room = self.engine.max_model_len - prompt_len  # >= 1: the encoder refused longer prompts
        if params.max_tokens is None:
            default = self.opts.default_max_tokens
            params.max_tokens = room if default is None else min(default, room)
        elif self.opts.clamp_max_tokens and params.max_tokens > room:
            params.max_tokens = room

    def _finish(self, out: Any) -> None:
        pending = self._pending.pop(out.request_id, None)
        if pending is None:  # a request the guard failed at admission (_forget)
            return
        seq, req = pending
        if isinstance(out, RejectedRequest):  # add_request's error, from a remote engine
            self._reject(seq, req, ValueError(out.message))
            return
        try:
            failed = engine_failure(req, out)
            if failed is None:
                line, tally = self.formatter.success(req, out), Tally.of(out)
        except Exception as err:  # the guard: parsing the reply or serialising the result
            failed = internal_failure(req.ident, req.style, "writing the result", err)
        if failed is not None:
            self._fail(seq, failed)
            return
        self._emit(seq, line, tally)

    def _reject(self, seq: int, req: LineRequest, err: ValueError) -> None:
        if CONTEXT_OVERFLOW in str(err):  # the engine's words; the flag is the batch's
            err = ValueError(f"{err} (--clamp-max-tokens caps it there instead)")
        error = LineError.from_value_error(err)
        if error.field and req.field_prefix and not error.field.startswith(req.field_prefix):
            error = LineError(req.field_prefix + error.field, error.message, error.code)
        self._fail(seq, FailedLine(req.ident, req.style, error))

    def _fail(self, seq: int, failed: FailedLine) -> None:
        ident = failed.ident
        where = self._where(ident.line_no)
        if ident.field is not None:
            where += f" ({ident.field} {ident.key!r})"
        self.reporter.error(f"{where}: {failed.describe}")
        if failed.cause is not None:
            self._tracebacks.log(where, failed.cause)
        self._emit(seq, self.formatter.failure(failed), FAILED)
        if self.opts.fail_fast:
            self._failed_fast = True

    def _emit(self, seq: int, line: bytes, tally: Tally) -> None:
        try:
            self.writer.submit(seq, line, tally)
        except OSError as err:
            raise OutputError(err) from None

    def _written(self, tally: Tally) -> None:
        self.counters.add(tally)
        self.reporter.advance(self.counters)

    def _note_duplicate(self, ident: LineId) -> None:
        first = self._seen.add(ident)
        if first is not None:
            self.counters.duplicates += 1
            self.reporter.error(f"{self._where(ident.line_no)}: id {ident.key!r} already "
                                f"used on line {first}; both run, but --resume treats the id as "
                                "done once either result is written")

    def _warn_ignored(self, req: LineRequest, line_no: int) -> None:
        for name in req.ignored_fields:
            if name not in self._warned_fields:
                self._warned_fields.add(name)
                self.reporter.error(f"{self._where(line_no)}: unknown field {name!r} "
                                    "ignored (reported once; --strict makes it an error)")

    # ------------------------------------------------------------------ stop
    def _abort_pending(self) -> int:
        for engine_id in self._pending:
            self.engine.abort(engine_id)
        n = len(self._pending) + self.writer.unwritten
        self._pending.clear()
        return n

    def _where(self, line_no: int) -> str:
        where = self.opts.where
        return where(line_no) if where is not None else f"{self.opts.input_name}:{line_no}"

    def _warn_once_per_run(self) -> None:
        """The template renders the same prompt with and without ``tools``; lines name
        another model than the one that ran them."""
        lines = self.encoder.tools_ignored
        if lines:
            self.reporter.error(f"kvcli generate: warning: the model's chat template ignores "
                                f"`tools`; they were dropped from {len(lines)} line"
                                f"{'s' if len(lines) != 1 else ''} (first: line {lines[0]})")
        if self._other_model is not None:
            n, (line_no, name) = self._other_model_lines, self._other_model
            served = ", ".join(repr(m) for m in self.opts.parse.models)
            self.reporter.error(f"kvcli generate: warning: {n} line{'s' if n != 1 else ''} "
                                f"named another model than {served} and ran on it (first: "
                                f"{self._where(line_no)}, {name!r}); --served-model-name NAME "
                                "accepts a name, --strict makes it the line's error")

    def _outcome(self, code: int, status: str) -> JobOutcome:
        self._warn_once_per_run()
        return JobOutcome(code, status, self.counters, self._abort_pending())

    def _stopped_by_output_error(self, err: OSError) -> JobOutcome:
        if err.errno == errno.EPIPE:  # | head: the reader is gone, nothing to say
            return self._outcome(EXIT_BROKEN_PIPE, "broken pipe")
        hint = {errno.ENOSPC: " (disk full)", errno.EDQUOT: " (disk full)",
                errno.EFBIG: " (file size limit)"}.get(err.errno or 0, "")
        self.reporter.error(f"kvcli generate: cannot write to {self.writer.sink.name}: "
                            f"{err.strerror or err}{hint}; "
                            f"{plural(self.writer.written, 'result')} written")
        return self._outcome(EXIT_FAILED, f"write error: {err.strerror or err}")
