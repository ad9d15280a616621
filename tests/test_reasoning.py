"""Reasoning models: --reasoning-parser splits <think>…</think> from the answer (vLLM's parsers),
auto-detected from the chat template; chat_template_kwargs and earlier turns' reasoning reach
the template; a constrained line whose tokenizer spells <think> in pieces is its line's error."""

from __future__ import annotations

import copy
import json
import re

import jsonschema
import pytest
from click.testing import CliRunner
from openai.types.chat import ChatCompletion
from test_batch_parse import chat_line, fails, ok
from tiny_models import CHATML_TEMPLATE, SPECIAL_TOKENS, _config, train_tokenizer

from kvcli.cli import main
from kvcli.reasoning import PARSERS, detect, resolve

QWEN3, R1 = PARSERS["qwen3"], PARSERS["deepseek_r1"]
SCHEMA = {"type": "object", "properties": {"urgent": {"type": "boolean"}},
          "required": ["urgent"], "additionalProperties": False}

# A Qwen3 thinking-style template (as Qwen3-*-Thinking-2507 and QwQ: the generation prompt opens
# <think>; enable_thinking false gives Qwen3's empty block), rendering reasoning_content.
THINK_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.role == 'assistant' and message.reasoning_content %}"
    "{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{{- message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- else %}{{- '<think>\\n' }}{%- endif %}"
    "{%- endif %}"
)


@pytest.mark.parametrize("parser, inside, text, want", [
    (QWEN3, False, "<think>plan</think>\n\nAnswer", ("plan", "\n\nAnswer", True)),
    (QWEN3, False, "Just an answer", (None, "Just an answer", True)),
    (QWEN3, False, "<think>still thinking", ("still thinking", None, False)),
    (QWEN3, True, "plan</think>Answer", ("plan", "Answer", True)),
    (QWEN3, True, "plan</think>", ("plan", None, True)),
    (R1, False, "no markup at all", ("no markup at all", None, False)),
    (R1, False, "r</think>a", ("r", "a", True)),
    (R1, False, "<think>r</think>a", ("r", "a", True)),
])
def test_split(parser, inside, text, want):
    split = parser.split(text, parser.opens("x") or inside)
    assert (split.reasoning, split.content, split.closed) == want


def test_the_prompt_says_where_a_reply_starts():
    assert QWEN3.opens("<|im_start|>assistant\n<think>\n") is True
    assert R1.opens("<think>\n\n</think>\n\n") is False
    assert QWEN3.opens("<|im_start|>assistant\n") is False and R1.opens("Assistant:") is True


def test_auto_detects_from_the_template():
    assert detect(THINK_TEMPLATE) == "qwen3"
    assert detect("{{'<｜Assistant｜>'}}{% if add_generation_prompt %}<think>\n{% endif %}") \
        == "deepseek_r1"
    assert detect("{{ content.split('</think>')[-1] }}") == "qwen3"  # the generic form
    assert resolve("auto", CHATML_TEMPLATE) is None and resolve("auto", None) is None
    assert resolve("none", THINK_TEMPLATE) is None
    with pytest.raises(ValueError, match="--reasoning-parser"):
        resolve("granite9", None)


def test_auto_finds_nothing_in_the_default_models_template(default_model_dir):
    from kvcli.tokenizer import Tokenizer

    assert resolve("auto", Tokenizer.from_dir(default_model_dir).chat_template) is None


def test_chat_template_kwargs_are_read():
    req = ok(chat_line({"messages": [{"role": "user", "content": "Hi"}],
                        "chat_template_kwargs": {"enable_thinking": False}}))
    assert req.prompt.template_kwargs == {"enable_thinking": False}
    fails(chat_line({"messages": [{"role": "user", "content": "Hi"}],
                     "chat_template_kwargs": [1]}), "body.chat_template_kwargs")
    fails({"prompt": "x", "chat_template_kwargs": {}}, "chat_template_kwargs")


@pytest.fixture(scope="module")
def thinking_model(tmp_path_factory):
    """The tiny qwen3 model with <think> and </think> as tokens and THINK_TEMPLATE."""
    import torch
    from transformers import AutoModelForCausalLM

    tok = copy.deepcopy(train_tokenizer())
    tok.add_tokens(["<think>", "</think>"])
    tok.chat_template = THINK_TEMPLATE
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    torch.manual_seed(7)
    model = AutoModelForCausalLM.from_config(_config("qwen3", len(tok), ids), dtype=torch.float32)
    path = tmp_path_factory.mktemp("thinking")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path, tok


def _run(path, lines, *args):
    res = CliRunner().invoke(main, ["generate", "-", "--model", str(path), "-q", "--token-ids",
                                    *args], input="".join(json.dumps(x) + "\n" for x in lines),
                             catch_exceptions=False)
    return res, {r["custom_id"]: r for r in map(json.loads, res.stdout.splitlines())}


def test_generate_splits_reasoning(thinking_model):
    path, tok = thinking_model
    end, word = tok.convert_tokens_to_ids("</think>"), tok.encode("fox")[0]
    user = [{"role": "user", "content": "Where does the fox live?"}]
    history = [*user, {"role": "assistant", "content": "At the edge.",
                       "reasoning_content": "It said so."}, *user]

    def line(cid, **body):
        return chat_line({"messages": user, "max_tokens": 12, **body}, custom_id=cid)
    lines = [line("think", temperature=1.0, seed=3, allowed_token_ids=[word, end]),
             line("cut", max_tokens=3, allowed_token_ids=[word]),
             line("off", chat_template_kwargs={"enable_thinking": False},
                  response_format={"type": "json_object"}),
             line("constrained", max_tokens=40, logit_bias={str(end): 100},
                  response_format={"type": "json_schema", "json_schema": {
                      "name": "t", "schema": SCHEMA}}),
             chat_line({"messages": history, "max_tokens": 1}, custom_id="history"),
             chat_line({"messages": history[2:], "max_tokens": 1}, custom_id="short")]
    res, out = _run(path, lines)
    assert res.exit_code == 0, res.stderr
    body = {k: v["response"]["body"] for k, v in out.items() if v["response"]}

    think = body["think"]["choices"][0]
    ids = think["token_ids"]
    assert end in ids, "seed 3 should close the reasoning; pick another seed"
    cut_at = ids.index(end) + 1
    msg = ChatCompletion.model_validate(body["think"]).choices[0].message
    assert msg.model_extra["reasoning_content"] == msg.model_extra["reasoning"] \
        == tok.decode(ids[:cut_at - 1])
    assert msg.content == (tok.decode(ids[cut_at:]) or None)
    assert body["think"]["usage"]["completion_tokens_details"]["reasoning_tokens"] == cut_at

    cut = body["cut"]["choices"][0]
    assert cut["message"]["content"] is None and cut["finish_reason"] == "length"
    assert cut["message"]["reasoning"] == tok.decode([word] * 3)
    assert body["cut"]["usage"]["completion_tokens_details"]["reasoning_tokens"] == 3

    off = body["off"]["choices"][0]["message"]  # thinking off: all answer, grammar allowed
    assert off["reasoning_content"] is None and off["content"]
    assert body["off"]["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    # the grammar starts after </think> (forced first here): the answer follows the schema
    constrained = body["constrained"]["choices"][0]
    assert constrained["token_ids"][0] == end and constrained["message"]["reasoning"] == ""
    assert constrained["finish_reason"] == "stop"
    jsonschema.validate(json.loads(constrained["message"]["content"]), SCHEMA)
    assert end not in constrained["token_ids"][1:]  # the grammar, not the bias, decides
    # the earlier turn's reasoning is rendered: its tokens are prompt tokens
    assert body["history"]["usage"]["prompt_tokens"] > body["short"]["usage"]["prompt_tokens"] \
        + len(tok.encode("<|im_start|>assistant\nAt the edge.<|im_end|>\n"))


def test_reasoning_parser_none_keeps_the_reply_as_written(thinking_model):
    path, tok = thinking_model
    line = chat_line({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3},
                     custom_id="a")
    _, out = _run(path, [line], "--reasoning-parser", "none")
    body = out["a"]["response"]["body"]
    assert "reasoning_content" not in body["choices"][0]["message"]
    assert "completion_tokens_details" not in body["usage"]
    assert body["choices"][0]["message"]["content"] == tok.decode(body["choices"][0]["token_ids"])


def test_audit_renders_chat_template_kwargs_as_generate(thinking_model):
    from kvcli.audit.parse import to_request
    from kvcli.audit.template import render_with_template
    from kvcli.audit.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(model=str(thinking_model[0]))
    body = {"messages": [{"role": "user", "content": "Hi"}]}
    on = render_with_template(0, to_request(body, "f:1"), tokenizer).text
    off = render_with_template(0, to_request(
        {**body, "chat_template_kwargs": {"enable_thinking": False}}, "f:2"), tokenizer).text
    assert on.endswith("<think>\n") and off.endswith("<think>\n\n</think>\n\n")


def test_a_grammar_where_the_model_may_open_reasoning_itself_needs_think_as_one_token(tiny_models):
    """Where the model decides whether to write <think> (qwen3's own template), its first token
    chooses between the grammar and <think> (tests/test_reasoning_grammar.py): a tokenizer that
    spells <think> in several tokens cannot offer that choice, so the line is refused."""
    line = chat_line({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
                      "response_format": {"type": "json_object"}}, custom_id="c")
    res, out = _run(tiny_models["qwen2"], [line], "--reasoning-parser", "qwen3")
    assert res.exit_code == 1
    assert out["c"]["error"]["param"] == "body.response_format"
    message = out["c"]["error"]["message"]
    assert "<think> as one token" in message and re.search(r"\(\d+ tokens here\)", message)
    assert "enable_thinking" in message
