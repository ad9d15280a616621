"""Hostile input: every bad line is named (file:line, field), the rest of the batch still runs.

One `kvcli generate` subprocess with the real tiny model and one `kvcli audit`
subprocess read a file that holds every kind of bad line between good ones;
fuzz tests drive arbitrary bytes and JSON through the generate line reader,
parser and encoder (with the model's real tokenizer and chat template) and
through the audit's reader and renderers.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcli.audit.parse import to_request
from kvcli.audit.records import FieldError, InputProblem
from kvcli.audit.template import render_with_template
from kvcli.audit.tokenizers import load_tokenizer
from kvcli.batch.encode import PromptEncoder
from kvcli.batch.parse import ParseOptions, parse_line
from kvcli.batch.records import FailedLine, LineError, LineRequest
from kvcli.batch.source import iter_lines
from kvcli.cli import main

FIFTY_MB = 50 << 20
GOOD = {"prompt": "The fox walked to the river", "max_tokens": 3}
DUP = b'{"id": "dup", "prompt": "The fox", "max_tokens": 3}'

# (line, field the error names or None for the whole line, code); None: a good line.
BAD_LINES: list[tuple[bytes, str | None, str] | None] = [
    None,
    (b'{"prompt": "unterminated', None, "invalid_json"),
    (b"[1, 2, 3]", None, "invalid_json"),
    (b"42", None, "invalid_json"),
    (b'"a string"', None, "invalid_json"),
    (b"null", None, "invalid_json"),
    (b'{"id": "ten", "prompt": "a", "max_tokens": "ten"}', "max_tokens", "invalid_request"),
    (b'{"prompt": "a", "temperature": -1}', "temperature", "invalid_request"),
    (b'{"prompt": "a", "top_p": 2}', "top_p", "invalid_request"),
    (b'{"prompt": ""}', "prompt", "invalid_request"),
    (b'{"messages": []}', "messages", "invalid_request"),
    (b'{"messages": [{"role": "wizard", "content": "hi"}]}', "messages[0].role",
     "invalid_request"),
    (json.dumps({"prompt": "fox " * 600}).encode(), "prompt", "context_length_exceeded"),
    (b'{"prompt_token_ids": [1, 2, 99999]}', "prompt_token_ids[2]", "invalid_request"),
    (b'{"prompt": "caf\xe9 \xff\xfe"}', None, "invalid_json"),
    (b"[" * 10_000 + b"]" * 10_000, None, "invalid_json"),
    (b'{"a": ' * 10_000 + b"1" + b"}" * 10_000, None, "invalid_json"),
    None,
    (b"FIFTY_MB", None, "line_too_long"),  # written in chunks by write_input
    (DUP, None, "duplicate"),  # runs, and is reported
    None,
    (DUP, None, "duplicate"),
    (b'{"custom_id": "u", "url": ["/v1/chat/completions"], "body": {}}', "url", "invalid_url"),
]
# What the audit cannot read; it audits the rest. Its request model is generate's (an unknown role
# and an empty prompt are errors in both); sampling fields are not its business, and token ids
# need --model.
AUDIT_PROBLEMS = {2, 3, 4, 5, 6, 10, 11, 12, 14, 15, 16, 17, 19, 23}


def write_input(path: Path, fifty_mb_tail: bytes) -> Path:
    with path.open("wb") as f:
        for entry in BAD_LINES:
            if entry is None:
                f.write(json.dumps(GOOD).encode() + b"\n")
            elif entry[0] == b"FIFTY_MB":
                f.write(b'{"prompt": "')
                for _ in range(FIFTY_MB >> 20):
                    f.write(b"The fox walked. " * (1 << 16))
                f.write(fifty_mb_tail + b"\n")
            else:
                f.write(entry[0] + b"\n")
    return path


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvcli", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.slow
def test_generate_names_every_bad_line_and_runs_the_rest(tiny_models, tmp_path) -> None:
    inp = write_input(tmp_path / "in.jsonl", b'"}')  # a valid 50 MB line: never read whole
    res = run("generate", str(inp), "--model", str(tiny_models["llama"]), "--ordered")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert len(rows) == len(BAD_LINES)
    for line_no, (row, entry) in enumerate(zip(rows, BAD_LINES, strict=True), start=1):
        if entry is None or entry[2] == "duplicate":
            assert "error" not in row and 1 <= row["usage"]["completion_tokens"] <= 3
            continue
        _, field, code = entry
        assert row["error"]["line"] == line_no and row["error"]["code"] == code, row
        assert row["error"]["param"] == field, row
        ids = {7: " (id 'ten')", 23: " (custom_id 'u')"}
        where = f"{inp}:{line_no}" + ids.get(line_no, "")
        assert f"{where}: {field + ': ' if field else ''}" in res.stderr, where
    assert f"{inp}:22: id 'dup' already used on line 20" in res.stderr
    assert "5 ok, 18 failed" in res.stderr


def test_duplicate_ids_on_resume_count_as_done_once_either_is_written(tiny_models, tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"id": "a", "prompt": "The fox"}\n{"id": "a", "prompt": "The dog"}\n')
    out = tmp_path / "out.jsonl"
    out.write_text(json.dumps({"id": "a", "text": "x", "finish_reason": "stop"}) + "\n")
    res = CliRunner().invoke(main, ["generate", str(inp), "-o", str(out), "--resume", "--model",
                                    str(tiny_models["llama"])], catch_exceptions=False)
    assert res.exit_code == 0 and "resuming: 1 request already in" in res.stderr
    assert out.read_text().count("\n") == 1  # both lines skipped: the README (Resuming after a kill) says so


@pytest.mark.slow
def test_audit_names_every_bad_line_and_audits_the_rest(tmp_path) -> None:
    inp = write_input(tmp_path / "in.jsonl", b'"}')  # a valid 50 MB line: skipped unread
    res = run("audit", str(inp), "--format", "json", "--fail-on", "never")
    assert res.returncode == 0 and "Traceback" not in res.stderr
    doc = json.loads(res.stdout)
    audited = [int(p["source"].rsplit(":", 1)[1]) for p in doc["prompts"]]
    problems = res.stderr.splitlines()
    assert all(p.startswith(f"kvcli audit: {inp}:") for p in problems)
    named = [int(p.split(":")[2]) for p in problems]
    assert sorted(named) == sorted(AUDIT_PROBLEMS)  # render problems come when their chunk renders
    assert audited == [n for n in range(1, len(BAD_LINES) + 1) if n not in AUDIT_PROBLEMS]
    assert f"{inp}:11: messages: empty" in res.stderr
    assert f"{inp}:19: line of 52,428,814 bytes is longer than the 16,777,216-byte limit" \
        in res.stderr


@pytest.mark.parametrize("setup, name, code, message", [
    (lambda d: (d / "e.jsonl").write_bytes(b""), "e.jsonl", 0, "no request lines"),
    (lambda d: (d / "e.jsonl").write_bytes(b"\n \r\n\n"), "e.jsonl", 0, "no request lines"),
    (lambda d: (d / "dir.jsonl").mkdir(), "dir.jsonl", 2, "is a directory"),
])
def test_empty_file_runs_nothing_and_a_directory_is_a_usage_error(tiny_models, tmp_path, setup,
                                                                  name, code, message):
    setup(tmp_path)
    res = CliRunner().invoke(main, ["generate", str(tmp_path / name), "--model",
                                    str(tiny_models["llama"])], catch_exceptions=False)
    assert res.exit_code == code and message in res.stderr and res.stdout == ""
    audit = CliRunner().invoke(main, ["audit", str(tmp_path / name)], catch_exceptions=False)
    assert audit.exit_code == 2 and "Traceback" not in audit.stderr


# --------------------------------------------------------------------- fuzz
json_leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
json_values = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.sampled_from(["prompt", "messages", "prompt_token_ids", "role", "content", "tools", "id",
                     "custom_id", "body", "url", "method", "type", "text", "max_tokens", "n",
                     "stop", "cache_salt", "name", "tool_calls", "function", "arguments"])
    | st.text(max_size=4), inner, max_size=5), max_leaves=24)
roles = st.sampled_from(["system", "user", "assistant", "tool"])
text = st.text(max_size=40) | st.sampled_from(["{{ raise_exception('boom') }}", "<|im_end|>",
                                               "{% for %}", "\x00", "<|endoftext|>"])
message = st.fixed_dictionaries({"role": roles, "content": text}) | st.fixed_dictionaries(
    {"role": roles | json_leaf}, optional={"content": text | json_values, "name": json_values,
                                           "tool_calls": json_values})
request = st.one_of(
    json_values,
    st.fixed_dictionaries({"messages": st.lists(message, max_size=4)},
                          optional={"tools": json_values, "max_tokens": json_values}),
    st.fixed_dictionaries({"prompt": text | json_values}),
    st.fixed_dictionaries({"prompt_token_ids": st.lists(st.integers(-5, 600), max_size=8)}))


@pytest.fixture(scope="module")
def encoder(tiny_models) -> PromptEncoder:
    from kvcli.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(tiny_models["llama"])
    return PromptEncoder(tokenizer, 512, tokenizer.vocab_size)


def _dumps(value: Any) -> bytes | None:
    try:
        return json.dumps(value).encode()  # may hold NaN/Infinity: not JSON, must fail cleanly
    except (ValueError, RecursionError):
        return None


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=request, raw=st.binary(max_size=60), use_raw=st.booleans())
def test_fuzz_generate_line_to_tokens_with_the_real_tokenizer(encoder, value, raw, use_raw):
    data = raw if use_raw else _dumps(value)
    if data is None:
        return
    lines = list(iter_lines(io.BytesIO(data.replace(b"\n", b" ") + b"\n")))
    if not lines:  # blank
        return
    parsed = parse_line(lines[0], ParseOptions())
    assert isinstance(parsed, LineRequest | FailedLine)
    if isinstance(parsed, FailedLine):
        assert parsed.describe and parsed.error.code
        return
    try:
        ids = encoder.encode(parsed.prompt)  # the chat template may only fail as a LineError
    except LineError as err:
        assert str(err)
        return
    assert ids and all(0 <= t < encoder.vocab_size for t in ids) and len(ids) < 512


@settings(max_examples=200, deadline=None)
@given(chunks=st.lists(st.binary(max_size=30) | st.sampled_from([b"\n", b"\r\n", b" \n",
                                                                 b"\xef\xbb\xbf"]), max_size=12),
       limit=st.integers(1, 40))
def test_fuzz_line_reader_keeps_line_numbers_and_never_holds_long_lines(chunks, limit) -> None:
    data = b"".join(chunks)
    lines = list(iter_lines(io.BytesIO(data), limit))
    physical = data.split(b"\n")
    numbers = [r.line_no for r in lines]
    assert numbers == sorted(set(numbers)) and all(1 <= n <= len(physical) for n in numbers)
    for r in lines:
        text = physical[r.line_no - 1]
        if r.data is None:
            assert r.size > limit  # skipped without being kept
        else:
            assert r.data.strip() and r.size == len(r.data) <= limit
            assert text.rstrip(b"\r").endswith(r.data)


@pytest.fixture(scope="module")
def audit_tokenizer(tiny_models) -> Any:
    return load_tokenizer(model=str(tiny_models["llama"]))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=request)
def test_fuzz_audit_renders_with_a_models_template_or_names_the_problem(audit_tokenizer, value):
    req = to_request(value, "fuzz:1")
    if isinstance(req, InputProblem):
        assert req.message
        return
    try:
        rendered = render_with_template(0, req, audit_tokenizer)
    except FieldError as err:
        assert str(err)
        return
    rendered.text.encode("utf-8")
    assert rendered.segments[-1].end == len(rendered.text)
    assert all(s.start <= s.end for s in rendered.segments)

