"""The summary counts what is on disk (issue 23, item 4), and ``--ordered`` holds finished
results behind a slow one, at most ``--max-pending`` of them (item 6).

A full disk used to leave a half-written line that counted as "ok" and not as "not
written" ("29 ok … 1 requests not written" with 2 results missing); results held back by
``--ordered`` and dropped by an interrupt were counted "ok" as well.
"""

from __future__ import annotations

import io
import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

from batch_fakes import FakeEngine
from test_batch_writer import ListSink
from test_generate_cli import LAUNCHER, TESTS_DIR

from kvcli.batch.job import BatchJob, JobOptions
from kvcli.batch.output import ResultFormatter
from kvcli.batch.parse import ParseOptions
from kvcli.batch.report import Reporter
from kvcli.batch.source import iter_lines
from kvcli.batch.writer import ResultWriter
from kvcli.sampling_params import SamplingParams


def jsonl(objs: list[dict]) -> str:
    return "".join(json.dumps(o) + "\n" for o in objs)


def test_file_size_limit_mid_line_counts_only_whole_lines(tmp_path: Path) -> None:
    """A write that fails part-way (RLIMIT_FSIZE: the kernel takes part of the line, then
    EFBIG, as a filling disk does with ENOSPC): the partial line is cut off again, and the
    summary's ok count and "not written" count add up to what the file really holds."""
    launcher = tmp_path / "kvcli_fake.py"
    launcher.write_text(LAUNCHER.format(tests=str(TESTS_DIR)))
    inp = tmp_path / "b30.jsonl"
    inp.write_text(jsonl([{"id": f"r{i}", "prompt": "abcdefghij"[: 1 + i % 10]}
                          for i in range(30)]))
    out, stats = tmp_path / "o.jsonl", tmp_path / "stats.json"

    def limit() -> None:  # 2,000 bytes: the limit falls inside the 17th line (~118 bytes each)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))

    for ordered in ([], ["--ordered"]):
        out.unlink(missing_ok=True)
        res = subprocess.run([sys.executable, str(launcher), "generate", str(inp), "-o", str(out),
                              "--stats", str(stats), *ordered], preexec_fn=limit,
                             env={**os.environ, "FAKE_DELAY": "0"},
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 1, res.stderr
        data = out.read_bytes()
        assert data.endswith(b"\n")  # only whole lines: the partial one was removed
        on_disk = len(data.splitlines())
        assert 10 < on_disk < 30
        summary = json.loads(stats.read_text())
        assert summary["ok"] + summary["failed"] == on_disk
        assert f"{on_disk} results written" in res.stderr
        missing = 30 - on_disk
        assert f"{missing} request{'s' if missing != 1 else ''} not written" in res.stderr
        assert f"kvcli generate: {on_disk} ok, 0 failed" in res.stderr
        assert "(file size limit)" in res.stderr


class Recorder(FakeEngine):
    """Notes, before each step, how many lines are on disk and how many are held back."""

    job: BatchJob | None = None
    interrupt_at: int | None = None

    def step(self):
        writer = self.job.writer
        self.trace.append((len(writer.sink.lines), writer.held, len(self._live)))
        if len(self.trace) == self.interrupt_at:
            os.kill(os.getpid(), signal.SIGINT)
        return super().step()


def run(ordered: bool, interrupt_at: int | None = None):
    slow = {"id": "slow", "prompt": "s" * 60}  # the fake engine emits its 61 tokens one a step
    fast = [{"id": f"f{i}", "prompt": "ab"} for i in range(20)]  # 3 steps each
    engine = Recorder()
    engine.trace, engine.interrupt_at = [], interrupt_at
    sink = ListSink()
    job = BatchJob(engine, iter_lines(io.BytesIO(jsonl([slow, *fast]).encode())),
                   ResultWriter(sink, ordered), ResultFormatter("fake", engine.tokenizer),
                   Reporter(show_progress=False, quiet=True), JobOptions(ParseOptions(SamplingParams(max_tokens=100)), 4))
    engine.job = job
    return job.run(), sink, engine


def test_ordered_holds_finished_results_behind_a_slow_one_bounded_by_max_pending() -> None:
    outcome, sink, engine = run(ordered=True)
    assert outcome.exit_code == 0
    assert [json.loads(x)["id"] for x in sink.lines] == ["slow", *(f"f{i}" for i in range(20))]
    before_slow = [t for t in engine.trace if t[0] == 0]  # steps before anything was written
    assert len(before_slow) == 61  # nothing comes out until the slow one is done
    assert max(held for _, held, _ in engine.trace) == 3  # --max-pending 4, minus the slow one
    assert max(live for _, _, live in engine.trace) <= 4
    # Streaming instead: the fast ones are written while the slow one runs.
    _, _, streaming = run(ordered=False)
    assert max(on_disk for on_disk, _, live in streaming.trace if live) >= 15


def test_interrupt_drops_held_results_and_does_not_count_them() -> None:
    outcome, sink, engine = run(ordered=True, interrupt_at=20)
    assert outcome.status == "SIGINT" and sink.lines == []
    assert outcome.aborted == 4  # the slow one in flight plus the 3 held behind it
    assert (outcome.counters.ok, outcome.counters.failed) == (0, 0)  # was 3 ok, none written
