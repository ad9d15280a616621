"""Input line parsing: plain and OpenAI Batch lines -> requests, every bad line -> a named error."""

from __future__ import annotations

import json

import pytest
from batch_fakes import FakeEngine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcli.batch.encode import PromptEncoder
from kvcli.batch.fields import derive_seed
from kvcli.batch.parse import ParseOptions, parse_line
from kvcli.batch.records import FailedLine, LineError, LineRequest, PromptSpec, Style
from kvcli.batch.source import RawLine, iter_lines
from kvcli.sampling_params import SamplingParams

OPTS = ParseOptions(SamplingParams(max_tokens=32, temperature=0.5, stop=["\n\n"]), seed=7)


def parse(obj: object, line_no: int = 5, opts: ParseOptions = OPTS) -> LineRequest | FailedLine:
    data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return parse_line(RawLine(line_no, data, len(data)), opts)


def ok(obj: object, **kw: object) -> LineRequest:
    req = parse(obj, **kw)
    assert isinstance(req, LineRequest), req.describe
    return req


def fails(obj: object, field: str | None, code: str = "invalid_request", **kw: object) -> FailedLine:
    res = parse(obj, **kw)
    assert isinstance(res, FailedLine), f"expected an error for {obj!r}"
    assert res.error.field == field, res.describe
    assert res.error.code == code
    return res


# ------------------------------------------------------------------ plain lines
def test_plain_prompt_gets_line_number_id_and_cli_defaults() -> None:
    req = ok({"prompt": "Hello"}, line_no=17)
    assert req.ident.key == "line-17" and req.ident.field is None
    assert req.style is Style.PLAIN and req.prompt == PromptSpec(text="Hello", source="prompt")
    assert (req.params.max_tokens, req.params.temperature, req.params.stop) == (32, 0.5, ["\n\n"])
    assert req.params.stop is not OPTS.defaults.stop  # never shares the defaults' list


def test_line_fields_override_defaults() -> None:
    req = ok({"id": "q1", "prompt": "x", "max_tokens": 3, "temperature": 0, "stop": "END",
              "top_k": 5, "n": 2, "logprobs": 1, "ignore_eos": True, "seed": 11,
              "cache_salt": "tenant-a"})
    p = req.params
    assert (p.max_tokens, p.temperature, p.stop, p.top_k, p.n, p.logprobs, p.ignore_eos, p.seed) \
        == (3, 0, ["END"], 5, 2, 1, True, 11)
    assert req.ident.key == "q1" and req.ident.field == "id" and req.cache_salt == "tenant-a"


def test_missing_seed_is_derived_from_run_seed_and_id() -> None:
    a, b = ok({"id": "q1", "prompt": "x"}), ok({"id": "q2", "prompt": "x"})
    assert a.params.seed == derive_seed(7, "q1") != b.params.seed
    assert ok({"id": "q1", "prompt": "y"}, line_no=99).params.seed == a.params.seed


def test_null_means_default() -> None:
    req = ok({"prompt": "x", "max_tokens": None, "stop": None, "id": None})
    assert req.params.max_tokens == 32 and req.ident.key == "line-5"


def test_custom_id_on_plain_line_is_echoed() -> None:
    req = ok({"custom_id": "c9", "prompt": "x"})
    assert (req.ident.key, req.ident.field) == ("c9", "custom_id")
    assert ok({"custom_id": "c9", "id": "c9", "prompt": "x"}).ident.key == "c9"
    fails({"custom_id": "c9", "id": "other", "prompt": "x"}, "custom_id")


def test_messages_and_tools() -> None:
    msgs = [{"role": "system", "content": "S"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "t", "function": {"name": "f", "arguments": '{"x": 1}'}}]},
            {"role": "tool", "content": "r", "tool_call_id": "t"}]
    req = ok({"messages": msgs, "tools": [{"type": "function"}]})
    chat = req.prompt.chat()  # what the chat template sees
    assert chat[1]["content"] == "a\nb" and chat[2]["content"] == ""  # null -> "" (templates read it)
    assert chat[2]["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert req.prompt.messages[3]["tool_call_id"] == "t" and req.prompt.tools == [{"type": "function"}]


def test_prompt_token_ids() -> None:
    assert ok({"prompt_token_ids": [1, 5, 9]}).prompt.token_ids == [1, 5, 9]


@pytest.mark.parametrize("obj, field", [
    ({"prompt": "x", "max_tokens": "ten"}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 2.5}, "max_tokens"),
    ({"prompt": "x", "temperature": -1}, "temperature"),
    ({"prompt": "x", "top_p": 2}, "top_p"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "stop": [1]}, "stop"),
    ({"prompt": "x", "stop": {"a": 1}}, "stop"),
    ({"prompt": "x", "seed": "s"}, "seed"),
    ({"prompt": "x", "logprobs": 99}, "logprobs"),
    ({"prompt": "x", "ignore_eos": "yes"}, "ignore_eos"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": 42}, "prompt"),
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": ["hi"]}, "messages[0]"),
    ({"messages": [{"role": "bot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": "t"}, "tools"),
    ({"prompt": "x", "tools": [{}]}, "tools"),
    ({"prompt_token_ids": []}, "prompt_token_ids"),
    ({"prompt_token_ids": [1, -2]}, "prompt_token_ids[1]"),
    ({"prompt_token_ids": [1, True]}, "prompt_token_ids[1]"),
    ({}, "prompt"),
    ({"prompt": "x", "messages": [{"role": "user", "content": "y"}]}, "messages"),
    ({"prompt": "x", "id": 17}, "id"),
    ({"prompt": "x", "id": ""}, "id"),
    ({"prompt": "x", "cache_salt": 3}, "cache_salt"),
])
def test_bad_fields_name_the_field(obj: dict, field: str) -> None:
    fails(obj, field)


def test_bad_id_keeps_line_number_id() -> None:
    assert fails({"prompt": "x", "id": 17}, "id").ident.key == "line-5"


def test_error_message_is_clipped_for_huge_values() -> None:
    res = fails({"prompt": "x", "max_tokens": "9" * 100_000}, "max_tokens")
    assert len(res.describe) < 400


@pytest.mark.parametrize("data, code", [
    (b"{not json", "invalid_json"),
    (b"[1, 2]", "invalid_json"),
    (b"42", "invalid_json"),
    (b'"a string"', "invalid_json"),
    (b"null", "invalid_json"),
    (b'{"prompt": "\xff\xfe"}', "invalid_json"),  # invalid UTF-8
    (b"[" * 10_000 + b"]" * 10_000, "invalid_json"),  # 10,000-level nesting
    (b'{"prompt": "x"} trailing', "invalid_json"),
])
def test_unparseable_lines(data: bytes, code: str) -> None:
    res = fails(data, None, code)
    assert res.style is None and res.ident.key == "line-5"


def test_unknown_fields_ignored_then_strict_error() -> None:
    assert ok({"prompt": "x", "temprature": 1}).ignored_fields == ["temprature"]
    strict = ParseOptions(OPTS.defaults, strict=True)
    fails({"prompt": "x", "temprature": 1}, "temprature", opts=strict)


# ------------------------------------------------------------- OpenAI lines
def chat_line(body: dict, **top: object) -> dict:
    return {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": body, **top}


MSGS = [{"role": "user", "content": "Hi"}]


def test_openai_chat_body_mapping() -> None:
    req = ok(chat_line({"model": "gpt-x", "messages": MSGS, "max_tokens": 9, "temperature": 0.2,
                        "top_p": 0.9, "stop": ["a", "b"], "seed": 3, "n": 2, "logprobs": True,
                        "top_logprobs": 4, "user": "u", "tools": [{"type": "function"}]}))
    p = req.params
    assert req.style is Style.CHAT and req.ident.key == "r1" and req.ident.field == "custom_id"
    assert (p.max_tokens, p.temperature, p.top_p, p.stop, p.seed, p.n, p.logprobs) == \
        (9, 0.2, 0.9, ["a", "b"], 3, 2, 4)
    assert req.prompt.messages == MSGS and req.prompt.tools == [{"type": "function"}]
    assert req.ignored_fields == []


def test_openai_max_completion_tokens_wins_and_logprobs_without_top() -> None:
    req = ok(chat_line({"messages": MSGS, "max_tokens": 9, "max_completion_tokens": 4,
                        "logprobs": True}))
    assert req.params.max_tokens == 4 and req.params.logprobs == 0
    assert ok(chat_line({"messages": MSGS, "logprobs": False})).params.logprobs is None


def test_openai_completions() -> None:
    line = {"custom_id": "c", "method": "POST", "url": "/v1/completions",
            "body": {"prompt": "Once", "logprobs": 2, "max_tokens": 5, "echo": False}}
    req = ok(line)
    assert req.style is Style.COMPLETION and req.prompt.text == "Once"
    assert (req.params.logprobs, req.params.max_tokens) == (2, 5)
    line["body"] = {"prompt": [[1, 2, 3]]}
    assert ok(line).prompt.token_ids == [1, 2, 3]
    line["body"] = {"prompt": ["only one"]}
    assert ok(line).prompt.text == "only one"


@pytest.mark.parametrize("line, field, code", [
    (chat_line({"messages": MSGS}, url="/v1/moderations"), "url", "invalid_url"),
    (chat_line({"messages": MSGS}, method="GET"), "method", "invalid_request"),
    (chat_line("not an object"), "body", "invalid_request"),
    (chat_line({}), "body.messages", "invalid_request"),
    (chat_line({"messages": MSGS, "max_tokens": "ten"}), "body.max_tokens", "invalid_request"),
    (chat_line({"messages": MSGS, "temperature": -1}), "body.temperature", "invalid_request"),
    (chat_line({"messages": MSGS, "top_logprobs": 2}), "body.top_logprobs", "invalid_request"),
    (chat_line({"messages": MSGS, "logprobs": 3}), "body.logprobs", "invalid_request"),
    (chat_line({"messages": MSGS, "logprobs": True, "top_logprobs": 50}), "body.top_logprobs",
     "invalid_request"),
    (chat_line({"messages": MSGS, "stream": True}), "body.stream", "invalid_request"),
    (chat_line({"messages": [{"role": "x", "content": "y"}]}), "body.messages[0].role",
     "invalid_request"),
    ({"custom_id": "c", "url": "/v1/completions", "body": {"prompt": ["a", "b"]}}, "body.prompt",
     "invalid_request"),
    ({"custom_id": "c", "url": "/v1/completions", "body": {"prompt": ""}}, "body.prompt",
     "invalid_request"),
    ({"custom_id": "c", "url": "/v1/completions", "body": {"prompt": "a", "echo": True}},
     "body.echo", "invalid_request"),
    ({"custom_id": "c", "url": "/v1/completions", "body": {"prompt": "a", "suffix": "z"}},
     "body.suffix", "invalid_request"),
])
def test_openai_bad_lines(line: dict, field: str, code: str) -> None:
    res = fails(line, field, code)
    assert res.style in (Style.CHAT, Style.COMPLETION) and res.ident.key in ("r1", "c")


def test_openai_unknown_fields() -> None:
    req = ok(chat_line({"messages": MSGS, "frobnicate": {}}, extra=1))
    assert req.ignored_fields == ["extra", "body.frobnicate"]
    fails(chat_line({"messages": MSGS, "frobnicate": {}}), "body.frobnicate",
          opts=ParseOptions(strict=True))


@pytest.mark.parametrize("line, field", [
    (chat_line({"messages": MSGS, "response_format": {}}), "body.response_format.type"),
    (chat_line({"messages": MSGS, "response_format": {"type": "xml"}}), "body.response_format.type"),
    ({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {
        "schema": {"type": "strin"}}}}, "response_format.json_schema.schema.type"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "schema": {"required": 1}}}},
     "text.format.schema.required"),
])
def test_response_format_it_cannot_honour_is_that_lines_error(line: dict, field: str) -> None:
    """Never a silent 200 with unconstrained text (issue 16, bug 5)."""
    fails(line, field)


def test_response_format_is_the_lines_constraint() -> None:
    assert ok(chat_line({"messages": MSGS, "response_format": {"type": "text"}})).params \
        .structured_outputs is None
    ok({"prompt": "x", "response_format": {"type": "text"}})
    so = ok(chat_line({"messages": MSGS, "response_format": {"type": "json_object"}})).params \
        .structured_outputs
    assert (so.kind, so.path) == ("json_object", "body.response_format")
    flat = ok({"input": "x", "text": {"format": {"type": "json_schema", "name": "t",
                                                 "schema": {"type": "object"}}}})
    assert flat.params.structured_outputs.json == {"type": "object"}


def test_openai_line_without_custom_id_is_its_error() -> None:
    """vLLM's run-batch refuses it; an invented id would join the result to nothing. The error
    result keeps the line-number id, so --resume still recognises the line."""
    missing = fails(chat_line({"messages": MSGS}, custom_id=None), "custom_id", line_no=3)
    assert missing.ident.key == "line-3" and "needs a custom_id" in missing.describe
    other = fails(chat_line({"messages": MSGS}, custom_id=None, id="x"), "custom_id")
    assert "it has 'id'" in other.describe
    assert ok({"params": {"messages": MSGS, "max_tokens": 3}, "custom_id": "a"}).ident.key == "a"


# ----------------------------------------------------------------- encoding
ENGINE = FakeEngine(max_model_len=64)
ENCODER = PromptEncoder(ENGINE.tokenizer, ENGINE.max_model_len, ENGINE.vocab_size)


def test_encode_plain_adds_bos_chat_does_not() -> None:
    assert ENCODER.encode(PromptSpec(text="ab")) == [1, ord("a") + 3, ord("b") + 3]
    ids = ENCODER.encode(PromptSpec(messages=MSGS, tools=[{}], source="messages"))
    assert ENGINE.tokenizer.decode(ids) == "<tools>1\n<user>Hi\n<assistant>" and ids[0] != 1


@pytest.mark.parametrize("spec, field, code", [
    (PromptSpec(text="x" * 63), "prompt", "context_length_exceeded"),
    (PromptSpec(token_ids=[1, 259], source="body.prompt"), "body.prompt[1]", "invalid_request"),
    (PromptSpec(messages=[{"role": "user", "content": "TEMPLATE_FAIL"}], source="messages"),
     "messages", "invalid_request"),
])
def test_encode_errors(spec: PromptSpec, field: str, code: str) -> None:
    with pytest.raises(LineError) as info:
        ENCODER.encode(spec)
    assert (info.value.field, info.value.code) == (field, code)


def test_encode_fits_context_exactly() -> None:
    assert len(ENCODER.encode(PromptSpec(text="x" * 62))) == 63


# ------------------------------------------------------------------ reading
def test_iter_lines_skips_blank_keeps_numbers_strips_bom_and_crlf(tmp_path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"prompt": "a"}\r\n\n   \n{"prompt": "b"}')
    with open(path, "rb") as f:
        lines = list(iter_lines(f))
    assert [(r.line_no, r.data) for r in lines] == [(1, b'{"prompt": "a"}'), (4, b'{"prompt": "b"}')]
    assert isinstance(parse_line(lines[0], OPTS), LineRequest)


def test_oversized_line_is_skipped_unread(tmp_path) -> None:
    path = tmp_path / "in.jsonl"
    big = b'{"prompt": "' + b"x" * 5000 + b'"}'
    path.write_bytes(b'{"prompt": "a"}\n' + big + b'\n{"prompt": "b"}\n')
    with open(path, "rb") as f:
        lines = list(iter_lines(f, max_line_bytes=1000))
    assert [(r.line_no, r.data is None, r.size) for r in lines] == \
        [(1, False, 15), (2, True, len(big)), (3, False, 15)]
    res = parse_line(lines[1], ParseOptions(max_line_bytes=1000))
    assert isinstance(res, FailedLine) and res.error.code == "line_too_long"
    assert str(len(big)) in res.describe


def test_fifty_megabyte_line(tmp_path) -> None:
    path = tmp_path / "big.jsonl"
    with open(path, "wb") as f:
        f.write(b'{"prompt": "')
        chunk = b"a" * (1 << 20)
        for _ in range(50):
            f.write(chunk)
        f.write(b'"}\n{"prompt": "ok"}\n')
    with open(path, "rb") as f:
        lines = list(iter_lines(f))  # 16 MiB limit: the 50 MB line is skipped in 1 MiB reads
    assert [r.data is None for r in lines] == [True, False]
    assert isinstance(parse_line(lines[0], OPTS), FailedLine)


# --------------------------------------------------------------------- fuzz
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 300) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["prompt", "messages", "prompt_token_ids", "role", "content", "id",
                         "custom_id", "url", "body", "method", "max_tokens", "n", "stop", "tools",
                         "logprobs", "top_logprobs", "temperature", "type", "text", "seed"])
        | st.text(max_size=5), inner, max_size=5),
    max_leaves=20)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=200), _json_values.map(lambda v: json.dumps(v).encode())),
       st.booleans())
def test_fuzz_any_bytes_give_a_request_or_a_clean_error(data: bytes, strict: bool) -> None:
    res = parse_line(RawLine(3, data, len(data)), ParseOptions(strict=strict))
    assert isinstance(res, LineRequest | FailedLine)
    if isinstance(res, FailedLine):
        assert res.describe and res.error.code
    else:
        res.params.validate()
        try:
            ENCODER.encode(res.prompt)  # the second stage may only raise LineError
        except LineError:
            pass


def test_engine_errors_on_openai_lines_name_the_body_field() -> None:
    """A field the engine refuses (max_tokens past the context) is named where the line has it."""
    from kvcli.batch.job import BatchJob

    req = ok(chat_line({"messages": MSGS, "max_tokens": 5}))
    assert req.field_prefix == "body."
    failures = []
    job = BatchJob.__new__(BatchJob)
    job._fail = lambda seq, failed: failures.append(failed)  # type: ignore[method-assign]
    BatchJob._reject(job, 1, req, ValueError("max_tokens: 5 new tokens exceed the context"))
    assert failures[0].error.field == "body.max_tokens"
    assert ok({"prompt": "x"}).field_prefix == ""
