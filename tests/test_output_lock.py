"""One writer per output file (issue 23, item 1), with real processes.

Two ``kvcli generate … -o o.jsonl`` at once used to both exit 0 and write every result
twice (60 lines, 30 duplicate ids); two concurrent ``--resume`` runs duplicated the rest.
The run now locks ``-o FILE`` before reading its resume state, for the whole run; a
second writer exits 2 at once, naming the file and the holder's pid, and changes nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_generate_cli import LAUNCHER, TESTS_DIR

from kvcli.batch.lock import OutputLocked, holder_pid, lock_output

LINES = [{"id": f"r{i}", "prompt": "abcdefghij"[: 1 + i % 10]} for i in range(30)]


@pytest.fixture
def setup(tmp_path: Path) -> tuple[list[str], Path, Path]:
    launcher = tmp_path / "kvcli_fake.py"
    launcher.write_text(LAUNCHER.format(tests=str(TESTS_DIR)))
    inp = tmp_path / "b30.jsonl"
    inp.write_text("".join(json.dumps(o) + "\n" for o in LINES))
    return [sys.executable, str(launcher), "generate", str(inp)], inp, tmp_path / "o.jsonl"


def env(delay: float) -> dict[str, str]:
    return {**os.environ, "FAKE_DELAY": str(delay), "OMP_NUM_THREADS": "1"}


def ids(path: Path) -> list[str]:
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


def wait_for_lines(path: Path, n: int, proc: subprocess.Popen) -> None:
    end = time.monotonic() + 120
    while time.monotonic() < end:
        if path.exists() and path.read_bytes().count(b"\n") >= n:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    raise AssertionError(f"{path} never reached {n} lines")


def test_second_writer_exits_2_at_once_naming_file_and_pid(setup) -> None:
    cmd, _, out = setup
    # One request at a time, 50 ms a step: the holder runs for about 10 s.
    first = subprocess.Popen([*cmd, "-o", str(out), "-q", "--max-pending", "1"], env=env(0.05),
                             stderr=subprocess.PIPE, text=True)
    wait_for_lines(out, 1, first)
    for extra in ([], ["--resume"], ["--overwrite"]):
        before = out.read_bytes()
        second = subprocess.run([*cmd, "-o", str(out), "-q", *extra], env=env(0),
                                capture_output=True, text=True, timeout=300)
        assert second.returncode == 2, (extra, second.stderr)
        assert f"{out} is being written by another process (pid {first.pid})" in second.stderr
        assert first.poll() is None  # at once, not after it: the holder still runs (no clock)
        assert out.read_bytes()[:len(before)] == before  # nothing truncated or appended
    assert first.wait(timeout=300) == 0, first.stderr.read()
    assert sorted(ids(out)) == sorted(o["id"] for o in LINES)  # the holder's run is whole


def test_two_writers_started_together_give_one_copy_of_each_result(setup) -> None:
    cmd, _, out = setup
    # 0.2 s a step: each run outlasts the other's start-up, so they truly overlap.
    procs = [subprocess.Popen([*cmd, "-o", str(out), "-q"], env=env(0.2),
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    codes = sorted(p.wait(timeout=300) for p in procs)
    errors = [p.stderr.read() for p in procs]
    assert codes == [0, 2], errors
    assert any("is being written by another process" in e for e in errors)
    assert sorted(ids(out)) == sorted(o["id"] for o in LINES)  # 30 lines, no duplicates


def test_two_resumes_of_a_partial_file_duplicate_nothing(setup) -> None:
    cmd, _, out = setup
    subprocess.run([*cmd, "-o", str(out), "-q"], env=env(0), check=True, timeout=300)
    out.write_text("".join(line + "\n" for line in out.read_text().splitlines()[:12]))
    procs = [subprocess.Popen([*cmd, "-o", str(out), "-q", "--resume"], env=env(0.2),
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    codes = sorted(p.wait(timeout=300) for p in procs)
    assert codes == [0, 2], [p.stderr.read() for p in procs]
    assert sorted(ids(out)) == sorted(o["id"] for o in LINES)


def test_lock_is_released_at_exit_and_an_unused_new_file_is_removed(tmp_path: Path) -> None:
    path = tmp_path / "new.jsonl"
    lock = lock_output(str(path))
    with pytest.raises(OutputLocked) as err:
        lock_output(str(path))  # a second open file description conflicts, even in-process
    assert err.value.holder in (os.getpid(), None)
    lock.release()
    assert not path.exists()  # created by this run and left empty: as if never made
    path.write_text("kept\n")
    lock = lock_output(str(path))
    assert holder_pid(lock.fd) in (os.getpid(), None)
    lock.release()
    assert path.read_text() == "kept\n"
    lock_output(str(path)).release()  # free again
