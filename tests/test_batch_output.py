"""Result line formatting: plain and OpenAI Batch shapes, n > 1, token ids, logprobs, failures."""

from __future__ import annotations

import json

from batch_fakes import FakeTokenizer

from kvcli.batch.output import ResultFormatter, dumps_line, engine_failure
from kvcli.batch.records import FailedLine, LineError, LineId, LineRequest, PromptSpec, Style
from kvcli.engine.outputs import CompletionOutput, RequestOutput
from kvcli.sampling_params import SamplingParams

TOK = FakeTokenizer()
FMT = ResultFormatter("tiny", TOK)
FMT_IDS = ResultFormatter("tiny", TOK, include_token_ids=True)


def request(style: Style = Style.PLAIN, key: str = "q1", field: str | None = "id",
            **params: object) -> LineRequest:
    return LineRequest(LineId(4, key, field), style, PromptSpec(text="x"), SamplingParams(**params))


def output(*texts: str, cached: int = 2, reason: str = "stop",
           logprobs: bool = False) -> RequestOutput:
    outs = []
    for i, text in enumerate(texts):
        ids = TOK.encode(text, add_special_tokens=False)
        lps = [{t: -0.5, t + 1: -0.1, t + 2: -2.0} for t in ids] if logprobs else None
        outs.append(CompletionOutput(i, text, ids, reason, lps))
    return RequestOutput("0", [1, 10, 11, 12], outs, cached)


def line(data: bytes) -> dict:
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    return json.loads(data)


def test_plain_result_shape() -> None:
    res = line(FMT.success(request(), output("hi there")))
    assert res == {"id": "q1", "text": "hi there", "finish_reason": "stop",
                   "usage": {"prompt_tokens": 4, "completion_tokens": 8, "cached_tokens": 2}}


def test_plain_custom_id_is_echoed_and_token_ids_added() -> None:
    res = line(FMT_IDS.success(request(field="custom_id"), output("ab", reason="length")))
    assert res["id"] == res["custom_id"] == "q1" and res["finish_reason"] == "length"
    assert res["token_ids"] == TOK.encode("ab", add_special_tokens=False)
    assert res["prompt_token_ids"] == [1, 10, 11, 12]


def test_plain_n_gives_choices() -> None:
    res = line(FMT_IDS.success(request(n=2), output("a", "bc")))
    assert [c["text"] for c in res["choices"]] == ["a", "bc"]
    assert [c["index"] for c in res["choices"]] == [0, 1]
    assert res["choices"][1]["token_ids"] == TOK.encode("bc", add_special_tokens=False)
    assert res["usage"]["completion_tokens"] == 3 and "text" not in res


def test_plain_logprobs() -> None:
    res = line(FMT.success(request(logprobs=1), output("a", logprobs=True)))
    tok = ord("a") + 3
    assert res["logprobs"] == [{"token_id": tok, "token": "a", "logprob": -0.5,
                                "top_logprobs": [{"token_id": tok + 1, "token": "b",
                                                  "logprob": -0.1}]}]


def test_openai_chat_result() -> None:
    res = line(FMT.success(request(Style.CHAT, "r1", "custom_id", n=2), output("A", "B")))
    assert res["custom_id"] == "r1" and res["error"] is None and res["id"].startswith("batch_req_")
    resp = res["response"]
    assert resp["status_code"] == 200 and resp["request_id"]
    body = resp["body"]
    assert body["object"] == "chat.completion" and body["model"] == "tiny"
    assert body["id"].startswith("chatcmpl-") and isinstance(body["created"], int)
    assert [c["message"] for c in body["choices"]] == [{"role": "assistant", "content": "A"},
                                                       {"role": "assistant", "content": "B"}]
    assert body["choices"][0]["finish_reason"] == "stop" and body["choices"][0]["logprobs"] is None
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6,
                             "prompt_tokens_details": {"cached_tokens": 2}}


def test_openai_chat_logprobs_shape() -> None:
    res = line(FMT.success(request(Style.CHAT, logprobs=2), output("a", logprobs=True)))
    content = res["response"]["body"]["choices"][0]["logprobs"]["content"]
    assert content[0]["token"] == "a" and content[0]["logprob"] == -0.5
    assert content[0]["bytes"] == [ord("a")]
    assert [t["token"] for t in content[0]["top_logprobs"]] == ["b", "a"]


def test_openai_completion_result_and_logprobs() -> None:
    res = line(FMT_IDS.success(request(Style.COMPLETION, logprobs=1), output("ab", logprobs=True)))
    body = res["response"]["body"]
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    choice = body["choices"][0]
    assert choice["text"] == "ab" and choice["token_ids"] == TOK.encode("ab", False)
    assert choice["logprobs"]["tokens"] == ["a", "b"]
    assert choice["logprobs"]["token_logprobs"] == [-0.5, -0.5]
    assert choice["logprobs"]["top_logprobs"] == [{"b": -0.1}, {"c": -0.1}]
    assert choice["logprobs"]["text_offset"] == [0, 1]
    assert body["prompt_token_ids"] == [1, 10, 11, 12]


def failed(style: Style | None, field: str | None = "id") -> dict:
    err = LineError("max_tokens", "expected an integer >= 1, got 'ten'")
    return line(FMT.failure(FailedLine(LineId(8, "k", field), style, err)))


def test_failure_shapes() -> None:
    err = {"code": "invalid_request", "param": "max_tokens", "line": 8,
           "message": "max_tokens: expected an integer >= 1, got 'ten'"}
    assert failed(Style.PLAIN) == {"id": "k", "error": err}
    assert failed(Style.PLAIN, "custom_id") == {"id": "k", "custom_id": "k", "error": err}
    openai = failed(Style.CHAT, "custom_id")
    assert openai["custom_id"] == "k" and openai["response"] is None and openai["error"] == err
    assert failed(None) == {"id": "k", "custom_id": "k", "response": None, "error": err}


def test_engine_failure_detection() -> None:
    req = request()
    assert engine_failure(req, output("a")) is None
    bad = output("a")
    bad.error = "out of memory"
    assert engine_failure(req, bad).error.code == "engine_error"
    assert engine_failure(req, output("a", reason="error")).describe == "generation failed"


def test_lone_surrogates_still_give_one_valid_line() -> None:
    data = dumps_line({"text": "a\ud800b"})
    assert json.loads(data) == {"text": "a\ud800b"} and data.count(b"\n") == 1
