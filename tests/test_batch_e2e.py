"""`kvcli generate` with a real (tiny, random-weight) model: the CLI's results are the engine's.

Every input format is checked against ``LLM.generate`` on the token ids the CLI should have
built (BOS for plain text, the chat template without BOS for messages); a run killed with
SIGKILL and resumed equals a clean run, sampled requests included (seeds derive from ids).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvcli.batch.fields import derive_seed
from kvcli.cli import main
from kvcli.engine.llm import LLM
from kvcli.sampling_params import SamplingParams

MSGS = [{"role": "system", "content": "You are a fox who lives by the river."},
        {"role": "user", "content": "What is the capital of France?"}]
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {}}}]


@pytest.fixture(scope="module")
def model_dir(tiny_models) -> Path:
    return tiny_models["llama"]


@pytest.fixture(scope="module")
def llm(model_dir) -> LLM:
    return LLM(str(model_dir))


def generate(*args: str, input: str | None = None):
    res = CliRunner().invoke(main, ["generate", *args], input=input, catch_exceptions=False)
    return res, [json.loads(line) for line in res.stdout.splitlines()]


def jsonl(objs: list) -> str:
    return "".join(json.dumps(o) + "\n" for o in objs)


def test_every_input_format_matches_the_engine(model_dir, llm) -> None:
    lines = [
        {"id": "plain", "prompt": "Once upon a time there was", "max_tokens": 8},
        {"id": "chat", "messages": MSGS, "tools": TOOLS, "max_tokens": 6},
        {"id": "ids", "prompt_token_ids": [5, 17, 99, 200], "max_tokens": 5},
        {"id": "sampled", "prompt": "The quick brown fox", "temperature": 1.0, "n": 2,
         "max_tokens": 7},
        {"custom_id": "oa-chat", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": MSGS, "max_completion_tokens": 6, "logprobs": True,
                  "top_logprobs": 2}},
        {"custom_id": "oa-cmpl", "method": "POST", "url": "/v1/completions",
         "body": {"prompt": "Every morning the fox", "max_tokens": 6, "temperature": 0.8,
                  "seed": 5}},
    ]
    res, rows = generate("-", "--model", str(model_dir), "--token-ids", "--ordered", "-q",
                         input=jsonl(lines))
    assert res.exit_code == 0, res.stderr
    tok = llm.engine.tokenizer
    chat_ids = tok.encode(tok.apply_chat_template(MSGS, TOOLS), add_special_tokens=False)
    expected_prompts = [
        tok.encode("Once upon a time there was", add_special_tokens=True), chat_ids,
        [5, 17, 99, 200], tok.encode("The quick brown fox", add_special_tokens=True),
        tok.encode(tok.apply_chat_template(MSGS), add_special_tokens=False),
        tok.encode("Every morning the fox", add_special_tokens=True),
    ]
    params = [SamplingParams(max_tokens=8), SamplingParams(max_tokens=6),
              SamplingParams(max_tokens=5),
              SamplingParams(max_tokens=7, temperature=1.0, n=2,
                             seed=derive_seed(0, "sampled")),
              SamplingParams(max_tokens=6, logprobs=2),
              SamplingParams(max_tokens=6, temperature=0.8, seed=5)]
    for p in params:
        if p.seed is None:
            p.seed = 0  # greedy: the seed does not matter
    want = llm.generate([list(p) for p in expected_prompts], params)
    plain_rows = rows[:4]
    for row, ids, out in zip(plain_rows, expected_prompts[:4], want[:4], strict=True):
        assert row["prompt_token_ids"] == ids
        choices = row.get("choices", [row])
        assert [c["token_ids"] for c in choices] == [c.token_ids for c in out.outputs]
        assert [c["text"] for c in choices] == [c.text for c in out.outputs]
    for row, ids, out in zip(rows[4:], expected_prompts[4:], want[4:], strict=True):
        body = row["response"]["body"]
        assert body["prompt_token_ids"] == ids
        assert body["choices"][0]["token_ids"] == out.outputs[0].token_ids
    chat_choice = rows[4]["response"]["body"]["choices"][0]
    assert chat_choice["message"]["content"] == want[4].outputs[0].text
    assert len(chat_choice["logprobs"]["content"]) == len(want[4].outputs[0].token_ids)
    assert rows[5]["response"]["body"]["choices"][0]["text"] == want[5].outputs[0].text


def test_plain_prompt_gets_bos_like_transformers(stories_dir) -> None:
    golden = json.loads((stories_dir / "golden.json").read_text())["cases"]
    case = next(c for c in golden if c["prompt"])
    res, rows = generate("-", "--model", str(stories_dir), "--token-ids", "-q",
                         "--max-tokens", "8", "--ignore-eos",
                         input=jsonl([{"prompt": case["prompt"]}]))
    assert res.exit_code == 0, res.stderr
    assert rows[0]["prompt_token_ids"] == case["prompt_ids"] and case["prompt_ids"][0] == 1
    assert rows[0]["token_ids"] == case["output_ids"][:8]  # greedy, checked against llama2.c


def test_shared_prefix_hits_cache_and_summary_agrees(model_dir, tmp_path) -> None:
    system = {"role": "system", "content": "Caching the keys and values of a shared prompt "
              "prefix saves a great deal of work when many requests begin with the same "
              "system prompt and the same instructions. " * 3}
    lines = [{"id": f"u{i}", "messages": [system, {"role": "user", "content": q}], "max_tokens": 4}
             for i, q in enumerate(["Hello?", "What is the weather like today?", "Numbers?",
                                    "Who is the fox?"])]
    stats = tmp_path / "stats.json"
    res, rows = generate("-", "--model", str(model_dir), "--max-num-seqs", "1", "--ordered",
                         "--stats", str(stats), input=jsonl(lines))
    assert res.exit_code == 0, res.stderr
    cached = [r["usage"]["cached_tokens"] for r in rows]
    assert cached[0] == 0 and all(c >= 64 for c in cached[1:])
    summary = json.loads(stats.read_text())
    assert summary["cached_tokens"] == sum(cached) == summary["prefill_tokens_skipped"]
    assert summary["prompt_tokens"] == sum(r["usage"]["prompt_tokens"] for r in rows)
    assert summary["prefill_tokens_computed"] == summary["prompt_tokens"] - sum(cached)
    assert "prefix-cache hit rate" in res.stderr


def test_model_limits_become_line_errors(model_dir) -> None:
    lines = [{"prompt": "fox " * 600}, {"prompt_token_ids": [1, 10_000]}, {"prompt": "ok",
                                                                          "max_tokens": 2}]
    res, rows = generate("-", "--model", str(model_dir), input=jsonl(lines))
    assert res.exit_code == 1
    by_id = {r["id"]: r for r in rows}
    assert by_id["line-1"]["error"]["code"] == "context_length_exceeded"
    assert by_id["line-2"]["error"]["param"] == "prompt_token_ids[1]"
    assert by_id["line-3"]["usage"]["completion_tokens"] == 2
    assert "-:1: prompt:" not in res.stderr and "stdin:1: prompt: " in res.stderr


def test_unknown_model_is_a_usage_error(tmp_path) -> None:
    res, _ = generate("-", "--model", str(tmp_path / "nope"), input='{"prompt": "a"}\n')
    assert res.exit_code == 2 and "cannot load model" in res.stderr


def _canonical(path: Path) -> list[str]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for r in rows:
        r["usage"].pop("cached_tokens")  # depends on what ran before, not on the result
    return sorted(json.dumps(r, sort_keys=True) for r in rows)


def test_sigkill_then_resume_equals_clean_run(model_dir, tmp_path) -> None:
    prompts = [{"id": f"r{i}", "prompt": f"The fox number {i} walked to the river and",
                "temperature": 1.0 if i % 2 else 0.0} for i in range(40)]
    inp = tmp_path / "in.jsonl"
    inp.write_text(jsonl(prompts))
    out = tmp_path / "out.jsonl"
    args = [sys.executable, "-m", "kvcli", "generate", str(inp), "-o", str(out), "--model",
            str(model_dir), "--max-tokens", "24", "--ignore-eos", "--max-num-seqs", "4",
            "--max-pending", "4", "--token-ids", "-q"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(args, env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not (out.exists() and out.read_bytes().count(b"\n") >= 6):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=120)
    written = out.read_bytes().count(b"\n")
    assert 6 <= written < 40
    done = subprocess.run([*args, "--resume"], env=env, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    clean = tmp_path / "clean.jsonl"
    res, _ = generate(args[4], "-o", str(clean), *args[7:])
    assert res.exit_code == 0, res.stderr
    assert _canonical(out) == _canonical(clean)
