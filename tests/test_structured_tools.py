"""Tool calls: the family format from the chat template, tool_choice checks, constrained calls
for "required" / a named function, and parsing each family's format into OpenAI tool_calls."""

from __future__ import annotations

import json
import shutil

import jsonschema
import pytest

from kvcli.structured.tools import (
    check_tool_choice,
    parse_tool_calls,
    tool_call_format,
    tool_constraint,
)

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city"],
           "properties": {"city": {"type": "string", "maxLength": 12},
                          "unit": {"enum": ["c", "f"]}}}
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "time", "parameters": {
             "type": "object", "properties": {}, "additionalProperties": False}}}]
# A Hermes / Qwen 2.5 style ChatML template (the shape of Qwen2.5's own tools section).
HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n"
    "For each call return <tool_call>\n{\"name\": <name>, \"arguments\": <args>}\n</tool_call>"
    "<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")


def test_format_from_the_template():
    assert tool_call_format(HERMES_TEMPLATE) == "hermes"
    assert tool_call_format("{{ '[TOOL_CALLS]' }}") == "mistral"
    assert tool_call_format("{{ '<|python_tag|>' }}") == "llama3"
    assert tool_call_format("{{ messages }}") is None and tool_call_format(None) is None


def test_tool_choice_checks():
    assert check_tool_choice(None, TOOLS, "tool_choice") == "auto"
    assert check_tool_choice(None, None, "tool_choice") is None
    assert check_tool_choice("required", TOOLS, "tool_choice") == "required"
    named = {"type": "function", "function": {"name": "time"}}
    assert check_tool_choice(named, TOOLS, "tool_choice") == "time"
    for bad, match in [("always", "expected"), ({"type": "function", "function": {"name": "x"}},
                                                 r"tool_choice\.function\.name: no tool")]:
        with pytest.raises(ValueError, match=match):
            check_tool_choice(bad, TOOLS, "tool_choice")
    with pytest.raises(ValueError, match="only valid together with tools"):
        check_tool_choice("auto", None, "body.tool_choice")


def test_required_needs_a_known_format_and_enforceable_parameters():
    with pytest.raises(ValueError, match="^tool_choice: the model's chat template has no"):
        tool_constraint(TOOLS, "required", None, "tool_choice", "tools")
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"not": {}}}}]
    with pytest.raises(ValueError, match=r"^tools\[0\]\.function\.parameters\.not: "):
        tool_constraint(bad, "required", "hermes", "tool_choice", "tools")
    assert tool_constraint(TOOLS, "auto", "hermes", "tool_choice", "tools") is None


@pytest.mark.parametrize("fmt, text, content, calls", [
    ("hermes", 'Sure.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n'
               '</tool_call>\n<tool_call>\n{"name": "time", "arguments": {}}\n</tool_call>',
     "Sure.", [("weather", {"city": "Paris"}), ("time", {})]),
    ("hermes", "No tools needed.", "No tools needed.", []),
    ("hermes", "<tool_call>\nnot json\n</tool_call>", "<tool_call>\nnot json\n</tool_call>", []),
    ("llama3", '{"name": "weather", "parameters": {"city": "Rome"}}', None,
     [("weather", {"city": "Rome"})]),
    ("llama3", "It is sunny.", "It is sunny.", []),
    ("mistral", '[TOOL_CALLS][{"name": "time", "arguments": {}}]', None, [("time", {})]),
    ("mistral", '[{"name": "weather", "arguments": {"city": "Oslo"}}, {"nope": 1}]',
     '[{"name": "weather", "arguments": {"city": "Oslo"}}, {"nope": 1}]', []),
])
def test_parse_each_format(fmt, text, content, calls):
    got_content, got = parse_tool_calls(text, fmt)
    assert got_content == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got] == calls
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in got)


@pytest.fixture(scope="module")
def hermes_model(tiny_models, tmp_path_factory):
    """The tiny qwen2 model with a Hermes-style tool template."""
    path = tmp_path_factory.mktemp("hermes") / "model"
    shutil.copytree(tiny_models["qwen2"], path)
    (path / "chat_template.jinja").write_text(HERMES_TEMPLATE)
    return path


@pytest.mark.parametrize("fmt", ["hermes", "llama3", "mistral"])
@pytest.mark.parametrize("choice", ["required", "weather"])
def test_constrained_calls_equal_transformers(hermes_model, fmt, choice):
    """A "required" / named call decodes as transformers + xgrammar do on the same grammar; a
    reply that stopped parses into calls whose arguments validate against the tool's schema."""
    from structured_reference import ConstrainedReference

    from kvcli.engine.llm import LLM
    from kvcli.sampling_params import SamplingParams

    llm = LLM(str(hermes_model), block_size=4)
    so = tool_constraint(TOOLS, choice, fmt, "tool_choice", "tools", parallel=False)
    prompt = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS}
    out = llm.generate([prompt], SamplingParams(max_tokens=40, structured_outputs=so))[0]
    ref = ConstrainedReference(hermes_model, 40)
    assert ref.compare(out.prompt_token_ids, out.outputs[0].token_ids, so) == 0
    if out.outputs[0].finish_reason == "stop":
        check_calls(out.outputs[0].text, fmt, choice)


def check_calls(text: str, fmt: str, choice: str) -> None:
    content, calls = parse_tool_calls(text, fmt)
    assert content is None and len(calls) == 1, text
    name = calls[0]["function"]["name"]
    assert name == choice or (choice == "required" and name in ("weather", "time"))
    schema = WEATHER if name == "weather" else TOOLS[1]["function"]["parameters"]
    jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), schema)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["hermes", "llama3"])
def test_default_model_required_call_parses_and_validates(default_model_dir, fmt):
    """The real default model (whose template ignores tools: the tools go in the system text)
    under a "required" constraint stops with one call that validates."""
    from kvcli.engine.llm import LLM
    from kvcli.sampling_params import SamplingParams

    llm = LLM(str(default_model_dir))
    system = "You can call these tools:\n" + json.dumps(TOOLS)
    prompt = {"messages": [{"role": "system", "content": system},
                           {"role": "user", "content": "What is the weather in Paris?"}]}
    so = tool_constraint(TOOLS, "required", fmt, "tool_choice", "tools", parallel=False)
    out = llm.generate([prompt], SamplingParams(max_tokens=60, structured_outputs=so))[0]
    assert out.outputs[0].finish_reason == "stop", out.outputs[0].text
    check_calls(out.outputs[0].text, fmt, "required")
