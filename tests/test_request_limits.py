"""Limits of a request's numbers: integers past 64 bits, negative seeds, max_tokens past the context.

Issue 23 item 5: a huge integer used to be reported as "expected an integer, got 1.2e+30"
(orjson hands integers beyond 64 bits over as floats). Issue 16 bug 9: ``max_tokens: 100000``
ran to the context for minutes; it is now that line's error with the numbers, unless
``--clamp-max-tokens``, and the CLI's default never fails a line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from batch_fakes import FakeEngine
from click.testing import CliRunner

from kvcli.cli import main
from kvcli.engine.llm import LLM
from kvcli.sampling_params import SamplingParams

HUGE = "1267650600228229401496703205376"  # 2**100
INT64 = "[-9223372036854775808, 9223372036854775807]"


def generate(*args: str, input: str) -> tuple[int, str, list[dict]]:
    res = CliRunner().invoke(main, ["generate", "-", "--ordered", *args], input=input,
                             catch_exceptions=False)
    return res.exit_code, res.stderr, [json.loads(line) for line in res.stdout.splitlines()]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kvcli.batch.run.load_engine", lambda cfg: FakeEngine())


def test_huge_integers_are_out_of_range_with_the_range(fake) -> None:
    lines = (f'{{"id": "s", "prompt": "a", "seed": {HUGE}}}\n'
             f'{{"id": "t", "prompt": "a", "stop_token_ids": [7, {HUGE}]}}\n'
             f'{{"id": "m", "prompt": "a", "max_tokens": {HUGE}}}\n'
             '{"id": "big-int", "prompt": "a", "seed": 9223372036854775808}\n'
             '{"id": "neg", "prompt": "a", "seed": -9223372036854775808, "temperature": 0.8}\n')
    code, err, rows = generate(input=lines)
    assert code == 1
    by_id = {r["id"]: r for r in rows}
    seed = by_id["s"]["error"]
    assert seed["param"] == "seed"
    assert seed["message"] == f"seed: 1.2676506002282294e+30 is out of range: expected an integer in {INT64}"
    assert "expected an integer, got" not in err
    stop = by_id["t"]["error"]
    assert stop["param"] == "stop_token_ids[1]" and "is out of range: expected an integer in [0, " \
        "9223372036854775807]" in stop["message"]
    assert "max_tokens: 1.2676506002282294e+30 is out of range" in by_id["m"]["error"]["message"]
    assert "seed: 9223372036854775808 is out of range" in by_id["big-int"]["error"]["message"]
    assert "error" not in by_id["neg"]  # the smallest 64-bit seed is valid


def test_negative_seeds_are_valid_and_reproducible(tiny_models) -> None:
    llm = LLM(str(tiny_models["llama"]))
    params = [SamplingParams(max_tokens=12, temperature=1.0, seed=s) for s in (-7, -7, 7)]
    outs = [o.outputs[0].token_ids for o in llm.generate(["The fox"] * 3, params)]
    assert outs[0] == outs[1]  # a negative seed is a seed like any other
    assert outs[0] != outs[2]  # and not its absolute value


def test_run_seed_outside_64_bits_is_a_usage_error(fake) -> None:
    res = CliRunner().invoke(main, ["generate", "-", "--seed", str(1 << 64)], input='{"prompt": "a"}\n')
    assert res.exit_code == 2 and "--seed" in res.stderr


# ----------------------------------------------------------- max_tokens vs the context
@pytest.fixture(scope="module")
def model_dir(tiny_models) -> Path:
    return tiny_models["llama"]  # context 512


def test_engine_refuses_max_tokens_past_the_context_with_the_numbers(model_dir) -> None:
    engine = LLM(str(model_dir)).engine
    with pytest.raises(ValueError) as err:
        engine.add_request("r", [5] * 12, SamplingParams(max_tokens=100000))
    assert str(err.value) == ("max_tokens: 100000 new tokens after the 12-token prompt exceed the "
                              "model's context of 512 tokens; at most 500 fit")
    engine.add_request("fits", [5] * 12, SamplingParams(max_tokens=500))  # exactly the context
    engine.add_request("open", [5] * 12, SamplingParams(max_tokens=None, ignore_eos=True))
    done = {}
    while engine.has_unfinished():
        done.update({o.request_id: o for o in engine.step()})
    assert len(done["open"].outputs[0].token_ids) == 500  # None: until the context ends


def test_cli_max_tokens_error_default_fits_and_clamp_opt_in(model_dir) -> None:
    long_prompt = [7] * 400  # 400 + the default 256 > 512: the default must not fail it
    lines = "".join(json.dumps(o) + "\n" for o in [
        {"id": "huge", "prompt": "The fox", "max_tokens": 100000, "ignore_eos": True},
        {"id": "default", "prompt_token_ids": long_prompt, "ignore_eos": True},
        {"id": "null", "prompt_token_ids": long_prompt, "max_tokens": None, "ignore_eos": True},
    ])
    code, err, rows = generate("--model", str(model_dir), "-q", input=lines)
    assert code == 1
    huge, default, null = rows
    assert huge["error"]["param"] == "max_tokens"
    assert "100000 new tokens after the" in huge["error"]["message"]
    assert "exceed the model's context of 512 tokens" in huge["error"]["message"]
    assert "<stdin>:1" in err or "stdin:1" in err
    for row in (default, null):  # capped at what the prompt leaves: 112 tokens, "length"
        assert row["finish_reason"] == "length" and row["usage"]["completion_tokens"] == 112

    code, _, rows = generate("--model", str(model_dir), "-q", "--clamp-max-tokens",
                             "--max-tokens", "4", input=lines)
    assert code == 0
    huge, default, _ = rows
    assert huge["usage"]["completion_tokens"] == 512 - huge["usage"]["prompt_tokens"]
    assert default["usage"]["completion_tokens"] == 4  # --max-tokens still applies
