"""OpenAI's ``logit_bias`` and vLLM's ``allowed_token_ids``: per-line fields, checked, applied by
the sampler to greedy, seeded and logprobs alike; lines without them are untouched."""

from __future__ import annotations

import json
import math

import pytest
import torch
from click.testing import CliRunner
from test_batch_parse import chat_line, fails, ok

from kvcli.cli import main
from kvcli.engine.sampler import Sampler
from kvcli.sampling_params import SamplingParams

MSGS = [{"role": "user", "content": "Pick a colour."}]


def test_logit_bias_keys_become_token_ids():
    req = ok(chat_line({"messages": MSGS, "logit_bias": {"17": 5, "3": -100}}))
    assert req.params.logit_bias == {17: 5.0, 3: -100.0}
    assert ok({"prompt": "x", "allowed_token_ids": [4, 9]}).params.allowed_token_ids == [4, 9]


@pytest.mark.parametrize("line, field", [
    (chat_line({"messages": MSGS, "logit_bias": {"17": 101}}), "body.logit_bias['17']"),
    (chat_line({"messages": MSGS, "logit_bias": {"17": "x"}}), "body.logit_bias['17']"),
    (chat_line({"messages": MSGS, "logit_bias": {"-3": 1}}), "body.logit_bias['-3']"),
    (chat_line({"messages": MSGS, "logit_bias": [1, 2]}), "body.logit_bias"),
    ({"prompt": "x", "allowed_token_ids": []}, "allowed_token_ids"),
    ({"prompt": "x", "allowed_token_ids": [1, -2]}, "allowed_token_ids[1]"),
    ({"prompt": "x", "allowed_token_ids": [1], "structured_outputs": {"regex": "a"}},
     "allowed_token_ids"),
])
def test_bad_values_are_the_lines_error(line, field):
    fails(line, field)


class _Req:  # the two attributes the sampler reads of a request without penalties
    def __init__(self, rid: str, params: SamplingParams) -> None:
        self.request_id, self.sampling_params = rid, params


def test_sampler_applies_them_to_greedy_seeded_and_logprobs():
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    plain = SamplingParams(logprobs=3)
    rows = [_Req("a", plain), _Req("b", SamplingParams(logit_bias={7: 100.0}, logprobs=2)),
            _Req("c", SamplingParams(allowed_token_ids=[5, 9], logprobs=5)),
            _Req("d", SamplingParams(temperature=1.0, seed=3, allowed_token_ids=[11, 12]))]
    before = logits.clone()
    out = Sampler()(logits, rows)
    assert torch.equal(logits, before)  # the model's logits are not changed in place
    assert out.token_ids[0] == int(before[0].argmax())
    assert out.logprobs[0] == Sampler()(before[:1], rows[:1]).logprobs[0]  # untouched row
    assert out.token_ids[1] == 7 and out.logprobs[1][7] > -1e-3  # +100: all the mass
    assert out.token_ids[2] in (5, 9) and set(out.logprobs[2]) == {5, 9}
    assert math.isclose(sum(math.exp(v) for v in out.logprobs[2].values()), 1, rel_tol=1e-5)
    assert out.token_ids[3] in (11, 12)


def generate(model, lines, *args):
    res = CliRunner().invoke(main, ["generate", "-", "--model", str(model), "-q", "--token-ids",
                                    *args], input="".join(json.dumps(x) + "\n" for x in lines),
                             catch_exceptions=False)
    return res, {r["custom_id"]: r for r in map(json.loads, res.stdout.splitlines())}


def test_generate_classifier_lines(tiny_models):
    """allowed_token_ids picks a label token; logit_bias forces one; an id beyond the vocabulary
    is that line's error naming the field; the unbiased line equals its run alone."""
    def line(cid, **extra):
        return chat_line({"messages": MSGS, "max_tokens": 4, **extra}, custom_id=cid)
    lines = [line("plain"), line("labels", allowed_token_ids=[40, 41], logprobs=True,
                                 top_logprobs=5),
             line("forced", logit_bias={"42": 100}), line("sampled", temperature=1.0, seed=5,
                                                          allowed_token_ids=[43, 44]),
             line("oov", logit_bias={"100000": 1})]
    model = tiny_models["qwen2"]
    res, out = generate(model, lines)
    assert res.exit_code == 1, res.stderr
    choice = lambda cid: out[cid]["response"]["body"]["choices"][0]  # noqa: E731
    assert set(choice("labels")["token_ids"]) <= {40, 41}
    for entry in choice("labels")["logprobs"]["content"]:
        assert len(entry["top_logprobs"]) == 2  # the other tokens are no alternative
    assert choice("forced")["token_ids"] == [42] * 4
    assert set(choice("sampled")["token_ids"]) <= {43, 44}
    assert out["oov"]["error"]["param"] == "body.logit_bias"
    assert "100000" in out["oov"]["error"]["message"]
    _, alone = generate(model, lines[:1])
    assert choice("plain")["token_ids"] == alone["plain"]["response"]["body"]["choices"][0][
        "token_ids"]
