"""``kvcli generate`` end to end: check the paths, resume, load the engine, run the job, summarise.

Cheap checks come before the (slow) model load (kvcli/batch/preflight.py): a bad path or an
output that would be clobbered fail in milliseconds with exit status 2. An empty input (a filter
that selected nothing) loads no model, leaves -o FILE empty and exits 0, as vLLM's run-batch does.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import pickle
import re
import stat
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import orjson

from kvcli.batch.config import GenerateConfig
from kvcli.batch.job import EXIT_OK, EXIT_USAGE, BatchJob, JobOptions, JobOutcome
from kvcli.batch.lock import OutputLock
from kvcli.batch.output import ResultFormatter
from kvcli.batch.parse import ParseOptions
from kvcli.batch.preflight import (
    BatchUsageError,
    check_paths,
    first_line,
    input_files,
    lock_output_file,
    open_path,
    resume_state,
)
from kvcli.batch.report import Reporter
from kvcli.batch.resources import ResourceError, check_engine_options
from kvcli.batch.resume import ResumeState
from kvcli.batch.source import RawLine, count_lines, iter_lines
from kvcli.batch.summary import RunCounters, build_summary, format_summary
from kvcli.batch.writer import CompressedSink, FdSink, LineSink, ResultWriter, open_sink
from kvcli.compression import suffix_kind
from kvcli.engine import engine_class
from kvcli.numbers import plural
from kvcli.reasoning import resolve as resolve_reasoning
from kvcli.structured.tools import tool_call_format

EngineFactory = Callable[[GenerateConfig], Any]


def load_engine(cfg: GenerateConfig) -> Any:
    """The real engine; a checkpoint, device or pool it cannot use raises ValueError (exit 2),
    a --device or --kv-cache-memory this machine cannot meet ResourceError naming the flag."""
    from safetensors import SafetensorError

    LLMEngine = engine_class()
    check_engine_options(cfg.engine)
    try:
        return LLMEngine.from_config(cfg.engine)
    except (pickle.UnpicklingError, SafetensorError, RuntimeError, MemoryError,
            AssertionError) as err:  # torch/safetensors' ways to say "cannot use this"
        raise ValueError(describe_load_failure(err)) from None
    except OSError as err:
        if err.errno == errno.ENOMEM:  # an mmap or allocation the kernel refused
            raise ValueError(describe_load_failure(MemoryError())) from None
        raise


def describe_load_failure(err: BaseException) -> str:
    """One line for a failure that torch or safetensors would otherwise print as a traceback."""
    text = str(err)
    if isinstance(err, pickle.UnpicklingError):
        called = re.search(r"GLOBAL ([\w.]+)", text)
        return ("a pickle checkpoint holds more than tensors"
                + (f" (it calls {called[1]})" if called else "")
                + "; kvcli loads pickle weights with torch.load(weights_only=True), which "
                "refuses to run code from the file")
    if isinstance(err, MemoryError):
        return ("out of memory loading the weights and the KV cache (lower --kv-cache-memory "
                "or --num-blocks)")
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


def run_generate(cfg: GenerateConfig, engine_factory: EngineFactory | None = None) -> int:
    """The command's exit status; ``engine_factory`` defaults to :func:`load_engine`."""
    try:
        return _run(cfg, engine_factory or load_engine)
    except BatchUsageError as err:
        print(f"kvcli generate: {err}", file=sys.stderr)
        return EXIT_USAGE


def _run(cfg: GenerateConfig, engine_factory: EngineFactory) -> int:
    check_paths(cfg)
    with contextlib.ExitStack() as stack:
        lock = lock_output_file(cfg)  # before the resume state is read, held to the end
        if lock is not None:
            stack.callback(lock.release)
        files = input_files(cfg)
        if files is None:
            stream = open_path(cfg.input)
            if stream is not sys.stdin.buffer:
                stack.callback(stream.close)
            lines = iter_lines(stream, cfg.max_line_bytes)
        else:
            lines = iter(files)
        first = first_line(lines, cfg.input)
        if first is None:
            return _empty_input(cfg, lock)
        resume = resume_state(cfg)
        try:
            engine = engine_factory(cfg)
        except ResourceError as err:  # the model is fine: the flag is the cause
            raise BatchUsageError(str(err)) from None
        except (OSError, ValueError) as err:
            raise BatchUsageError(f"cannot load model {cfg.engine.model!r}: {err}") from None
        # The run owns its engine: its disk-cache writes are finished (and its writer thread,
        # which holds the KV pool, ended) when the run ends, not only at interpreter exit.
        stack.callback(getattr(engine, "close", lambda: None))
        return _run_job(cfg, engine, itertools.chain([first], lines), resume, lock,
                        files.where if files is not None else None)


def _empty_input(cfg: GenerateConfig, lock: OutputLock | None) -> int:
    """No request lines: the model is never loaded, -o FILE is left as a run without results
    leaves it (empty; as it was with --resume), kept like vLLM's run-batch output, exit 0."""
    _sink(cfg, lock).close()
    if lock is not None:
        lock.created = False  # an empty FILE is this run's whole output: not removed at the end
    name = "stdin" if cfg.input == "-" else " ".join((cfg.input, *cfg.more_inputs))
    where = "" if cfg.to_stdout else (f"; {cfg.output} kept as it was" if cfg.resume
                                      else f"; wrote an empty {cfg.output}")
    print(f"kvcli generate: {name}: no request lines, nothing to run{where}", file=sys.stderr)
    summary = build_summary(RunCounters(), None, "completed", EXIT_OK)
    return EXIT_OK if _write_stats(cfg, summary) else 1


def _sink(cfg: GenerateConfig, lock: OutputLock | None) -> LineSink:
    """Results go out through the locked descriptor; without --resume the file starts empty
    (--overwrite replaces it only now, once the model has loaded)."""
    if lock is None:
        return open_sink(None)
    regular = stat.S_ISREG(os.fstat(lock.fd).st_mode)
    try:
        if regular and not cfg.resume:
            os.ftruncate(lock.fd, 0)
    except OSError as err:
        raise BatchUsageError(f"cannot write {cfg.output}: {err.strerror or err}") from None
    kind = suffix_kind(str(cfg.output))
    if kind is not None:  # a partial compressed chunk cannot be cut back to a whole line
        return CompressedSink(FdSink(lock.fd, str(cfg.output), owns_fd=False), kind)
    return FdSink(lock.fd, str(cfg.output), owns_fd=False, exclusive=regular)


def _run_job(cfg: GenerateConfig, engine: Any, lines: Iterator[RawLine],
             resume: ResumeState, lock: OutputLock | None,
             where: Callable[[int], str] | None = None) -> int:
    sink = _sink(cfg, lock)
    show = cfg.progress or sys.stderr.isatty()
    total = _total_lines(cfg) if show and not cfg.quiet else None
    reporter = Reporter(show_progress=show, quiet=cfg.quiet, total=total)
    opts = job_options(cfg, engine, where)
    formatter = ResultFormatter((*cfg.model_names, "default")[0], engine.tokenizer,
                                cfg.token_ids, deterministic_ids=cfg.deterministic_ids,
                                cache_block=cache_block(cfg, engine))
    counters = RunCounters()
    writer = ResultWriter(sink, cfg.ordered)
    if cfg.input_order == "prefix":
        lines, writer = _prefix_ordered(cfg, engine, opts, sink)
    try:
        job = BatchJob(engine, lines, writer, formatter, reporter, opts, resume.done, counters)
        outcome = job.run()
    finally:
        reporter.close()
        sink.close()
    if outcome.status == "broken pipe":
        _silence_stdout(sink)
        return outcome.exit_code
    return _finish(cfg, engine, outcome)


def job_options(cfg: GenerateConfig, engine: Any,
                where: Callable[[int], str] | None = None) -> JobOptions:
    """The job's per-line options from the command's flags (generate's, and kvcli serve's)."""
    # The parser leaves max_tokens unset where the line does; the job then fits the default
    # to the prompt, and only an explicit value can overflow the context.
    defaults = replace(cfg.sampling, max_tokens=None)
    template = getattr(engine.tokenizer, "chat_template", None)
    return JobOptions(ParseOptions(defaults, cfg.strict, cfg.seed, cfg.max_line_bytes,
                                   tool_call_format(template), cfg.model_names),
                      cfg.max_pending, cfg.fail_fast, cfg.input if cfg.input != "-" else "stdin",
                      cfg.sampling.max_tokens, cfg.clamp_max_tokens, where=where, debug=cfg.debug,
                      reasoning=resolve_reasoning(cfg.reasoning_parser, template))


def cache_block(cfg: GenerateConfig, engine: Any) -> int:
    """The prefix cache's block size, 0 when caching is off (results count the cache's writes);
    the engine's own config where it has one (a remote engine's: the flags')."""
    config = getattr(engine, "config", None)
    caching = getattr(config, "enable_prefix_caching", cfg.engine.enable_prefix_caching)
    size = getattr(config, "block_size", None) or cfg.engine.block_size
    return int(size) if caching else 0


def _total_lines(cfg: GenerateConfig) -> int | None:
    counts = [count_lines(p, cfg.max_line_bytes) for p in (cfg.input, *cfg.more_inputs)]
    return None if None in counts else sum(c for c in counts if c is not None)


def _prefix_ordered(cfg: GenerateConfig, engine: Any, opts: JobOptions, sink: LineSink
                    ) -> tuple[Iterator[RawLine], ResultWriter]:
    """The input's lines grouped by prompt prefix, and a writer that keeps --ordered's order."""
    from kvcli.batch.encode import PromptEncoder
    from kvcli.batch.ordering import RankedWriter, prefix_ordered_lines

    encoder = PromptEncoder(engine.tokenizer, engine.max_model_len, engine.vocab_size)
    block_size = cfg.engine.block_size
    lines = prefix_ordered_lines(cfg.input, encoder, opts.parse, block_size, cfg.max_line_bytes)
    return lines, RankedWriter(sink, cfg.ordered)


def _finish(cfg: GenerateConfig, engine: Any, outcome: JobOutcome) -> int:
    summary = build_summary(outcome.counters, engine.stats(), outcome.status, outcome.exit_code)
    backend = getattr(getattr(engine, "runner", None), "backend", None)
    if backend is not None:  # which kernels ran (kvcli/model/backend.py); not over Ray
        summary["backend"] = backend.describe()
    if outcome.aborted:
        how = "" if cfg.to_stdout else f"; rerun with --resume -o {cfg.output} to finish"
        why = "unfinished, or waiting for an earlier one" if cfg.ordered else "unfinished"
        if outcome.status.startswith("write error"):
            why += ", or the one being written when the write failed"
        print(f"kvcli generate: stopped ({outcome.status}): {plural(outcome.aborted, 'request')} "
              f"not written ({why}){how}", file=sys.stderr)
    if not cfg.quiet:
        print(format_summary(summary, cfg.output_name), file=sys.stderr)
    return outcome.exit_code if _write_stats(cfg, summary) else max(outcome.exit_code, 1)


def _write_stats(cfg: GenerateConfig, summary: dict[str, Any]) -> bool:
    """``--stats FILE``; False when it cannot be written (said on stderr)."""
    if not cfg.stats_path:
        return True
    try:
        with open(cfg.stats_path, "wb") as f:
            f.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2) + b"\n")
    except OSError as err:
        print(f"kvcli generate: cannot write --stats {cfg.stats_path}: {err.strerror or err}",
              file=sys.stderr)
        return False
    return True


def _silence_stdout(sink: Any) -> None:
    """After EPIPE, point stdout at /dev/null so the interpreter's exit flush stays quiet."""
    if isinstance(sink, FdSink):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sink.fd)
        os.close(devnull)
