"""`kvcli generate` as a user runs it: CliRunner in-process, and real subprocesses for pipes,
signals and kills. The engine is the deterministic fake (tests/batch_fakes.py), so these run in
milliseconds without torch; tests/test_batch_e2e.py repeats the key paths with a real model.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from batch_fakes import FakeEngine
from click.testing import CliRunner

from kvcli.cli import main

TESTS_DIR = Path(__file__).resolve().parent
SAMPLES = TESTS_DIR.parent / "samples"

LAUNCHER = """\
import os, sys
sys.path.insert(0, {tests!r})
from batch_fakes import FakeEngine
import kvcli.batch.run
kvcli.batch.run.load_engine = lambda cfg: FakeEngine(step_delay=float(os.environ["FAKE_DELAY"]))
from kvcli.cli import main
main(prog_name="kvcli")
"""


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> list[FakeEngine]:
    """Route the command's engine loading to fresh fake engines (the list collects them)."""
    engines: list[FakeEngine] = []

    def load(cfg: object) -> FakeEngine:
        engines.append(FakeEngine(max_model_len=4096))
        return engines[-1]

    monkeypatch.setattr("kvcli.batch.run.load_engine", load)
    return engines


def invoke(*args: str, input: str | bytes | None = None):
    return CliRunner().invoke(main, ["generate", *args], input=input, catch_exceptions=False)


def results(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def write_jsonl(path: Path, objs: list) -> Path:
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return path


PROMPTS = [{"id": f"q{i}", "prompt": "abcdefghijklmnop"[: 16 - i]} for i in range(12)]


# ------------------------------------------------------------------ formats
def test_plain_stdin_to_stdout(fake) -> None:
    lines = "".join(json.dumps(p) + "\n" for p in PROMPTS[:3])
    res = invoke("-", "--max-tokens", "5", input=lines)
    assert res.exit_code == 0, res.stderr
    out = results(res.stdout)
    assert {r["id"]: r["text"] for r in out} == {"q0": "ponml", "q1": "onmlk", "q2": "nmlkj"}
    assert all(r["finish_reason"] == "length" for r in out)
    assert "3 ok, 0 failed" in res.stderr


def test_messages_and_token_ids_lines(fake) -> None:
    lines = [{"messages": [{"role": "user", "content": "hey"}], "max_tokens": 50},
             {"prompt_token_ids": [1, 100, 101], "id": "t"}]
    res = invoke("-", "--token-ids", "--ordered", input="".join(json.dumps(x) + "\n" for x in lines))
    chat, ids = results(res.stdout)
    assert chat["text"] == ">tnatsissa<\nyeh>resu<" and chat["finish_reason"] == "stop"
    assert chat["prompt_token_ids"][0] != 1  # the chat template is not given a BOS
    assert ids["token_ids"] == [101, 100, 2] and ids["prompt_token_ids"] == [1, 100, 101]


def test_openai_sample_file_ordered(fake, tmp_path) -> None:
    out = tmp_path / "out.jsonl"
    res = invoke(str(SAMPLES / "openai_batch.jsonl"), "-o", str(out), "--ordered", "-q")
    assert res.exit_code == 0 and res.stderr == "" and res.stdout == ""
    rows = results(out.read_text())
    assert [r["custom_id"] for r in rows] == ["chat-1", "chat-2", "chat-3", "completion-1",
                                              "completion-2"]
    assert all(r["error"] is None and r["response"]["status_code"] == 200 for r in rows)
    bodies = [r["response"]["body"] for r in rows]
    assert [b["object"] for b in bodies] == ["chat.completion"] * 3 + ["text_completion"] * 2
    assert len(bodies[4]["choices"]) == 2  # n = 2
    assert bodies[2]["choices"][0]["logprobs"]["content"]  # logprobs: true
    assert bodies[0]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert bodies[1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # shared system prompt


def test_sample_batch_shows_cache_hits(fake, tmp_path) -> None:
    stats = tmp_path / "stats.json"
    res = invoke(str(SAMPLES / "batch.jsonl"), "--stats", str(stats), "--max-pending", "1")
    assert res.exit_code == 0
    rows = results(res.stdout)
    assert len(rows) == 8 and all(r["usage"]["cached_tokens"] > 700 for r in rows[1:])
    summary = json.loads(stats.read_text())
    assert summary["ok"] == 8 and summary["hit_rate"] > 0.8
    assert summary["prefill_tokens_skipped"] == summary["cached_tokens"]
    assert "prefix-cache hit rate" in res.stderr


# ------------------------------------------------------------- exit codes
def test_bad_lines_exit_1_and_name_file_line_field(fake, tmp_path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text('{"prompt": "ab"}\n{"prompt": "x", "temperature": -1}\nnot json\n')
    res = invoke(str(path))
    assert res.exit_code == 1
    assert f"{path}:2: temperature: expected a number >= 0, got -1" in res.stderr
    assert f"{path}:3: invalid JSON" in res.stderr
    assert sorted(r.get("error", {}).get("line", 0) for r in results(res.stdout)) == [0, 2, 3]


def test_fail_fast(fake, tmp_path) -> None:
    path = write_jsonl(tmp_path / "in.jsonl", [{"prompt": ""}, *PROMPTS])
    res = invoke(str(path), "--fail-fast", "--max-pending", "2")
    assert res.exit_code == 1 and len(results(res.stdout)) == 1
    assert "stopped (fail-fast)" not in res.stderr  # nothing was in flight yet


def test_strict(fake) -> None:
    res = invoke("-", "--strict", input='{"prompt": "a", "temprature": 0}\n')
    assert res.exit_code == 1 and results(res.stdout)[0]["error"]["param"] == "temprature"


@pytest.mark.parametrize("setup, args, message", [
    (lambda d: (d / "sub").mkdir(), ["sub"], "is a directory"),
    (lambda d: None, ["missing.jsonl"], "cannot read missing.jsonl"),
    (lambda d: (d / "o.jsonl").write_text("{}\n"), ["missing.jsonl", "-o", "o.jsonl", "--resume"],
     "cannot read missing.jsonl"),
    (lambda d: (d / "i.jsonl").write_text("{}\n"), ["i.jsonl", "--resume"], "--resume needs -o"),
    (lambda d: [(d / "i.jsonl").write_text("{}\n"), (d / "o.jsonl").write_text("{}\n")],
     ["i.jsonl", "-o", "o.jsonl"], "already has results"),
    (lambda d: (d / "i.jsonl").write_text("{}\n"), ["i.jsonl", "-o", "i.jsonl"], "names an input"),
    (lambda d: (d / "i.jsonl").write_text("{}\n"), ["i.jsonl", "--temperature", "-1"],
     "--temperature: expected a number >= 0"),
    (lambda d: (d / "i.jsonl").write_text("{}\n"), ["i.jsonl", "--kv-cache-memory", "2XB"],
     "expected a size"),
    (lambda d: (d / "i.jsonl").write_text("{}\n"), ["i.jsonl", "--scheduling", "lifo"], "lifo"),
])
def test_usage_errors_exit_2(fake, tmp_path, monkeypatch, setup, args, message) -> None:
    monkeypatch.chdir(tmp_path)
    setup(tmp_path)
    res = invoke(*args)
    assert res.exit_code == 2 and message in res.stderr
    assert fake == []  # failed before loading any model


def test_empty_stdin_runs_nothing_and_exits_0(fake) -> None:
    res = invoke("-", input="")
    assert res.exit_code == 0 and "stdin: no request lines" in res.stderr and res.stdout == ""
    assert fake == []  # the model was never loaded


def test_overwrite(fake, tmp_path) -> None:
    out = tmp_path / "o.jsonl"
    out.write_text('{"id": "old"}\n')
    res = invoke("-", "-o", str(out), "--overwrite", input='{"prompt": "a"}\n')
    assert res.exit_code == 0 and [r["id"] for r in results(out.read_text())] == ["line-1"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_full_disk_is_a_clear_error(fake) -> None:
    res = invoke("-", "-o", "/dev/full", input='{"prompt": "a"}\n{"prompt": "b"}\n')
    assert res.exit_code == 1
    assert "cannot write to /dev/full: No space left on device (disk full)" in res.stderr


def test_progress_bar_on_request(fake, tmp_path) -> None:
    path = write_jsonl(tmp_path / "in.jsonl", PROMPTS[:2])
    res = invoke(str(path), "--progress")
    assert "2/2" in res.stderr and "req/s" in res.stderr and "hit=" in res.stderr
    assert "req/s" not in invoke("-", input='{"prompt": "a"}\n').stderr  # stderr is not a TTY


# ------------------------------------------------------------------ resume
def test_resume_after_partial_write_equals_clean_run(fake, tmp_path) -> None:
    inp = write_jsonl(tmp_path / "in.jsonl", PROMPTS)
    clean = tmp_path / "clean.jsonl"
    assert invoke(str(inp), "-o", str(clean), "-q").exit_code == 0
    lines = clean.read_bytes().splitlines(keepends=True)
    out = tmp_path / "out.jsonl"
    out.write_bytes(b"".join(lines[:5]) + lines[5][:20])  # as if killed mid-write
    res = invoke(str(inp), "-o", str(out), "--resume")
    assert res.exit_code == 0
    assert "removed a partial last line (20 bytes)" in res.stderr
    assert "5 already in" in res.stderr
    assert len(fake[-1].added) == len(PROMPTS) - 5
    assert canonical(out) == canonical(clean)
    again = invoke(str(inp), "-o", str(out), "--resume", "-q")  # nothing left to do
    assert again.exit_code == 0 and fake[-1].added == [] and out.read_text().count("\n") == 12


def test_help_does_not_import_torch() -> None:
    code = ("import sys\nfrom click.testing import CliRunner\nfrom kvcli.cli import main\n"
            "for args in (['--help'], ['generate', '--help']):\n"
            "    assert CliRunner().invoke(main, args).exit_code == 0\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


# ------------------------------------------------------------- subprocesses
@pytest.fixture
def kvcli_fake(tmp_path):
    """argv prefix running `kvcli` with the fake engine in a real subprocess."""
    launcher = tmp_path / "kvcli_fake.py"
    launcher.write_text(LAUNCHER.format(tests=str(TESTS_DIR)))
    return [sys.executable, str(launcher)]


def fake_env(delay: float) -> dict[str, str]:
    return {**os.environ, "FAKE_DELAY": str(delay), "OMP_NUM_THREADS": "1"}


def wait_for_lines(path: Path, n: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and path.read_bytes().count(b"\n") >= n:
            return
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.02)
    raise AssertionError(f"{path} never reached {n} lines")


def canonical(path: Path) -> list[str]:
    """Results without their cache hits, which depend on what ran before (not on the result)."""
    rows = results(path.read_text())
    for r in rows:
        r["usage"].pop("cached_tokens")
    return sorted(json.dumps(r, sort_keys=True) for r in rows)


MANY = [{"id": f"r{i}", "prompt": "abcdefghij"[: 1 + i % 10]} for i in range(60)]


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130),
                                          (signal.SIGKILL, -9)])
def test_killed_run_then_resume_equals_clean_run(kvcli_fake, tmp_path, signum, code) -> None:
    inp = write_jsonl(tmp_path / "in.jsonl", MANY)
    out = tmp_path / "out.jsonl"
    args = [*kvcli_fake, "generate", str(inp), "-o", str(out), "--max-pending", "4"]
    proc = subprocess.Popen(args, env=fake_env(0.01), stderr=subprocess.PIPE, text=True)
    wait_for_lines(out, 5, proc)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    partial = results(out.read_text())  # every complete line is a valid result
    assert 5 <= len(partial) < len(MANY)
    if code > 0:
        assert "rerun with --resume" in err and "Traceback" not in err
    done = subprocess.run([*args, "--resume", "-q"], env=fake_env(0), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    clean = tmp_path / "clean.jsonl"
    subprocess.run([*kvcli_fake, "generate", str(inp), "-o", str(clean), "-q"], env=fake_env(0),
                   check=True, timeout=300)
    assert canonical(out) == canonical(clean)  # none lost, none duplicated


def test_stdin_stdout_pipe_and_broken_pipe(kvcli_fake) -> None:
    data = "".join(json.dumps(p) + "\n" for p in MANY)
    full = subprocess.run([*kvcli_fake, "generate", "-", "--ordered", "-q"], input=data,
                          env=fake_env(0), capture_output=True, text=True, timeout=300)
    assert full.returncode == 0 and [r["id"] for r in results(full.stdout)] == \
        [p["id"] for p in MANY]
    # `kvcli generate - | head -1`: the reader goes away after one line.
    proc = subprocess.Popen([*kvcli_fake, "generate", "-"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=fake_env(0.005))
    proc.stdin.write(data.encode())
    proc.stdin.close()
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert json.loads(first)["id"].startswith("r")
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err
