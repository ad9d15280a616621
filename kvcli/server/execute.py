"""One batch's lines through the engine with kvcli generate's machinery, resumable after a kill.

The results go, as in ``generate -o FILE --resume``, through the streamed writer (one
``os.write`` per whole line, O_APPEND) into two files: successes to the output file,
failed lines to the error file (OpenAI's split). Before a run both files are scanned
(kvcli/batch/resume.py: a partial last line left by SIGKILL is cut off) and every
``custom_id`` already in either is skipped, so a restarted server finishes a batch with
each request exactly once. Counts and usage start from what the files hold.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from kvcli.batch.config import GenerateConfig
from kvcli.batch.job import BatchJob, JobOutcome
from kvcli.batch.output import ResultFormatter
from kvcli.batch.report import Reporter
from kvcli.batch.resume import scan_output
from kvcli.batch.run import cache_block, job_options
from kvcli.batch.source import iter_lines
from kvcli.batch.summary import RunCounters
from kvcli.batch.writer import FdSink, LineSink, ResultWriter

_PROGRESS_EVERY_S = 0.25  # request_counts in the database lag the files by at most this


@dataclass(slots=True)
class Progress:
    """A batch's request counts and token usage: what its result files hold."""

    completed: int = 0
    failed: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0

    def plus(self, run: RunCounters) -> Progress:
        return Progress(self.completed + run.ok, self.failed + run.failed,
                        self.input_tokens + run.prompt_tokens,
                        self.cached_tokens + run.cached_tokens,
                        self.output_tokens + run.generated_tokens)


@dataclass(slots=True)
class SplitWriter(ResultWriter):
    """kvcli's result writer with OpenAI's two files: failed lines go to ``errors``."""

    errors: LineSink | None = None

    def _sink_for(self, tag: Any) -> LineSink:
        failed = self.errors is not None and not getattr(tag, "ok", True)
        return self.errors if failed else self.sink


class _ProgressReporter(Reporter):
    """Instead of a progress bar: the counts to the database, at most every 0.25 s. Per-line
    errors are not logged: each is a line of the error file."""

    def __init__(self, base: Progress, publish: Callable[[Progress], None]) -> None:
        super().__init__(show_progress=False, quiet=True)
        self.base, self.publish = base, publish
        self._last = 0.0

    def error(self, text: str) -> None:
        pass

    def advance(self, counters: RunCounters, n: int = 1) -> None:
        now = time.monotonic()
        if now - self._last >= _PROGRESS_EVERY_S:
            self._last = now
            self.publish(self.base.plus(counters))


def scan_results(output: Path, errors: Path) -> tuple[set[str], Progress]:
    """The custom_ids already answered, and the counts and usage of those answers."""
    out, err = scan_output(str(output)), scan_output(str(errors))
    progress = Progress(completed=out.results, failed=err.results)
    if out.results and os.path.exists(output):
        with open(output, "rb") as f:
            for raw in iter_lines(f):
                usage = _usage(raw.data)
                progress.input_tokens += usage.get("prompt_tokens", 0)
                progress.output_tokens += usage.get("completion_tokens", 0)
                details = usage.get("prompt_tokens_details") or {}
                progress.cached_tokens += details.get("cached_tokens", 0)
    return out.done | err.done, progress


def _usage(line: bytes | None) -> dict[str, Any]:
    try:
        return orjson.loads(line or b"{}")["response"]["body"]["usage"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return {}


def open_append(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


def _sink(path: Path) -> FdSink:
    return FdSink(open_append(path), path.name, owns_fd=True, exclusive=True)


@dataclass(slots=True)
class BatchRun:
    """What one batch runs with: the engine, the command's line defaults, the model's name."""

    engine: Any
    cfg: GenerateConfig  # sampling defaults, seed, max_pending, max_line_bytes
    model_names: tuple[str, ...]  # what body.model may say; results report the first

    def run(self, input_path: Path, output: Path, errors: Path, stop: Any,
            publish: Callable[[Progress], None]) -> tuple[JobOutcome, Progress]:
        done, base = scan_results(output, errors)
        publish(base)
        out_sink, err_sink = _sink(output), _sink(errors)
        reporter = _ProgressReporter(base, publish)
        writer = SplitWriter(out_sink, errors=err_sink)
        formatter = ResultFormatter(self.model_names[0], self.engine.tokenizer,
                                    cache_block=cache_block(self.cfg, self.engine))
        try:
            with open(input_path, "rb") as f:
                lines = iter_lines(f, self.cfg.max_line_bytes)
                job = BatchJob(self.engine, lines, writer, formatter, reporter,
                               job_options(self.cfg, self.engine), done)
                outcome = job.run(stop)
        finally:
            out_sink.close()
            err_sink.close()
        final = base.plus(outcome.counters)
        publish(final)
        return outcome, final
