"""Chat logprobs' ``bytes`` are the token's own bytes, as OpenAI returns them (issue 16, bug 6).

A byte-level token that holds part of a UTF-8 character (``Â`` stands for byte 0xC2)
decodes alone to U+FFFD; its bytes used to be reported as that replacement character's
``[239, 191, 189]`` instead of ``[194]``.
"""

from __future__ import annotations

import json

import pytest

from kvcli.batch.output import ResultFormatter
from kvcli.batch.records import LineId, LineRequest, PromptSpec, Style
from kvcli.engine.outputs import CompletionOutput, RequestOutput
from kvcli.sampling_params import SamplingParams
from kvcli.tokenizer import Tokenizer


def chat_content(tok: Tokenizer, token_ids: list[int]) -> list[dict]:
    req = LineRequest(LineId(1, "r", "custom_id"), Style.CHAT, PromptSpec(text="x"),
                      SamplingParams(logprobs=1))
    entries = [{t: -0.5, token_ids[0]: -1.0} for t in token_ids]
    out = RequestOutput("0", [1], [CompletionOutput(0, "", token_ids, "stop", entries)], 0)
    line = json.loads(ResultFormatter("m", tok).success(req, out))
    return line["response"]["body"]["choices"][0]["logprobs"]["content"]


def test_byte_tokens_report_their_own_bytes(tiny_models) -> None:
    tok = Tokenizer.from_dir(tiny_models["llama"])
    half, other = tok.token_to_id("Â"), tok.encode("é", add_special_tokens=False)
    eos = tok.eos_token_ids[0]
    content = chat_content(tok, [half, *other, eos])
    assert content[0]["token"] == "\ufffd"  # the text of half a character, as decode gives it
    assert content[0]["bytes"] == [0xC2]
    assert content[0]["top_logprobs"][0]["bytes"] == [0xC2]
    # Bytes joined over the tokens are the text's UTF-8; a special token shows its text ("").
    assert b"".join(bytes(c["bytes"]) for c in content[1:-1]) == "é".encode()
    assert content[-1]["token"] == "" and content[-1]["bytes"] == []


@pytest.mark.slow
def test_default_model_token_141_is_byte_0xc2(default_model_dir) -> None:
    content = chat_content(Tokenizer.from_dir(default_model_dir), [141])
    assert content[0]["bytes"] == [194]  # was [239, 191, 189]
