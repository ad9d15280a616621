"""Structured outputs where the model itself decides whether to reason (Qwen3's own template
with thinking on: the prompt ends at ``<|im_start|>assistant\\n``): the first token may be the
grammar's or ``<think>``; after ``<think>`` the reasoning is free and the grammar starts after
``</think>``, otherwise the grammar covers the whole reply. Forced both ways with logit_bias."""

from __future__ import annotations

import copy
import json
import math
import shutil
from typing import Any, NamedTuple

import jsonschema
import pytest
import torch
from openai.types.chat import ChatCompletion
from test_batch_parse import chat_line, ok
from test_reasoning import SCHEMA, _run, thinking_model  # noqa: F401  (a fixture)

from kvcli.batch.encode import PromptEncoder
from kvcli.batch.records import LineError
from kvcli.engine.llm import LLM
from kvcli.engine.request import Request
from kvcli.engine.structured_decoding import allow_token
from kvcli.reasoning import PARSERS
from kvcli.sampling_params import SamplingParams
from kvcli.structured import StructuredOutputsParams

# Qwen3's own template, cut down: no <think> in the generation prompt unless thinking is off
# (then an empty block); <tool_call> in its tools section (the hermes format).
QWEN3_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\nReply with <tool_call>\\n{\"name\": ..., \"arguments\": ...}\\n"
    "</tool_call><|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)
JSON = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
TOOL = {"type": "function", "function": {"name": "alarm", "parameters": SCHEMA}}


class Model(NamedTuple):
    path: Any
    tok: Any
    think: int
    end: int
    word: int  # a token a reasoning may hold and the answer's grammar never allows

    def params(self, think_bias: float, **kw: Any) -> SamplingParams:
        """A constrained request as generate makes it, forced to reason or not (and then to
        close it soon: ``word`` and </think> as likely; the grammar masks both in the answer)."""
        return SamplingParams(max_tokens=40, structured_outputs=JSON, **kw,
                              structured_after=[self.end], structured_opener=self.think,
                              logit_bias={self.think: think_bias, self.word: 100.0, self.end: 100.0})


@pytest.fixture(scope="module")
def qwen3(thinking_model, tmp_path_factory):  # noqa: F811
    """The thinking model's weights and tokens (<think>, </think> single added tokens) with
    QWEN3_TEMPLATE."""
    src, tok = thinking_model
    path = tmp_path_factory.mktemp("qwen3_own")
    shutil.copytree(src, path, dirs_exist_ok=True)
    tok = copy.deepcopy(tok)
    tok.chat_template = QWEN3_TEMPLATE
    tok.save_pretrained(path)
    ids = [tok.convert_tokens_to_ids(t) for t in ("<think>", "</think>")]
    return Model(path, tok, *ids, tok.encode("fox")[0])


@pytest.fixture(scope="module")
def llm(qwen3):
    return LLM(str(qwen3.path), block_size=4)


def _allowed(logits: torch.Tensor, row: int) -> set[int]:
    return set(torch.nonzero(logits[row] > -math.inf).flatten().tolist())


def test_allow_token_sets_the_sign_bit_word_too():
    import xgrammar as xgr

    for token in (0, 31, 32, 63):
        bitmask = torch.zeros_like(xgr.allocate_token_bitmask(1, 64))
        allow_token(bitmask, 0, token)
        logits = torch.zeros(1, 64)
        xgr.apply_token_bitmask_inplace(logits, bitmask)
        assert _allowed(logits, 0) == {token}


def test_the_first_token_decides_where_the_grammar_starts(qwen3, llm):
    """First token: the grammar's first tokens and <think>. After <think>: free until
    </think>, then the grammar from its start; after a grammar token: the grammar goes on.
    A matcher out of step (a recomputed request) is rebuilt from the output tokens."""
    tok, think, end, word = qwen3.tok, qwen3.think, qwen3.end, qwen3.word
    engine = llm.engine
    params = SamplingParams(structured_outputs=JSON)
    grammar = engine._grammar(params).result()
    brace = tok.encode("{", add_special_tokens=False)[0]

    def masked(*output: int, opener: int | None = think) -> set[int]:
        """The mask after ``output``, from a new matcher: rebuilt from the tokens."""
        req = Request("r", [5], params)
        engine.structured.add("r", grammar, [end] if opener else None, opener)
        for token in output:
            req.append_output_token(token)
        logits = torch.zeros(1, engine.vocab_size)
        engine.structured.mask(logits, [req])
        return _allowed(logits, 0)

    plain, plain_after_brace = masked(opener=None), masked(brace, opener=None)
    assert think not in plain and brace in plain
    assert masked() == plain | {think}
    everything = set(range(engine.vocab_size))
    assert masked(think) == masked(think, word, brace) == everything  # the reasoning is free
    assert masked(think, word, end) == plain and masked(think, end, brace) == plain_after_brace
    assert masked(brace) == plain_after_brace  # no reasoning: the whole reply is the grammar
    engine.structured.forget("r")


def test_samples_choose_apart_and_logprobs_see_both_choices(qwen3, llm):
    """n > 1: each sample makes its own choice; the first token's logprobs are of the grammar's
    first token ("{": no whitespace) and <think> only, their mass 1."""
    brace = qwen3.tok.encode("{", add_special_tokens=False)[0]
    prompt = qwen3.tok.encode("The quick brown fox jumps", add_special_tokens=False)
    out = llm.generate([prompt], qwen3.params(-2, temperature=1.0, seed=3, n=6, logprobs=3))[0]
    assert {c.token_ids[0] for c in out.outputs} == {brace, qwen3.think}, "pick another seed"
    first = out.outputs[0].logprobs[0]
    assert set(first) == {brace, qwen3.think}
    assert sum(math.exp(v) for v in first.values()) == pytest.approx(1, abs=1e-5)
    for c in out.outputs:
        answer = c.text if c.token_ids[0] == brace else c.text.partition("</think>")[2]
        assert c.finish_reason == "stop" and json.loads(answer) in ({"urgent": True},
                                                                  {"urgent": False})


@pytest.mark.parametrize("config", [dict(enable_prefix_caching=False),
                                    dict(num_blocks=20, max_num_batched_tokens=32)])
def test_both_branches_survive_preemption_and_caching(qwen3, config):
    """Greedy and seeded rows, n > 1, both branches: the same tokens with a pool that
    preempts (recomputes) and prefix caching as without; every finished answer validates."""
    m, tok = qwen3, qwen3.tok
    prompts = [tok.encode("The quick brown fox jumps over the lazy dog " * k)[:12 + 5 * k]
               for k in range(1, 5)]
    params = [m.params(100, temperature=1.0, seed=1, n=2), m.params(-100),
              m.params(100, temperature=1.0, seed=2),
              m.params(-100, temperature=0.9, seed=4, n=2)]
    llms = [LLM(str(m.path), block_size=4, **c) for c in (dict(enable_prefix_caching=True), config)]
    runs = [llm.generate(prompts, params) for llm in llms]
    assert llms[1].engine.stats()["preemptions"] > 0 or "num_blocks" not in config
    assert [[c.token_ids for c in o.outputs] for o in runs[0]] \
        == [[c.token_ids for c in o.outputs] for o in runs[1]]
    stopped = {True: 0, False: 0}  # answers that ended by their grammar, by branch
    for c in (c for out in runs[0] for c in out.outputs):
        opened = c.token_ids[0] == m.think
        answer = c.token_ids[c.token_ids.index(m.end) + 1:] if opened else c.token_ids
        if c.finish_reason == "stop":
            stopped[opened] += 1
            jsonschema.validate(json.loads(tok.decode(answer, skip_special_tokens=True)), SCHEMA)
    assert all(stopped.values()), stopped


def test_generate_follows_the_models_choice(qwen3):
    """Through generate: the think branch's reasoning is free (a token no JSON object starts
    with) and its answer validates; the other branch is all answer and validates; a tool call
    required after reasoning is parsed from the answer; thinking off needs no choice."""
    m, tok = qwen3, qwen3.tok
    user = [{"role": "user", "content": "Is the fox late?"}]
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}}
    bias = {str(m.word): 100, str(m.end): 100}

    def line(cid, think_bias, **body):
        return chat_line({"messages": user, "max_tokens": 60, "temperature": 1.0, "seed": 4,
                          "logit_bias": {str(m.think): think_bias, **bias}, **body},
                         custom_id=cid)
    tight = {"json": SCHEMA, "disable_any_whitespace": True}  # no run into max_tokens
    blank = [t for t in range(len(tok)) if not tok.decode([t]).strip()]  # nor for tool calls
    lines = [line("think", 100, response_format=fmt, logprobs=True),
             line("answer", -100, structured_outputs=tight, n=2),
             line("greedy", -100, structured_outputs=tight, temperature=0),
             line("tool", 100, tools=[TOOL], tool_choice="required", max_tokens=100, logit_bias={
                 str(m.think): 100, **bias, **{str(t): -100 for t in blank}}),
             line("off", 100, structured_outputs=tight,
                  chat_template_kwargs={"enable_thinking": False})]
    res, out = _run(m.path, lines)
    assert res.exit_code == 0, res.stderr
    body = {k: v["response"]["body"] for k, v in out.items()}
    think = body["think"]["choices"][0]
    assert think["token_ids"][0] == m.think and m.end in think["token_ids"], "pick another seed"
    cut = think["token_ids"].index(m.end) + 1
    msg = ChatCompletion.model_validate(body["think"]).choices[0].message
    reasoning = msg.model_extra["reasoning_content"]
    assert reasoning == msg.model_extra["reasoning"] == tok.decode(think["token_ids"][1:cut - 1])
    assert tok.decode([m.word]) in reasoning  # a token no JSON object starts with
    jsonschema.validate(json.loads(msg.content), SCHEMA)
    assert think["logprobs"]["content"][0]["logprob"] == pytest.approx(0, abs=1e-4)
    assert body["think"]["usage"]["completion_tokens_details"]["reasoning_tokens"] == cut
    for cid in ("answer", "greedy", "off"):
        for choice in body[cid]["choices"]:
            assert choice["token_ids"][0] != m.think and choice["message"]["reasoning"] is None
            assert choice["finish_reason"] == "stop"
            assert choice["message"]["content"] == tok.decode(choice["token_ids"], skip_special_tokens=True)
            jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)
    tool = body["tool"]["choices"][0]
    assert tool["token_ids"][0] == m.think and tool["message"]["reasoning"] is not None
    assert tool["finish_reason"] == "tool_calls", tool
    call = tool["message"]["tool_calls"][0]["function"]
    assert call["name"] == "alarm" and set(json.loads(call["arguments"])) == {"urgent"}


class _Tokenizer:
    """Qwen3's prompt end; <think> one token (7), </think> (8), <think> shown or skipped."""

    def __init__(self, shown: bool) -> None:
        self.shown = shown

    def apply_chat_template(self, messages, **kw):
        return "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"

    def encode(self, text, add_special_tokens=False):
        return {"<think>": [7], "</think>": [8]}.get(text, [1, 2, 3])

    def decode(self, ids):
        return "<think>" if self.shown and list(ids) == [7] else ""


def test_think_must_be_one_token_the_text_shows():
    """The choice is offered only where the reply's text shows <think> (the split reads the
    text): a special <think>, skipped in the text, keeps the line's error."""
    body = {"messages": [{"role": "user", "content": "Hi"}], "response_format": {
        "type": "json_object"}}
    for shown in (True, False):
        req = ok(chat_line(body))
        encoder = PromptEncoder(_Tokenizer(shown), 64, 10, reasoning=PARSERS["qwen3"])
        if shown:
            assert encoder.encode_line(req) == [1, 2, 3]
            assert (req.params.structured_opener, req.params.structured_after) == (7, [8])
            continue
        with pytest.raises(LineError, match=r"one token its text shows \(shown as ''\)"):
            encoder.encode_line(req)
