"""No line takes down a batch (issue 28, items 1-3): every per-line stage runs under one guard.

A too-deep schema is its line's ``invalid_request``; a tool-call reply with an integer past
Python's 4,300-digit limit is written as text; any exception a stage raises that no check
foresaw becomes that line's ``engine_error`` (the traceback once, or in full with --debug),
the other lines run, and ``--resume`` then finishes. Real subprocesses where exit codes matter;
the deterministic fake engine (tests/batch_fakes.py) keeps them fast.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from batch_fakes import FakeEngine
from click.testing import CliRunner

from kvcli.cli import main

TESTS_DIR = Path(__file__).resolve().parent
# A fake engine whose "chat template" teaches Hermes tool calls, with room for long prompts,
# and whose add_request raises on a prompt holding BOOM.
LAUNCHER = """\
import sys
sys.path.insert(0, {tests!r})
from batch_fakes import FakeEngine
import kvcli.batch.run

class Engine(FakeEngine):  # a bug in the engine, for one line
    def add_request(self, request_id, ids, *args):
        super().add_request(request_id, ids, *args)
        if "BOOM" in self.tokenizer.decode(ids):
            raise RuntimeError("injected fault")

def load(cfg):
    engine = Engine(max_model_len=20_000)
    engine.tokenizer.chat_template = "<tool_call>"
    return engine

kvcli.batch.run.load_engine = load
from kvcli.cli import main
main(prog_name="kvcli")
"""


def kvcli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    launcher = cwd / "launch.py"
    launcher.write_text(LAUNCHER.format(tests=str(TESTS_DIR)))
    return subprocess.run([sys.executable, str(launcher), *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env={**os.environ, "OMP_NUM_THREADS": "1"})


def nested_schema(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def rows(path: Path) -> dict[str, dict[str, Any]]:
    out = [json.loads(line) for line in path.read_text().splitlines()]
    return {r.get("custom_id") or r["id"]: r for r in out}


def test_deep_schemas_and_huge_integers_fail_only_their_line_then_resume_finishes(tmp_path):
    deep = nested_schema(120)
    call = '<tool_call>{"name": "f", "arguments": {"x": ' + "7" * 5000 + "}}</tool_call>"
    user = {"role": "user", "content": call[::-1]}  # the fake replies with the prompt reversed
    tools = [{"type": "function", "function": {"name": "f", "parameters": deep}}]
    lines = [
        {"id": "good", "prompt": "hello"},
        {"id": "deep-format", "prompt": "x", "response_format": {
            "type": "json_schema", "json_schema": {"name": "n", "schema": deep}}},
        {"custom_id": "deep-tool", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": [{"role": "user", "content": "hi"}], "tools": tools,
                  "tool_choice": "required"}},
        {"id": "huge-int", "messages": [user], "tools": tools, "max_tokens": 6000},
        {"id": "also-good", "prompt": "world"},
    ]
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(line) + "\n" for line in lines))
    res = kvcli("generate", str(inp), "-o", "out.jsonl", "--ordered", cwd=tmp_path)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    out = rows(tmp_path / "out.jsonl")
    assert len(out) == len(lines) and "error" not in out["good"] | out["also-good"]
    assert out["deep-format"]["error"]["param"] == "response_format.json_schema.schema"
    assert out["deep-tool"]["error"]["param"] == "body.tools[0].function.parameters"
    for key in ("deep-format", "deep-tool"):
        assert out[key]["error"]["code"] == "invalid_request"
        assert "nested deeper than 64 levels" in out[key]["error"]["message"]
    huge = out["huge-int"]  # not a valid call (Python cannot read the number): kept as text
    assert "error" not in huge and "tool_calls" not in huge and "7" * 5000 in huge["text"]
    again = kvcli("generate", str(inp), "-o", "out.jsonl", "--resume", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "0 ok, 0 failed, 5 already in out.jsonl" in again.stderr
    assert len(rows(tmp_path / "out.jsonl")) == len(lines)


# --------------------------------------------------------------- the guard
def test_a_failing_line_in_a_real_process_exits_1_without_a_traceback_and_resumes(tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"id": "a", "prompt": "abc"}\n{"id": "b", "prompt": "BOOM"}\n'
                   '{"id": "c", "prompt": "def"}\n')
    res = kvcli("generate", "in.jsonl", "-o", "out.jsonl", cwd=tmp_path)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    out = rows(tmp_path / "out.jsonl")
    assert out["a"]["text"] == "cba" and out["c"]["text"] == "fed"
    assert out["b"]["error"] == {"code": "engine_error", "param": None, "line": 2, "message":
                                 "internal error while preparing the request: RuntimeError: "
                                 "injected fault"}
    assert "in.jsonl:2 (id 'b'): unexpected RuntimeError at " in res.stderr
    assert "--debug prints the full traceback" in res.stderr
    debug = kvcli("generate", "in.jsonl", "--debug", cwd=tmp_path)
    assert debug.returncode == 1 and debug.stderr.count("Traceback (most recent call last)") == 1
    assert "raise RuntimeError(\"injected fault\")" in debug.stderr
    again = kvcli("generate", "in.jsonl", "-o", "out.jsonl", "--resume", cwd=tmp_path)
    assert again.returncode == 0 and "3 already in out.jsonl" in again.stderr, again.stderr


class Boom(RuntimeError):
    pass


def _raise_on_boom(text: Any) -> None:
    if "BOOM" in str(text):
        raise Boom("injected fault for BOOM")


class BoomEngine(FakeEngine):
    """Raises inside add_request for a BOOM prompt (after validating, as a bug would)."""

    def add_request(self, request_id: str, prompt_token_ids: list[int], *args: Any) -> None:
        super().add_request(request_id, prompt_token_ids, *args)
        _raise_on_boom(self.tokenizer.decode(prompt_token_ids))


def _patch_parse(mp: pytest.MonkeyPatch) -> None:
    import kvcli.batch.parse as parse

    real = parse._check_supported
    mp.setattr(parse, "_check_supported", lambda req: (_raise_on_boom(req.prompt.text), real(req)))


def _patch_encode(mp: pytest.MonkeyPatch) -> None:
    from kvcli.batch.encode import PromptEncoder

    real = PromptEncoder.encode
    mp.setattr(PromptEncoder, "encode",
               lambda self, spec, line_no=0: (_raise_on_boom(spec.text), real(self, spec, line_no))[1])


def _patch_reply(mp: pytest.MonkeyPatch) -> None:
    from kvcli.batch.output import ResultFormatter

    real = ResultFormatter.success
    mp.setattr(ResultFormatter, "success",
               lambda self, req, out: (_raise_on_boom(out.outputs[0].text[::-1]),
                                       real(self, req, out))[1])


STAGES = {"reading the line": _patch_parse, "preparing the request": _patch_encode,
          "writing the result": _patch_reply}


@pytest.mark.parametrize("stage", [*STAGES, "add_request"])
@pytest.mark.parametrize("debug", [False, True])
def test_an_unexpected_exception_in_any_stage_is_that_lines_engine_error(
        monkeypatch, tmp_path, stage, debug):
    engines: list[FakeEngine] = []
    engine_class = BoomEngine if stage == "add_request" else FakeEngine
    monkeypatch.setattr("kvcli.batch.run.load_engine",
                        lambda cfg: engines.append(engine_class(max_model_len=4096)) or engines[-1])
    if stage in STAGES:
        STAGES[stage](monkeypatch)
    lines = [{"id": "a", "prompt": "abc"}, {"id": "b", "prompt": "xx BOOM"},
             {"custom_id": "c", "method": "POST", "url": "/v1/completions",
              "body": {"prompt": "yy BOOM"}}, {"id": "d", "prompt": "def"}]
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out.jsonl"
    args = ["generate", str(inp), "-o", str(out), *(["--debug"] if debug else [])]
    res = CliRunner().invoke(main, args, catch_exceptions=False)
    assert res.exit_code == 1, res.stderr
    got = rows(out)
    assert sorted(got) == ["a", "b", "c", "d"]
    assert got["a"]["text"] == "cba" and got["d"]["text"] == "fed"
    where = "preparing the request" if stage == "add_request" else stage
    for key in "bc":
        error = got[key]["error"]
        assert error["code"] == "engine_error", error
        assert error["message"] == f"internal error while {where}: Boom: injected fault for BOOM"
    assert f"in.jsonl:2 (id 'b'): internal error while {where}" in res.stderr
    hints = res.stderr.count("unexpected Boom at tests/test_line_guard.py")
    tracebacks = res.stderr.count("Traceback (most recent call last)")
    assert (hints, tracebacks) == ((0, 2) if debug else (1, 0)), res.stderr
    if stage == "add_request":  # nothing of the failed requests stayed in the engine
        assert sorted(engines[0].aborted) == ["1", "2"] and not engines[0].has_unfinished()
    again = CliRunner().invoke(main, ["generate", str(inp), "-o", str(out), "--resume"],
                               catch_exceptions=False)
    assert again.exit_code == 0 and "4 already in" in again.stderr, again.stderr
