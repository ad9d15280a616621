"""Grammar compiles run off the step loop with a time and a size limit: a huge enum fails its own
lines (not the batch) while the other lines run, and SIGTERM during a compile exits 143 at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kvcli.structured import StructuredOutputsParams
from kvcli.structured.compile_worker import CompileWorker
from kvcli.structured.params import MAX_CONSTRAINT_BYTES

# 20,000 strings: ~270 KB of schema, which took 5 s + 39 s to check and compile on the tiny
# models' 448-token vocabulary (an enum of 5,000 takes 0.5 s: the time grows steeply).
HUGE = {"enum": [f"value-{i}" for i in range(20000)]}
BIGGER = {"enum": [f"value-{i}" for i in range(60000)]}  # 830 KB: minutes to compile


def _run(args: list[str], lines: list[dict], tmp_path: Path, **kw) -> subprocess.Popen:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.Popen([sys.executable, "-m", "kvcli", "generate", str(src), "-q",
                             "-o", str(tmp_path / "out.jsonl"), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _results(tmp_path: Path) -> list[dict]:
    path = tmp_path / "out.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_a_compile_past_its_limit_fails_and_the_queue_moves_on():
    release = threading.Event()
    worker = CompileWorker(timeout=0.2)
    stuck = worker.submit(lambda: release.wait(60), "structured_outputs.json")
    after = worker.submit(lambda: "compiled", "structured_outputs.regex")
    deadline = time.monotonic() + 30
    while not stuck.done() and time.monotonic() < deadline:
        time.sleep(0.05)
        worker.expire()
    with pytest.raises(ValueError, match=r"^structured_outputs\.json: not compiled within 0\.2 s"):
        stuck.result()
    assert after.result(timeout=30) == "compiled" and worker.abandoned == 1
    release.set()  # the abandoned thread ends; its late result is dropped
    assert worker.submit(lambda: 7, "x").result(timeout=30) == 7


def test_a_constraint_over_the_size_limit_is_refused_before_any_work():
    values = [f"v{i:07d}" for i in range(MAX_CONSTRAINT_BYTES // 10)]
    with pytest.raises(ValueError, match=r"^body\.guided_choice: [0-9,]+ bytes as JSON, over"):
        StructuredOutputsParams(choice=values, source="body.guided_choice").validate()
    with pytest.raises(ValueError, match=r"^structured_outputs\.json: .* over kvcli's limit"):
        StructuredOutputsParams.from_json({"json": {"enum": values}})


def test_huge_enum_fails_its_lines_while_the_others_complete(tiny_models, tmp_path):
    lines = [{"id": "huge", "prompt": "Pick:", "structured_outputs": {"json": HUGE}},
             {"id": "free", "prompt": "Once upon a time", "max_tokens": 8},
             {"id": "huge-again", "prompt": "Again:", "structured_outputs": {"json": HUGE}},
             {"id": "choice", "prompt": "Colour:", "structured_outputs": {"choice": ["red", "blue"]}},
             {"id": "free2", "prompt": "The fox", "max_tokens": 8}]
    proc = _run(["--model", str(tiny_models["qwen2"]), "--structured-compile-timeout", "1"],
                lines, tmp_path)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err
    out = {r["id"]: r for r in _results(tmp_path)}
    for key in ("huge", "huge-again"):
        assert "not compiled within 1 s (--structured-compile-timeout)" in \
            out[key]["error"]["message"], out[key]
        assert "structured_outputs.json" in out[key]["error"]["message"]
    assert out["choice"]["text"] in ("red", "blue")  # compiled after the abandoned one
    assert out["free"]["finish_reason"] in ("stop", "length") and "error" not in out["free2"]
    assert "Traceback" not in err


def test_sigterm_during_a_compile_exits_143_promptly(tiny_models, tmp_path):
    """SIGTERM while a 60,000-value enum is being checked and compiled ends the run at once.
    Before, that check ran on the main loop (75 s for 40,000 values on a busy machine) and
    held the signal."""
    lines = [{"id": "small", "prompt": "x", "structured_outputs": {"choice": ["a", "b"]}},
             # no prompt: its error is written at once, once the first line has loaded xgrammar
             {"id": "bad"},
             {"id": "huge", "prompt": "Pick:", "structured_outputs": {"json": BIGGER}},
             {"id": "free", "prompt": "Once upon a time", "max_tokens": 4}]
    proc = _run(["--model", str(tiny_models["qwen2"])], lines, tmp_path)
    deadline = time.monotonic() + 120
    while not _results(tmp_path) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    time.sleep(1.5)  # the enum's line is being admitted and compiled
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 143, err
    assert elapsed < 20, f"{elapsed:.1f} s to stop (expected 0.5-2 s, mostly interpreter exit)"
    assert "huge" not in {r["id"] for r in _results(tmp_path)} and "Traceback" not in err
