"""Fuzz: hostile lines through the real `kvcli generate` pipeline never end the batch (issue 28.3).

Each example is a small batch of lines of every shape generate reads (plain, chat, OpenAI Batch
chat and completions, Anthropic Messages and batch lines, Responses bodies): valid ones, valid
ones with one value anywhere (or one field) replaced by a hostile one, and hostile values as
whole lines; hostile means random JSON of the wrong type, nesting past what any checker
recurses through, numbers past Python's 4,300-digit limit, lone surrogates, NaN, control and
bidi characters, template syntax. A good line goes in at a random place. The batch runs
through :func:`kvcli.batch.run.run_generate` on a tiny random model whose template teaches
Hermes tool calls (so ``tool_choice`` and ``response_format`` compile real grammars), loaded
once. Every run must end with exit 0 or 1 and no traceback, one result per line, the good line
a completion; ``--resume`` then finds every line done and changes nothing.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_structured_tools import hermes_model  # noqa: F401 - a fixture

from kvcli.batch.config import GenerateConfig
from kvcli.batch.run import load_engine, run_generate
from kvcli.engine.config import EngineConfig
from kvcli.sampling_params import SamplingParams

# Placeholders a line holds as strings, replaced in its JSON text by what json.dumps cannot
# write (or would write differently).
SPECIALS = {
    '"@huge-int"': "9" * 5000,
    '"@deep-array"': "[" * 900 + "]" * 900,
    '"@deep-object"': '{"a": ' * 400 + "1" + "}" * 400,
    '"@lone-surrogate"': '"\\ud800 fox"',
    '"@nan"': "NaN",
    # A schema as deep as orjson reads (1,024 levels): hypothesis raises the recursion limit
    # while a test runs, so only this depth still exhausts it.
    '"@deep-schema"': '{"type": "object", "properties": {"a": ' * 500 + '{"type": "string"}'
                      + "}}" * 500,
}


def _nested_schema(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


leaf = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
        | st.text(max_size=10) | st.sampled_from(["\x00", "\u202e\ufeff", "<|im_end|>",
                                                  "{{ x }}", "<tool_call>", ""]))
values = st.recursive(leaf, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=12)
# Deep, huge or not JSON at all: replaced in the line's text (see _line).
hostile = values | st.sampled_from([k.strip('"') for k in SPECIALS])

# ------------------------------------------------ valid lines of every shape
texts = st.text(min_size=1, max_size=30) | st.sampled_from(["The fox", "<tool_call>", "\u202e"])
schemas = st.sampled_from([
    {"type": "object"}, {"type": "string", "maxLength": 3}, {"enum": ["a", "b"]},
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {"type": "strin"}, {"not": {}}, {"$ref": "#/$defs/missing"}, {"pattern": "(("},
    _nested_schema(20), _nested_schema(40), _nested_schema(120)])
response_formats = st.builds(
    lambda s: {"type": "json_schema", "json_schema": {"name": "n", "schema": s}}, schemas) \
    | st.sampled_from([{"type": "json_object"}, {"type": "text"}])
functions = st.builds(lambda n, p: {"type": "function", "function": {"name": n, "parameters": p}},
                      st.sampled_from(["f", "weather"]), schemas)
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]),
                                           "content": texts}), min_size=1, max_size=3)
sampling = {"max_tokens": st.integers(1, 4), "temperature": st.floats(0, 2),
            "n": st.integers(1, 2), "stop": st.lists(st.text(min_size=1, max_size=3), max_size=2),
            "seed": st.integers(0, 2**32), "top_k": st.integers(-1, 5),
            "logprobs": st.integers(0, 3), "cache_salt": st.text(min_size=1, max_size=5),
            "response_format": response_formats}
chat = {"tools": st.lists(functions, min_size=1, max_size=2),
        "tool_choice": st.sampled_from(["auto", "required", "none",
                                        {"type": "function", "function": {"name": "f"}}]),
        "parallel_tool_calls": st.booleans()}
ids = st.text(min_size=1, max_size=8)


def _with(fields: dict[str, Any], **optional: Any) -> Any:
    extra = {k: v for k, v in {**sampling, **optional}.items() if k not in fields}
    return st.fixed_dictionaries(fields, optional=extra)


def _batch(url: str, body: Any) -> Any:
    return st.fixed_dictionaries({"custom_id": ids, "method": st.just("POST"),
                                  "url": st.just(url), "body": body})


chat_sampling = {k: v for k, v in sampling.items() if k != "logprobs"}
valid_lines = st.one_of(
    _with({"prompt": texts}, id=ids, model=st.just("tiny-hermes")),
    _with({"messages": messages}, **chat, id=ids),
    _batch("/v1/chat/completions", st.fixed_dictionaries({"messages": messages}, optional={
        **chat, **chat_sampling, "logprobs": st.booleans(), "top_logprobs": st.integers(0, 3),
        "model": st.sampled_from(["tiny-hermes", "gpt-4o-mini"])})),
    _batch("/v1/completions", _with({"prompt": texts})),
    st.fixed_dictionaries({"custom_id": ids, "params": st.fixed_dictionaries(
        {"messages": messages, "max_tokens": st.integers(1, 3)},
        optional={"system": texts, "model": st.just("claude")})}),
    st.fixed_dictionaries({"system": texts, "messages": messages},
                          optional={"max_tokens": st.integers(1, 3)}),
    st.fixed_dictionaries({"input": texts | messages},
                          optional={"instructions": texts, "max_output_tokens": st.integers(1, 3)}),
)


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a line a value sits (the line itself excluded)."""
    items = value.items() if isinstance(value, dict) else enumerate(value) \
        if isinstance(value, list) else ()
    return [p for key, sub in items for p in [(*path, key), *_paths(sub, (*path, key))]]


@st.composite
def mutants(draw: Any) -> Any:
    """A valid line with one value anywhere in it (or one field) replaced by a hostile one."""
    line = copy.deepcopy(draw(valid_lines))  # the strategies' own schemas stay as they are
    paths = _paths(line)
    if not paths:
        return line
    *parent_path, key = draw(st.sampled_from(paths))
    parent = line
    for part in parent_path:
        parent = parent[part]
    parent[key] = draw(hostile)
    return line


lines = st.one_of(valid_lines, mutants(), mutants(), hostile)
GOOD = {"id": "fuzz-good", "prompt": "Once upon a time", "max_tokens": 2}
_DEEP = "@deep-schema"
KNOWN = [
    {"id": "deep", "prompt": "x", "response_format": {
        "type": "json_schema", "json_schema": {"name": "n", "schema": _DEEP}}},
    {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required",
     "tools": [{"type": "function", "function": {"name": "f", "parameters": _DEEP}}]},
    {"custom_id": "r", "method": "POST", "url": "/v1/responses", "body": {"model": "m"}},
]


def _line(value: Any) -> bytes:
    text = json.dumps(value, ensure_ascii=False)  # NaN never: floats are finite above
    for placeholder, raw in SPECIALS.items():
        text = text.replace(placeholder, raw)
    return text.encode("utf-8", "surrogatepass").replace(b"\n", b" ").replace(b"\r", b" ")


@pytest.fixture(scope="module")
def engine(hermes_model):  # noqa: F811 - the fixture
    return load_engine(GenerateConfig(input="-", engine=EngineConfig(
        model=str(hermes_model), block_size=4, num_blocks=512, max_num_seqs=16)))


def _run(engine: Any, inp: Path, out: Path, resume: bool = False) -> tuple[int, str]:
    cfg = GenerateConfig(input=str(inp), output=str(out), ordered=True, resume=resume,
                         quiet=True, max_pending=8, sampling=SamplingParams(max_tokens=3),
                         engine=EngineConfig(model="tiny-hermes"))
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = run_generate(cfg, lambda _cfg: engine)
    return code, stderr.getvalue()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.data_too_large])
@given(batch=st.lists(lines, min_size=1, max_size=4), good_at=st.integers(0, 4))
@example(batch=KNOWN, good_at=1)  # what took whole batches down before (issue 28)
def test_fuzz_no_line_ends_the_batch(engine, batch, good_at):
    data = [_line(v) for v in batch]
    data.insert(min(good_at, len(data)), json.dumps(GOOD).encode())
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = Path(tmp) / "in.jsonl", Path(tmp) / "out.jsonl"
        inp.write_bytes(b"".join(d + b"\n" for d in data))
        code, stderr = _run(engine, inp, out)
        assert code in (0, 1) and "Traceback" not in stderr, stderr
        results = [json.loads(line) for line in out.read_bytes().splitlines()]
        assert len(results) == len(data), stderr
        good = [r for r in results if r.get("id") == "fuzz-good"]
        assert good and all("error" not in r and r["usage"]["completion_tokens"] >= 1
                            for r in good), good
        written = out.read_bytes()
        code, stderr = _run(engine, inp, out, resume=True)
        assert code == 0 and out.read_bytes() == written, stderr
