"""`kvcli generate` where vLLM's run-batch conformance cases disagreed (issue 28, items 16, 20).

An empty input is no error (exit 0, an empty -o FILE, the model never loaded); an OpenAI Batch
line without ``custom_id`` is that line's error; a ``body.model`` other than the loaded model
is said once per run with its count, accepted under ``--served-model-name``, and the line's
error under ``--strict``. Real subprocesses: these are exit codes and stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_line_guard import kvcli, rows


def plain_kvcli(*args: str, cwd: Path, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvcli", *args], capture_output=True, text=True,
                          input=stdin, timeout=120, cwd=cwd, env=os.environ)


@pytest.mark.parametrize("content", ["", "\n  \r\n\n"])
def test_an_empty_input_exits_0_without_loading_the_model(tmp_path, content):
    (tmp_path / "empty.jsonl").write_text(content)
    # No such model: it is never loaded, nothing is run.
    res = plain_kvcli("generate", "empty.jsonl", "-o", "out.jsonl", "--stats", "s.json",
                      "--model", "no-such-model", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "empty.jsonl: no request lines, nothing to run; wrote an empty out.jsonl" in res.stderr
    assert (tmp_path / "out.jsonl").read_bytes() == b""  # vLLM's run-batch writes it too
    stats = json.loads((tmp_path / "s.json").read_text())
    assert (stats["ok"], stats["failed"], stats["exit_code"]) == (0, 0, 0)
    piped = plain_kvcli("generate", "-", "--model", "no-such-model", cwd=tmp_path, stdin=content)
    assert piped.returncode == 0 and piped.stdout == "" and "stdin: no request lines" in \
        piped.stderr


def test_an_empty_input_keeps_a_resumed_file_and_empties_an_overwritten_one(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    old = '{"id": "a", "text": "x", "finish_reason": "stop"}\n'
    (tmp_path / "out.jsonl").write_text(old)
    refused = plain_kvcli("generate", "empty.jsonl", "-o", "out.jsonl", cwd=tmp_path)
    assert refused.returncode == 2 and "already has results" in refused.stderr
    resumed = plain_kvcli("generate", "empty.jsonl", "-o", "out.jsonl", "--resume", cwd=tmp_path)
    assert resumed.returncode == 0 and (tmp_path / "out.jsonl").read_text() == old
    assert "out.jsonl kept as it was" in resumed.stderr
    replaced = plain_kvcli("generate", "empty.jsonl", "-o", "out.jsonl", "--overwrite",
                           cwd=tmp_path)
    assert replaced.returncode == 0 and (tmp_path / "out.jsonl").read_text() == ""


def batch_line(custom_id: str | None, model: str | None = None) -> dict:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    if model is not None:
        body["model"] = model
    line = {"method": "POST", "url": "/v1/chat/completions", "body": body}
    return line if custom_id is None else {"custom_id": custom_id, **line}


def write(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_an_openai_batch_line_without_custom_id_is_its_error(tmp_path):
    write(tmp_path / "in.jsonl", [batch_line("a"), batch_line(None), batch_line("c")])
    res = kvcli("generate", "in.jsonl", "-o", "out.jsonl", "--ordered", cwd=tmp_path)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "in.jsonl:2: custom_id: missing: an OpenAI Batch line needs a custom_id" in res.stderr
    out = rows(tmp_path / "out.jsonl")
    assert out["a"]["error"] is None and out["c"]["error"] is None
    assert out["line-2"]["response"] is None
    assert (out["line-2"]["error"]["param"], out["line-2"]["error"]["line"]) == ("custom_id", 2)


MODELS = [batch_line("same", "smollm2-135m"), batch_line("mini-1", "gpt-4o-mini"),
          batch_line("none", None), batch_line("other", "NonExistModel"),
          batch_line("mini-2", "gpt-4o-mini")]


def test_another_model_is_said_once_with_its_count(tmp_path):
    write(tmp_path / "in.jsonl", MODELS)
    res = kvcli("generate", "in.jsonl", "-o", "out.jsonl", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    warning = ("warning: 3 lines named another model than 'smollm2-135m' and ran on it (first: "
               "in.jsonl:2, 'gpt-4o-mini'); --served-model-name NAME accepts a name, --strict "
               "makes it the line's error")
    assert res.stderr.count("another model") == 1 and warning in res.stderr, res.stderr
    out = rows(tmp_path / "out.jsonl")
    assert {r["response"]["body"]["model"] for r in out.values()} == {"smollm2-135m"}


def test_served_model_names_are_accepted_and_reported(tmp_path):
    write(tmp_path / "in.jsonl", MODELS[1:])
    res = kvcli("generate", "in.jsonl", "-o", "out.jsonl", "--served-model-name",
                "gpt-4o-mini,my-alias", "--served-model-name", "NonExistModel", "--strict",
                cwd=tmp_path)
    assert res.returncode == 0 and "another model" not in res.stderr, res.stderr
    out = rows(tmp_path / "out.jsonl")
    assert {r["response"]["body"]["model"] for r in out.values()} == {"gpt-4o-mini"}  # the first
    bad = kvcli("generate", "in.jsonl", "--served-model-name", "a,,b", cwd=tmp_path)
    assert bad.returncode == 2 and "expected non-empty names" in bad.stderr


def test_strict_makes_another_model_the_lines_error(tmp_path):
    write(tmp_path / "in.jsonl", MODELS)
    res = kvcli("generate", "in.jsonl", "-o", "out.jsonl", "--strict", cwd=tmp_path)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    out = rows(tmp_path / "out.jsonl")
    assert out["same"]["error"] is None and out["none"]["error"] is None
    for key in ("mini-1", "other", "mini-2"):
        error = out[key]["error"]
        assert (error["code"], error["param"]) == ("model_not_found", "body.model"), error
    assert ("in.jsonl:4 (custom_id 'other'): body.model: 'NonExistModel' is not the model this "
            "run serves ('smollm2-135m'); --served-model-name NAME accepts another name for it"
            ) in res.stderr
