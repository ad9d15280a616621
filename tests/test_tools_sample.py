"""samples/tools.jsonl with --chat-template samples/hermes_tools.jinja: tool calls on a model whose
own template has no tool-call format (the default SmolLM2, the tiny test models), offline."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner
from test_structured_cli import generate

from kvcli.cli import main
from kvcli.inputs import parse_request
from kvcli.tokenizer import Tokenizer

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
LINES = SAMPLES / "tools.jsonl"
TEMPLATE = SAMPLES / "hermes_tools.jinja"
CONSTRAINED = {"weather-required": "get_weather", "time-named": "get_time"}


def _choice(result: dict) -> tuple[str, str | None, list[dict]]:
    """(finish_reason, content, tool_calls) of a plain or an OpenAI result line."""
    if "response" in result:
        choice = result["response"]["body"]["choices"][0]
        message = choice["message"]
        return choice["finish_reason"], message["content"], message.get("tool_calls", [])
    return result["finish_reason"], result["text"], result.get("tool_calls", [])


def _check_sample_run(model: str, require_calls: bool) -> None:
    res, out = generate(str(LINES), "--model", model, "--chat-template", str(TEMPLATE), "-q",
                        input="")
    assert res.exit_code == 0, res.stderr
    assert "ignores `tools`" not in res.stderr
    assert set(out) == {"weather-required", "time-named", "auto", "tool-result"}
    tools = {t["function"]["name"]: t["function"]["parameters"]
             for t in json.loads(LINES.read_text().splitlines()[0])["tools"]}
    for key, name in CONSTRAINED.items():
        finish, _, calls = _choice(out[key])
        assert finish == "tool_calls" or (finish == "length" and not require_calls), out[key]
        for call in calls:
            assert call["function"]["name"] == name
            jsonschema.validate(json.loads(call["function"]["arguments"]), tools[name])


def test_the_template_renders_tools_calls_and_results(tiny_models):
    tokenizer = Tokenizer.from_dir(tiny_models["qwen2"])
    assert "<tool_call>" not in (tokenizer.chat_template or "")
    tokenizer.set_chat_template(TEMPLATE.read_text())
    line = json.loads(LINES.read_text().splitlines()[3])
    prompt = parse_request(line).prompt
    text = tokenizer.apply_chat_template(prompt.chat(), tools=prompt.tools)
    system = text.split("<|im_end|>")[0]
    assert '{"type": "function", "function": {"name": "get_weather"' in system  # the tools
    assert ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": '
            '"celsius"}}\n</tool_call><|im_end|>') in text
    assert '<|im_start|>user\n<tool_response>\n{"temperature": 18' in text
    assert text.endswith("<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def long_tiny_model(tiny_models, tmp_path_factory) -> Path:
    """The tiny qwen2 model with room for the sample's prompts (its byte-level 448-token
    vocabulary makes them ~900 tokens; RoPE works at any position)."""
    path = tmp_path_factory.mktemp("tools_sample") / "model"
    shutil.copytree(tiny_models["qwen2"], path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 2048}))
    return path


def test_tools_sample_runs_on_a_tiny_model_with_the_template(long_tiny_model):
    """Without the template the tiny model (like SmolLM2) has no tool-call format, so
    tool_choice "required" was that line's error and no reply was parsed for calls."""
    _check_sample_run(str(long_tiny_model), require_calls=False)


def test_chat_template_flag_refuses_a_missing_file(tmp_path):
    res = CliRunner().invoke(main, ["generate", str(LINES), "--chat-template",
                                    str(tmp_path / "nope.jinja")])
    assert res.exit_code == 2 and "nope.jinja: no such file" in res.output


@pytest.mark.slow  # the real default model, ~30-60 s on a busy 2-core machine
def test_tools_sample_on_the_default_model(default_model_dir):
    _check_sample_run(str(default_model_dir), require_calls=True)
