"""`kvcli perplexity` and the engine's prompt logprobs it stands on.

The perplexity of a tiny random model must equal one computed from transformers' own forward
pass over the same windows (float32 log-softmax), to 1e-4 relative, whatever the chunking of
the prefill; prompt logprobs follow vLLM's shape and never read prefix-cache hits.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from test_startup_signals import _stderr_is_clean, _wait_until_python_catches_sigint

from kvcli.batch.parse import ParseOptions, parse_line
from kvcli.batch.records import FailedLine
from kvcli.batch.source import RawLine
from kvcli.bench.perplexity import (
    PerplexityError,
    perplexity,
    read_text,
    scored_positions,
    summarize,
    window_starts,
    windows_of,
)
from kvcli.cli import main
from kvcli.engine.llm import LLM
from kvcli.engine.llm_engine import EngineConfig, LLMEngine
from kvcli.sampling_params import SamplingParams

TEXT_FILE = Path(__file__).parent / "data" / "perplexity" / "text.txt"
CONTEXT = 64


@pytest.fixture(scope="module")
def text() -> str:
    return TEXT_FILE.read_text(encoding="utf-8")[:2500]  # ~10 windows of 64 tiny-BPE tokens


def _engine(model_dir: Path, **kw) -> LLMEngine:
    return LLMEngine.from_config(EngineConfig(model=str(model_dir), quiet=True, **kw))


def _transformers_ppl(model_dir: Path, text: str, context: int) -> tuple[float, int]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    ids = tok(text, add_special_tokens=False)["input_ids"]
    nlls: list[float] = []
    for start in range(0, len(ids) - context + 1, context):
        window = torch.tensor([ids[start : start + context]])
        with torch.no_grad():
            logp = torch.log_softmax(model(window).logits[0].float(), dim=-1)
        nlls.extend(-logp[p - 1, window[0, p]].item() for p in range(context // 2 + 1, context))
    return math.exp(sum(nlls) / len(nlls)), len(nlls)


@pytest.mark.parametrize("budget", [1024, 40])  # whole windows per step / chunked prefill
def test_perplexity_equals_transformers_forward(tiny_models, text, budget) -> None:
    model_dir = tiny_models["llama"]
    result = perplexity(_engine(model_dir, max_num_batched_tokens=budget), text, CONTEXT)
    want, scored = _transformers_ppl(model_dir, text, CONTEXT)
    assert result.windows == result.text_tokens // CONTEXT >= 2
    assert result.tokens_scored == scored == result.windows * (CONTEXT - CONTEXT // 2 - 1)
    assert result.ppl == pytest.approx(want, rel=1e-4)
    assert result.ppl == pytest.approx(math.exp(result.mean_nll))
    assert 0 < result.ppl_error < result.ppl


def test_window_and_half_logic() -> None:
    assert window_starts(10, 4) == [0, 4]  # the tail of 2 tokens is dropped
    assert window_starts(8, 4) == [0, 4]
    assert scored_positions(512) == range(257, 512) and len(scored_positions(512)) == 255
    assert list(scored_positions(5)) == [3, 4]
    assert windows_of(list(range(9)), 4, None) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert windows_of(list(range(9)), 4, 99) == [[99, 1, 2, 3], [99, 5, 6, 7]]
    with pytest.raises(PerplexityError, match="3 tokens, fewer than one window of context 4"):
        window_starts(3, 4)
    with pytest.raises(PerplexityError, match="context: expected an integer >= 4"):
        window_starts(100, 3)


def test_summarize_is_llama_cpps_estimate() -> None:
    mean, ppl, error = summarize([1.0, 2.0, 3.0])
    assert mean == 2.0 and ppl == pytest.approx(math.e**2)
    # var = E[x^2] - mean^2 = 14/3 - 4; error = sqrt(var / (n - 1)) * ppl
    assert error == pytest.approx(math.sqrt((14 / 3 - 4) / 2) * math.e**2)
    with pytest.raises(PerplexityError, match="no token"):
        summarize([])
    with pytest.raises(PerplexityError, match="non-finite"):
        summarize([1.0, float("nan")])


def test_read_text_errors_name_the_file(tmp_path) -> None:
    with pytest.raises(PerplexityError, match="missing.txt: cannot read"):
        read_text(tmp_path / "missing.txt")
    blank = tmp_path / "blank.txt"
    blank.write_text(" \n\n")
    with pytest.raises(PerplexityError, match="blank.txt: the text is empty"):
        read_text(blank)
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"line one\ncaf\xe9\n")
    with pytest.raises(PerplexityError, match=r"latin.txt:2: not UTF-8"):
        read_text(latin)


def test_prompt_logprobs_shape_and_no_cache_reads(tiny_models) -> None:
    llm = LLM.from_engine(_engine(tiny_models["llama"], max_num_batched_tokens=16))
    prompt = list(range(5, 45))
    first, again = llm.generate([prompt, prompt], SamplingParams(max_tokens=2, prompt_logprobs=3))
    plain = llm.generate([prompt], SamplingParams(max_tokens=2))[0]
    lps = first.prompt_logprobs
    assert lps[0] is None and len(lps) == len(prompt)
    for i, entry in enumerate(lps[1:], start=1):
        assert prompt[i] in entry and 3 <= len(entry) <= 4
        assert max(entry.values()) <= 0 and math.fsum(math.exp(v) for v in entry.values()) <= 1
    assert again.num_cached_tokens == 0  # computed again, not read from the cache
    for got, want in zip(again.prompt_logprobs[1:], lps[1:], strict=True):  # other row batches:
        assert got.keys() == want.keys()  # float rounding only
        assert list(got.values()) == pytest.approx(list(want.values()), abs=1e-5)
    assert plain.prompt_logprobs is None and plain.num_cached_tokens > 0
    assert first.outputs[0].token_ids == plain.outputs[0].token_ids


def test_prompt_logprobs_validation_and_generate_refuses_it() -> None:
    with pytest.raises(ValueError, match=r"prompt_logprobs: .*\[0, 20\]"):
        SamplingParams(prompt_logprobs=21).validate()
    data = json.dumps({"prompt": "Hi", "prompt_logprobs": 1}).encode()
    res = parse_line(RawLine(3, data, len(data)), ParseOptions(SamplingParams()))
    assert isinstance(res, FailedLine) and res.error.field == "prompt_logprobs"
    assert "kvcli perplexity" in res.error.message


def test_cli_json_and_errors(tiny_models, tmp_path, text) -> None:
    model = str(tiny_models["llama"])
    path = tmp_path / "t.txt"
    path.write_text(text)
    runner = CliRunner()
    res = runner.invoke(main, ["perplexity", str(path), "--model", model, "--context", "64",
                               "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["quantization"] == "none" and doc["context"] == 64 and doc["ppl"] > 1
    res = runner.invoke(main, ["perplexity", str(path), "--model", model, "--context", "64",
                               "--quantization", "int8"])
    assert res.exit_code == 0, res.output
    assert "quantization int8" in res.stdout and "PPL = " in res.stdout
    short = tmp_path / "short.txt"
    short.write_text("A few words only.")
    res = runner.invoke(main, ["perplexity", str(short), "--model", model, "--context", "64"])
    assert res.exit_code == 1 and "fewer than one window of context 64" in res.output
    res = runner.invoke(main, ["perplexity", str(path), "--model", model])  # max length 512
    assert res.exit_code == 1 and "512 does not fit the model's 512-token context" in res.output
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    res = runner.invoke(main, ["perplexity", str(empty), "--model", model])
    assert res.exit_code == 2 and "empty.txt: the text is empty" in res.output


def test_prompt_logprobs_survive_preemption(tiny_models) -> None:
    """A preempted request computes its prompt again; its entries are neither doubled nor lost."""
    prompts = [list(range(5, 45)), list(range(50, 90))]
    params = SamplingParams(max_tokens=24, prompt_logprobs=0, ignore_eos=True)
    roomy = LLM.from_engine(_engine(tiny_models["llama"])).generate(prompts, params)
    tight = LLM.from_engine(_engine(tiny_models["llama"], num_blocks=6)).generate(prompts, params)
    assert sum(o.num_preemptions for o in tight) > 0
    for a, b in zip(roomy, tight, strict=True):
        assert len(b.prompt_logprobs) == len(a.prompt_logprobs) == 40
        for x, y in zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:], strict=True):
            assert x.keys() == y.keys() and list(x.values()) == pytest.approx(list(y.values()),
                                                                               abs=1e-5)


def test_ctrl_c_exits_130_without_a_traceback(tiny_models, tmp_path) -> None:
    long = tmp_path / "long.txt"
    long.write_text(TEXT_FILE.read_text(encoding="utf-8") * 20)  # ~1,000 windows: still running
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvcli", "perplexity", str(long), "--model",
         str(tiny_models["llama"]), "--context", "64"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_until_python_catches_sigint(proc.pid)
    time.sleep(1.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130 and _stderr_is_clean(err) and "PPL" not in out, err
