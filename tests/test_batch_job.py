"""The job loop against the fake engine: ordering, bounded window, failures, signals, write errors."""

from __future__ import annotations

import errno
import io
import json
import os
import signal
from collections.abc import Iterator

import pytest
from batch_fakes import FakeEngine

from kvcli.batch.job import BatchJob, JobOptions
from kvcli.batch.output import ResultFormatter
from kvcli.batch.parse import ParseOptions
from kvcli.batch.report import Reporter
from kvcli.batch.source import RawLine, iter_lines
from kvcli.batch.writer import ResultWriter
from kvcli.sampling_params import SamplingParams


class ListSink:
    name = "list"

    def __init__(self, fail_after: int | None = None, errno_: int = errno.ENOSPC) -> None:
        self.lines: list[bytes] = []
        self.fail_after = fail_after
        self.errno = errno_

    def write(self, data: bytes) -> None:
        if self.fail_after is not None and len(self.lines) >= self.fail_after:
            raise OSError(self.errno, os.strerror(self.errno))
        self.lines.append(data)

    def close(self) -> None:
        pass

    @property
    def results(self) -> list[dict]:
        return [json.loads(x) for x in self.lines]


def jsonl(*objs: object) -> bytes:
    return b"".join((o if isinstance(o, bytes) else json.dumps(o).encode()) + b"\n" for o in objs)


class CountingLines:
    """The input iterator, counting how many lines the job has pulled (laziness)."""

    def __init__(self, data: bytes) -> None:
        self._it = iter_lines(io.BytesIO(data))
        self.pulled = 0

    def __iter__(self) -> Iterator[RawLine]:
        return self

    def __next__(self) -> RawLine:
        raw = next(self._it)
        self.pulled += 1
        return raw


def run_job(data: bytes, engine: FakeEngine | None = None, *, ordered: bool = False,
            max_pending: int = 8, fail_fast: bool = False, done: set[str] | None = None,
            sink: ListSink | None = None, defaults: SamplingParams | None = None,
            lines: object = None):
    engine = engine or FakeEngine()
    sink = sink or ListSink()
    opts = JobOptions(ParseOptions(defaults or SamplingParams(max_tokens=50)), max_pending,
                      fail_fast, "in.jsonl")
    job = BatchJob(engine, lines or iter_lines(io.BytesIO(data)), ResultWriter(sink, ordered),
                   ResultFormatter("fake", engine.tokenizer), Reporter(show_progress=False,
                                                                        quiet=True), opts, done)
    return job.run(), sink, engine


PROMPTS = [{"id": f"q{i}", "prompt": "x" * (12 - i)} for i in range(10)]  # later ones are shorter


def test_streaming_order_is_completion_order_ordered_is_input_order() -> None:
    outcome, sink, _ = run_job(jsonl(*PROMPTS))
    assert outcome.exit_code == 0 and outcome.status == "completed"
    streamed = [r["id"] for r in sink.results]
    assert sorted(streamed) == sorted(p["id"] for p in PROMPTS) and streamed != sorted(streamed)
    outcome, sink, _ = run_job(jsonl(*PROMPTS), ordered=True)
    assert [r["id"] for r in sink.results] == [p["id"] for p in PROMPTS]
    assert all(r["text"] == p["prompt"] for r, p in zip(sink.results, PROMPTS, strict=True))


def test_results_are_exact_and_counted() -> None:
    outcome, sink, _ = run_job(jsonl({"id": "a", "prompt": "abc"}, {"id": "b", "prompt": "hello",
                                                                    "max_tokens": 2}))
    by_id = {r["id"]: r for r in sink.results}
    assert by_id["a"]["text"] == "cba" and by_id["a"]["finish_reason"] == "stop"
    assert by_id["b"]["text"] == "ol" and by_id["b"]["finish_reason"] == "length"
    c = outcome.counters
    assert (c.ok, c.failed, c.prompt_tokens, c.generated_tokens) == (2, 0, 4 + 6, 4 + 2)


@pytest.mark.parametrize("ordered", [False, True])
def test_bounded_window_and_lazy_reading(ordered: bool) -> None:
    data = jsonl(*({"prompt": "p" * (1 + i % 7)} for i in range(300)))
    lines = CountingLines(data)
    engine = FakeEngine()
    pulled_at_first_result: list[int] = []
    sink = ListSink()
    orig_write = sink.write

    def write(line: bytes) -> None:
        if not pulled_at_first_result:
            pulled_at_first_result.append(lines.pulled)
        orig_write(line)

    sink.write = write
    outcome, _, _ = run_job(data, engine, ordered=ordered, max_pending=5, sink=sink, lines=lines)
    assert outcome.exit_code == 0 and len(sink.lines) == 300
    assert engine.max_live <= 5
    assert pulled_at_first_result[0] <= 5  # it did not read ahead of the window
    if ordered:
        assert [r["id"] for r in sink.results] == [f"line-{i}" for i in range(1, 301)]


def test_bad_lines_become_results_and_the_batch_continues() -> None:
    data = jsonl({"id": "good1", "prompt": "ab"}, b"{broken", {"prompt": "x", "max_tokens": "ten"},
                 {"prompt_token_ids": [1, 999]}, {"prompt": "x" * 600},
                 {"id": "e", "prompt": "ENGINE_FAIL"}, {"prompt": "x", "max_tokens": 20_000},
                 {"id": "good2", "prompt": "cd"})
    outcome, sink, _ = run_job(data, ordered=True)
    assert outcome.exit_code == 1 and outcome.counters.failed == 6 and outcome.counters.ok == 2
    res = sink.results
    assert [r["id"] for r in res] == ["good1", "line-2", "line-3", "line-4", "line-5", "e",
                                      "line-7", "good2"]
    codes = [r["error"]["code"] for r in res[1:-1]]
    assert codes == ["invalid_json", "invalid_request", "invalid_request",
                     "context_length_exceeded", "engine_error", "invalid_request"]
    assert res[6]["error"]["param"] == "max_tokens"  # the engine's own ValueError, mapped


def test_error_messages_name_file_line_and_field(capsys) -> None:
    run_job(jsonl({"prompt": "ok"}, {"id": "z", "prompt": "x", "top_p": 2}))
    err = capsys.readouterr().err
    assert "in.jsonl:2 (id 'z'): top_p: expected a number in (0, 1], got 2" in err


def test_fail_fast_stops_at_first_error() -> None:
    data = jsonl(*PROMPTS[:3], {"prompt": ""}, *PROMPTS[3:])
    outcome, sink, engine = run_job(data, fail_fast=True, max_pending=2)
    assert outcome.exit_code == 1 and outcome.status == "fail-fast"
    assert sink.results[-1]["error"]["param"] == "prompt"
    assert len(engine.added) <= 4 and engine.aborted  # stopped admitting, aborted in-flight


def test_resume_skips_done_ids() -> None:
    outcome, sink, engine = run_job(jsonl(*PROMPTS), done={"q1", "q3"})
    assert sorted(r["id"] for r in sink.results) == sorted(f"q{i}" for i in (0, 2, 4, 5, 6, 7, 8, 9))
    assert outcome.counters.skipped == 2 and len(engine.added) == 8


def test_duplicate_ids_are_reported_and_both_run(capsys) -> None:
    outcome, sink, _ = run_job(jsonl({"id": "d", "prompt": "a"}, {"id": "d", "prompt": "b"},
                                     {"prompt": "c"}, {"id": "line-3", "prompt": "e"}))
    assert [r["id"] for r in sink.results].count("d") == 2 and outcome.counters.duplicates == 2
    err = capsys.readouterr().err
    assert "in.jsonl:2: id 'd' already used on line 1" in err
    assert "in.jsonl:4: id 'line-3' already used on line 3" in err


def test_unknown_field_warned_once(capsys) -> None:
    run_job(jsonl({"prompt": "a", "foo": 1}, {"prompt": "b", "foo": 2}))
    assert capsys.readouterr().err.count("unknown field 'foo'") == 1


def test_prefix_cache_hits_are_reported_per_request() -> None:
    shared = "S" * 40
    _, sink, _ = run_job(jsonl(*({"prompt": shared + str(i)} for i in range(3))), ordered=True,
                         max_pending=1)
    cached = [r["usage"]["cached_tokens"] for r in sink.results]
    assert cached[0] == 0 and cached[1] == cached[2] == 40  # 41 prompt tokens: 10 full blocks


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_stops_admitting_writes_finished_and_aborts_rest(signum: int, code: int) -> None:
    class SignallingEngine(FakeEngine):
        def step(self):  # the signal arrives during the third engine step
            self.steps = getattr(self, "steps", 0) + 1
            if self.steps == 3:
                os.kill(os.getpid(), signum)
            return super().step()

    engine = SignallingEngine()
    data = jsonl(*({"id": f"r{i}", "prompt": "ab" if i % 2 else "abcdefgh"} for i in range(40)))
    outcome, sink, _ = run_job(data, engine, max_pending=6)
    assert outcome.exit_code == code and outcome.status == signal.Signals(signum).name
    written = [r["id"] for r in sink.results]
    assert written and len(written) < 40 and len(engine.added) == 6  # nothing admitted after
    assert outcome.aborted == len(engine.aborted) == 6 - len(written)
    assert signal.getsignal(signum) is not None  # handlers restored afterwards


def test_full_disk_is_a_clear_error(capsys) -> None:
    outcome, sink, engine = run_job(jsonl(*PROMPTS), sink=ListSink(fail_after=3))
    assert outcome.exit_code == 1 and "write error" in outcome.status
    assert len(sink.lines) == 3 and engine.aborted
    err = capsys.readouterr().err
    assert "cannot write to list: No space left on device (disk full); 3 results written" in err


def test_broken_pipe_is_quiet(capsys) -> None:
    outcome, _, _ = run_job(jsonl(*PROMPTS), sink=ListSink(fail_after=1, errno_=errno.EPIPE))
    assert (outcome.exit_code, outcome.status) == (141, "broken pipe")
    assert capsys.readouterr().err == ""


def test_memory_stays_flat_as_the_input_grows() -> None:
    """Neither requests nor results are held: 4x the lines, (almost) the same peak memory."""
    import tracemalloc

    class QuietEngine(FakeEngine):
        def add_request(self, *args, **kwargs) -> None:
            super().add_request(*args, **kwargs)
            self.added.clear()  # the fake's own bookkeeping must not grow either

        def _cache(self, ids, salt) -> int:
            return 0

    def lines(n: int) -> Iterator[RawLine]:  # generated on the fly: never a file in memory
        for i in range(1, n + 1):
            data = b'{"prompt": "question %d"}' % i
            yield RawLine(i, data, len(data))

    peaks = []
    for n in (1000, 4000):
        tracemalloc.start()
        outcome, sink, _ = run_job(b"", QuietEngine(), ordered=True, max_pending=32,
                                   sink=CountingSink(), lines=lines(n),
                                   defaults=SamplingParams(max_tokens=2))
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert outcome.exit_code == 0 and sink.count == n
    assert peaks[1] < peaks[0] + 60_000, peaks  # 3,000 more lines: < 20 bytes each


class CountingSink:
    name = "count"
    count = 0

    def write(self, data: bytes) -> None:
        self.count += 1

    def close(self) -> None:
        pass
