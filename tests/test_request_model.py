"""One request model for generate and audit (issue 16): the audit predicts, line by line, the
cached tokens generate reports, for every accepted line form, on two chat templates."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcli.cli import main

# A second template, unlike the fixtures' ChatML one: tools after the messages, tool calls
# rendered from the (parsed) arguments, content read unguarded.
TOOLCALL_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.tool_calls %}"
    "{%- for call in message.tool_calls %}"
    "{{- '{\"name\": \"' + call.function.name + '\", \"arguments\": ' + (call.function.arguments | tojson) + '}' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if tools %}{{- '<|im_start|>tools\\n' + (tools | tojson) + '<|im_end|>\\n' }}{%- endif %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SYSTEM = "You are a helpful assistant for the fox library. Answer briefly and kindly. " * 2
TOOLS = [{"type": "function", "function": {"name": "find_fox", "parameters": {"type": "object"}}}]
TURNS = ["Where does the fox live?", "What is 12 plus 345?", "Name the capital of Italy.",
         "The quick brown fox jumps over the lazy dog."]


@pytest.fixture(scope="module")
def two_templates(tiny_models, tmp_path_factory) -> dict[str, Path]:
    """llama with the fixtures' ChatML template; qwen2 with the tool-call template."""
    other = tmp_path_factory.mktemp("toolcall") / "qwen2"
    shutil.copytree(tiny_models["qwen2"], other)
    (other / "chat_template.jinja").write_text(TOOLCALL_TEMPLATE)
    config = json.loads((other / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (other / "tokenizer_config.json").write_text(json.dumps(config))
    return {"chatml": tiny_models["llama"], "toolcall": other}


def _content(text: str, as_parts: bool) -> Any:
    if not as_parts:
        return text
    half = len(text) // 2
    return [{"type": "text", "text": text[:half]}, {"type": "text", "text": text[half:]}]


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A conversation drawn from a small pool, so lines share prefixes and the cache hits."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for k in range(draw(st.integers(1, 2))):  # 3 rounds with tools overflow the 512-token context
        messages.append({"role": "user", "content": _content(draw(st.sampled_from(TURNS)), draw(st.booleans()))})
        if draw(st.booleans()):
            call = {"id": f"c{k}", "type": "function",
                    "function": {"name": "find_fox", "arguments": '{"where": "forest"}'}}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": '{"found": true}'})
        messages.append({"role": "assistant", "content": _content("The fox lives in the forest.", draw(st.booleans()))})
    messages.append({"role": "user", "content": draw(st.sampled_from(TURNS))})
    return messages


@st.composite
def lines(draw: st.DrawFn) -> dict[str, Any]:
    """One line in any form generate accepts."""
    form = draw(st.sampled_from(["plain", "openai-chat", "anthropic", "responses", "text",
                                 "completion", "token-ids", "completion-ids"]))
    tools = TOOLS if draw(st.booleans()) else None
    if form == "text":
        return {"prompt": SYSTEM + draw(st.sampled_from(TURNS))}
    if form in ("token-ids", "completion-ids"):
        ids = [5 + (i * 7) % 400 for i in range(40)] + draw(st.lists(st.integers(0, 440), min_size=1, max_size=20))
        if form == "token-ids":
            return {"prompt_token_ids": ids}
        return {"method": "POST", "url": "/v1/completions", "body": {"prompt": ids}}
    if form == "completion":
        return {"method": "POST", "url": "/v1/completions", "body": {"prompt": SYSTEM + draw(st.sampled_from(TURNS))}}
    messages = draw(conversations())
    if form == "anthropic":
        return {"params": {"system": messages[0]["content"], "messages": messages[1:], **({"tools": tools} if tools else {})}}
    if form == "responses":
        return {"instructions": SYSTEM, "input": draw(st.sampled_from(TURNS))}
    body = {"messages": messages, **({"tools": tools} if tools else {})}
    if form == "openai-chat":
        return {"method": "POST", "url": "/v1/chat/completions", "body": body}
    return body


def _with_ids(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, row in enumerate(rows):
        key = "custom_id" if ("body" in row or "params" in row) else "id"
        out.append({key: f"r{i}", **row})
    return out


def _cached_tokens(model: Path, batch: Path) -> tuple[list[int], list[int]]:
    runner = CliRunner()
    gen = runner.invoke(main, ["generate", str(batch), "--model", str(model), "--max-tokens", "1",
                               "--quiet", "--ordered"])
    assert gen.exit_code == 0, gen.output
    actual = [json.loads(line) for line in gen.stdout.splitlines()]
    audit = runner.invoke(main, ["audit", str(batch), "--model", str(model), "--format", "json",
                                 "--fail-on", "never"])
    assert audit.exit_code == 0, audit.output
    doc = json.loads(audit.stdout)
    assert doc["input_problems"] == []
    predicted = [p["cached_tokens"] for p in doc["prompts"]]
    return [_usage(r)["cached_tokens"] for r in actual], predicted


def _usage(result: dict[str, Any]) -> dict[str, Any]:
    if "response" in result:  # an OpenAI Batch output line
        usage = result["response"]["body"]["usage"]
        return {"cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]}
    return result["usage"]


@pytest.mark.parametrize("template", ["chatml", "toolcall"])
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(rows=st.lists(lines(), min_size=3, max_size=7))
def test_audit_predicts_generates_cached_tokens_for_every_line_form(two_templates, tmp_path, template, rows):
    batch = tmp_path / f"batch-{template}.jsonl"
    batch.write_text("".join(json.dumps(r) + "\n" for r in _with_ids(rows)))
    actual, predicted = _cached_tokens(two_templates[template], batch)
    assert actual == predicted


def test_null_content_with_tool_calls_and_text_parts_render_on_a_template_that_reads_content(two_templates, tmp_path):
    """Bugs 1 and 2: the ChatML template does `message.content + ...` unguarded."""
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": [{"type": "text", "text": "Where is"}, {"type": "text", "text": "the fox?"}]},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "find_fox", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c", "content": "forest"}]
    batch = tmp_path / "b.jsonl"
    batch.write_text(json.dumps({"id": "a", "messages": messages}) + "\n"
                     + json.dumps({"id": "b", "messages": messages + [{"role": "user", "content": "And then?"}]}) + "\n")
    for model in two_templates.values():
        actual, predicted = _cached_tokens(model, batch)
        assert actual == predicted and actual[1] > 0


def test_audit_hashes_token_ids_with_model_and_names_the_need_without(two_templates, tmp_path):
    """Bug 3."""
    ids = list(range(5, 70))
    batch = tmp_path / "ids.jsonl"
    batch.write_text(json.dumps({"prompt_token_ids": ids}) + "\n" + json.dumps({"prompt_token_ids": ids + [9]}) + "\n")
    actual, predicted = _cached_tokens(two_templates["chatml"], batch)
    assert actual == predicted == [0, 64]
    plain = CliRunner().invoke(main, ["audit", str(batch), "--format", "json", "--fail-on", "never"])
    assert "prompt_token_ids: token ids are the model's own; give --model" in plain.stderr


def test_tools_a_template_ignores_are_reported_once_with_the_count(tiny_models, tmp_path):
    """Bug 4: a template without a tools section drops them; both commands say so once."""
    model = tmp_path / "notools"
    shutil.copytree(tiny_models["llama"], model)
    (model / "chat_template.jinja").write_text(
        "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
    rows = [{"messages": [{"role": "user", "content": q}], "tools": TOOLS} for q in TURNS[:3]]
    rows.append({"messages": [{"role": "user", "content": "no tools here"}]})
    batch = tmp_path / "tools.jsonl"
    batch.write_text("".join(json.dumps(r) + "\n" for r in rows))
    runner = CliRunner()
    gen = runner.invoke(main, ["generate", str(batch), "--model", str(model), "--max-tokens", "1"])
    assert gen.exit_code == 0, gen.output
    warned = [line for line in gen.stderr.splitlines() if "ignores `tools`" in line]
    assert warned == ["kvcli generate: warning: the model's chat template ignores `tools`; they were "
                      "dropped from 3 lines (first: line 1)"]
    audit = runner.invoke(main, ["audit", str(batch), "--model", str(model), "--fail-on", "never"])
    assert audit.stderr.count("ignores `tools`") == 1 and "of 3 request(s)" in audit.stderr
    used = runner.invoke(main, ["generate", str(batch), "--model", str(tiny_models["llama"]), "--max-tokens", "1"])
    assert "ignores `tools`" not in used.stderr  # the fixtures' template renders them
