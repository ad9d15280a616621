"""Inputs: request shapes, rendering order, files, directories, stdin, bad input, fuzzing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_audit_support import (
    SYSTEM,
    TOOLS,
    assistant,
    audit_json,
    chat,
    problems,
    run,
    system,
    tool_call,
    tool_result,
    user,
    write_jsonl,
)  # fmt: skip

from kvcli.audit.parse import to_request
from kvcli.audit.records import FieldError, InputProblem, PromptRequest
from kvcli.audit.render import render_request


def test_every_request_shape_is_read(tmp_path: Path) -> None:
    rows = [
        {"id": "plain", "prompt": "Summarize the release notes."},
        {"id": "chat", "messages": [system(), user("hi")], "tools": TOOLS, "session_id": "s1"},
        {"custom_id": "batch", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "gpt-4o", "messages": [user("hi")], "user": "u7"}},
        {"custom_id": "claude", "params": {"model": "claude-sonnet-4-5", "system": [{"type": "text", "text": "Be brief."}],
         "messages": [user("hi")], "metadata": {"session_id": "s9"}}},
        {"id": "responses", "instructions": "Be brief.", "input": "hi", "prompt_cache_key": "k1"},
        {"custom_id": "completion", "method": "POST", "url": "/v1/completions", "body": {"prompt": ["Once upon"]}},
    ]  # fmt: skip
    doc = audit_json(tmp_path, rows)
    assert problems(doc) == []
    prompts = doc["prompts"]
    assert [p["id"] for p in prompts] == ["plain", "chat", "batch", "claude", "responses", "completion"]
    assert [p["session"] for p in prompts] == [None, "s1", "u7", "s9", "k1", None]
    assert [p["source"] for p in prompts] == [f"{tmp_path / 'requests.jsonl'}:{i}" for i in range(1, 7)]
    assert all(p["tokens"] > 0 for p in prompts)


def test_chat_renders_tools_then_system_then_messages_exactly_as_given() -> None:
    tool = {"type": "function", "function": {"name": "zeta", "parameters": {"b": 1, "a": {"y": 2, "x": 1}}}}
    request = to_request(
        {"system": "SYS", "tools": [tool, TOOLS[0]],
         "messages": [user("Q"), tool_call("c1", "zeta", '{"b":1,  "a":2}'), tool_result("c1", '{"ok":true}')]},
        "t:1",
    )  # fmt: skip
    assert isinstance(request, PromptRequest)
    rendered = render_request(0, request)
    text = rendered.text
    positions = [text.index(s) for s in ('"name": "zeta"', '"name": "search_docs"', "SYS", "Q", '{"b":1,  "a":2}')]
    assert positions == sorted(positions)
    assert '"parameters": {"b": 1, "a": {"y": 2, "x": 1}}' in text  # key order kept
    assert [s.label for s in rendered.segments][:3] == ["tools[0] zeta", "tools[1] search_docs", "system[0]"]
    assert rendered.segments[-1].kind == "generation"
    assert "".join(text[s.start : s.end] for s in rendered.segments) == text


def test_content_parts_and_images_render_as_fingerprints() -> None:
    parts = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "data:a", "detail": "low"}}]
    one = render_request(0, to_request(chat([user(parts)]), "t:1")).text  # type: ignore[arg-type]
    parts[1]["image_url"]["url"] = "data:b"  # type: ignore[index]
    two = render_request(1, to_request(chat([user(parts)]), "t:2")).text  # type: ignore[arg-type]
    assert "look" in one and "detail=low" in one and one != two


def test_directory_is_read_recursively_in_sorted_order(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_text("second prompt")
    (tmp_path / "a.md").write_text("# first prompt")
    (tmp_path / "c.json").write_text(json.dumps([{"prompt": "third"}, {"prompt": "fourth"}]))
    write_jsonl(tmp_path / "sub" / "d.jsonl", [{"prompt": "fifth"}])
    (tmp_path / ".hidden.txt").write_text("skipped")
    (tmp_path / "notes.csv").write_text("skipped")
    result = run([str(tmp_path), "--format", "json"])
    assert result.exit_code == 0, result.output
    sources = [p["source"] for p in json.loads(result.stdout)["prompts"]]
    assert sources == [str(tmp_path / "a.md"), str(tmp_path / "b.txt"), f"{tmp_path / 'c.json'}[0]",
                       f"{tmp_path / 'c.json'}[1]", f"{tmp_path / 'sub' / 'd.jsonl'}:1"]  # fmt: skip


def test_malformed_lines_are_named_and_the_rest_is_audited(tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    lines = [
        json.dumps({"prompt": "good one"}),
        "not json",
        json.dumps({"messages": "hello"}),
        json.dumps({"messages": [{"role": "user", "content": 5}]}),
        json.dumps({"messages": [user("x"), {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}]}),
        json.dumps({"body": {"prompt": "x"}, "custom_id": 4.5}),
        json.dumps({"model": "gpt-4o"}),
        "",
        json.dumps({"prompt": "good two"}),
    ]
    path.write_text("\n".join(lines) + "\n")
    result = run([str(path), "--format", "json"])
    assert result.exit_code == 0
    doc = json.loads(result.stdout)
    assert [p["source"] for p in doc["prompts"]] == [f"{path}:1", f"{path}:9"]
    found = problems(doc)
    assert found[0].startswith(f"{path}:2: invalid JSON: ") and "line 1 column 1" in found[0]
    assert found[1:] == [
        f"{path}:3: messages: expected an array of messages, got string",
        f"{path}:4: messages[0].content: expected a string, an array of content parts or null, got number",
        f"{path}:5: messages[1].tool_calls[0].function.arguments: expected a JSON string, got number",
        f"{path}:6: custom_id: expected a string, got number",
        f"{path}:7: prompt: expected exactly one of prompt, messages, prompt_token_ids or input, got none",
    ]
    assert f"kvcli audit: {path}:3: messages: expected" in result.stderr
    strict = run([str(path), "--strict"])
    assert strict.exit_code == 2
    assert strict.stderr.strip() == f"kvcli audit: {found[0]}"


def test_deep_and_huge_json_do_not_crash(tmp_path: Path) -> None:
    deep = '{"prompt": ' + "[" * 10_000 + "]" * 10_000 + "}"
    deep_tools = json.dumps({"messages": [user("x")], "tools": [{"a": 0}]}).replace('{"a": 0}', '{"a": ' * 1000 + "0" + "}" * 1000)
    huge = json.dumps({"prompt": "lorem ipsum dolor sit amet " * 40_000})
    path = tmp_path / "odd.jsonl"
    path.write_text("\n".join([deep, deep_tools, huge]) + "\n")
    result = run([str(path), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert problems(doc) == [
        f"{path}:1: invalid JSON: nested too deeply (more than 1024 levels)",
        f"{path}:2: tools[0]: cannot render: nested too deeply",
    ]
    assert [p["tokens"] > 100_000 for p in doc["prompts"]] == [True]


def test_invalid_utf8_and_empty_inputs_get_clean_messages(tmp_path: Path) -> None:
    bad_line = tmp_path / "bad.jsonl"
    bad_line.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    bad_text = tmp_path / "bad.txt"
    bad_text.write_bytes(b"abc\xff\xfe")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    result = run([str(bad_line), str(bad_text), str(empty), "--format", "json"])
    assert result.exit_code == 0
    assert problems(json.loads(result.stdout)) == [
        f"{bad_line}:2: invalid UTF-8 at byte 15",
        f"{bad_text}: invalid UTF-8 at byte 3",
        f"{empty}: empty file: no prompt",
    ]


def test_unreadable_inputs_exit_2(tmp_path: Path) -> None:
    (tmp_path / "nothing").mkdir()
    only_bad = write_jsonl(tmp_path / "only_bad.jsonl", [{"messages": []}])
    cases = {
        str(tmp_path / "missing.jsonl"): "no such file or directory",
        str(tmp_path / "nothing"): "directory holds no .txt, .md, .json or .jsonl files",
        str(only_bad): "no prompts to audit (every record was malformed)",
    }
    for path, message in cases.items():
        result = run([path])
        assert result.exit_code == 2
        assert message in result.stderr
    assert run([]).exit_code == 2
    assert run(["-", "-"], stdin="x").exit_code == 2


def test_stdin_jsonl_json_and_text() -> None:
    rows = [chat([system(), user("How do I rotate keys?")]), chat([system(), user("And billing?")])]
    as_jsonl = run(["-", "--format", "json"], stdin="".join(json.dumps(r) + "\n" for r in rows))
    assert [p["source"] for p in json.loads(as_jsonl.stdout)["prompts"]] == ["<stdin>:1", "<stdin>:2"]
    as_document = run(["-", "--format", "json"], stdin=json.dumps(rows, indent=2))
    assert [p["source"] for p in json.loads(as_document.stdout)["prompts"]] == ["<stdin>[0]", "<stdin>[1]"]
    as_text = run(["-", "--format", "json"], stdin=SYSTEM)
    assert json.loads(as_text.stdout)["prompts"][0]["source"] == "<stdin>"
    empty = run(["-"], stdin="")
    assert empty.exit_code == 2 and "<stdin>: empty" in empty.stderr


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=25,
)
parts = st.one_of(
    json_values,
    st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "tool_use", "tool_result", "x"])}, optional={
        "text": json_values, "image_url": json_values, "content": json_values, "input": json_values,
        "cache_control": json_values, "name": json_values}),
)  # fmt: skip
messages = st.fixed_dictionaries(
    {"role": st.one_of(st.sampled_from(["system", "user", "assistant", "tool", "developer"]), json_values)},
    optional={"content": st.one_of(st.text(), st.lists(parts, max_size=4), json_values), "name": json_values,
              "tool_calls": st.one_of(json_values, st.lists(st.fixed_dictionaries(
                  {"function": st.fixed_dictionaries({"name": json_values}, optional={"arguments": json_values})}),
                  max_size=3))},
)  # fmt: skip
requests = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {"messages": st.one_of(st.lists(messages, max_size=5), json_values)},
        optional={"tools": st.one_of(st.lists(json_values, max_size=3), json_values), "system": json_values,
                  "response_format": json_values, "model": json_values, "cache_salt": json_values,
                  "session_id": json_values, "metadata": json_values, "id": json_values},
    ),
    st.fixed_dictionaries({"input": json_values}, optional={"instructions": json_values}),
    st.fixed_dictionaries({"custom_id": json_values, "body": json_values}),
    st.fixed_dictionaries({"prompt": json_values}),
)  # fmt: skip


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=requests)
def test_renderer_fuzz_gives_a_prompt_or_a_clean_error(value: Any) -> None:
    request = to_request(value, "fuzz:1")
    if isinstance(request, InputProblem):
        assert request.message and request.where == "fuzz:1"
        return
    try:
        rendered = render_request(0, request)
    except FieldError as err:
        assert ": " in str(err)
        return
    assert "".join(rendered.text[s.start : s.end] for s in rendered.segments) == rendered.text
    rendered.text.encode("utf-8")  # always encodable (lone surrogates replaced)


@settings(max_examples=60, deadline=None)
@given(value=requests)
def test_fuzzed_requests_never_crash_the_cli(value: Any) -> None:
    try:
        line = json.dumps(value)
    except ValueError:
        return
    result = run(["-", "--format", "json", "--fail-on", "never"], stdin=line + "\n" + json.dumps({"prompt": "ok"}) + "\n")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["summary"]["prompts"] >= 1


def test_assistant_text_and_tool_calls_are_blocks_of_one_message() -> None:
    both = {**assistant("let me check"), "tool_calls": tool_call("c", "f", "{}")["tool_calls"]}
    request = to_request(chat([user("q"), both, tool_call("d", "g", "{}")]), "t:1")
    assert isinstance(request, PromptRequest)
    rendered = render_request(0, request)
    assert [s.label for s in rendered.segments] == [
        "messages[0] user", "messages[1] assistant", "messages[1] assistant tool_calls[0]",
        "messages[2] assistant", "generation prompt",
    ]  # fmt: skip
    assert [role for role, _, _ in rendered.messages] == ["user", "assistant", "assistant"]
    assert '<tool_call>{"name": "g", "arguments": {}}</tool_call>' in rendered.text
