"""Messages and numbers that must not mislead (issue 28, items 15, 17, 18, 19): every claim a
report or an error makes is checked against what kvcli did, with real processes where the exit
status is the claim."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from test_audit_support import SYSTEM, TOOLS, chat, system, user, write_jsonl

from kvcli.audit.auditor import Summary
from kvcli.audit.profiles import get_profile
from kvcli.audit.report_text import summary_lines
from kvcli.audit.style import Style
from kvcli.batch.summary import format_summary
from kvcli.numbers import percent, plural


def kvcli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "kvcli", *args], input=stdin, env=env,
                          capture_output=True, timeout=300)


# ---- 18: one percent rule; the baseline's exit status and its report agree ----------------
def test_one_rounding_rule_for_generate_and_audit() -> None:
    assert percent(1792, 1837) == "97.6%"  # 97.5503...; rounding a rounded 0.9755 gave 97.5
    assert percent(1, 8) == "12.5%" and percent(1, 16) == "6.3%"  # half up, not to even
    assert percent(0, 0) == "0.0%" and percent(0.5) == "50.0%" and percent(12345, 100) == "12,345.0%"
    summary = {"ok": 3, "failed": 0, "skipped": 0, "wall_s": 1.0, "status": "completed",
               "prompt_tokens": 1837, "cached_tokens": 1792, "hit_rate": round(1792 / 1837, 4),
               "generated_tokens": 1, "generated_tok_s": 1.0}
    generate_text = format_summary(summary, "out.jsonl")
    audit = Summary(prompts=3, tokens=1837, cached_tokens=1792)
    audit_text = "\n".join(summary_lines("tok", get_profile("vllm"), audit, 0, Style()))
    assert "(97.6% prefix-cache hit rate)" in generate_text and "(97.6% hit rate)" in audit_text
    assert "generated     1 token," in generate_text  # not "1 tokens"


def test_plural() -> None:
    assert [plural(n, "request") for n in (0, 1, 2)] == ["0 requests", "1 request", "2 requests"]
    assert plural(1_000, "prefix", "prefixes") == "1,000 prefixes"


def _baseline_run(tmp_path: Path, after_tools: list) -> subprocess.CompletedProcess:
    rows = lambda tools: [chat([system(SYSTEM), user(f"Question {i}?")], tools, id=f"s-{i}")  # noqa: E731
                          for i in range(3)]
    lock = tmp_path / "kvcli-audit.lock"
    wrote = kvcli("audit", str(write_jsonl(tmp_path / "before.jsonl", rows(TOOLS))),
                  "--write-baseline", str(lock))
    assert wrote.returncode == 0, wrote.stderr
    return kvcli("audit", str(write_jsonl(tmp_path / "after.jsonl", rows(after_tools))),
                 "--baseline", str(lock), "--fail-on", "never")


def test_baseline_failure_is_not_reported_as_no_findings(tmp_path: Path) -> None:
    moved = _baseline_run(tmp_path, TOOLS[::-1])
    out = moved.stdout.decode()
    assert moved.returncode == 1, moved.stderr
    assert "No findings:" not in out
    assert "the --baseline check failed: 3 stable prefixes moved" in out and "exit status 1" in out
    same = _baseline_run(tmp_path, TOOLS)
    assert same.returncode == 0 and "No findings: every prompt reuses" in same.stdout.decode()


def test_cacheability_says_what_it_bounds(tmp_path: Path) -> None:
    res = kvcli("audit", str(write_jsonl(tmp_path / "p.jsonl", [
        chat([system(SYSTEM), user(f"Question {i}?")], TOOLS) for i in range(3)])))
    line = next(x for x in res.stdout.decode().splitlines() if "cacheability" in x)
    assert "hit rate this input can reach from an empty cache" in line
    assert "--kv-cache-dir" in line  # what can exceed it


def test_refused_endpoint_lists_exactly_what_generate_accepts(tiny_models, tmp_path) -> None:
    lines = [{"custom_id": "e", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}},
             {"custom_id": "r", "method": "POST", "url": "/v1/responses", "body": {"input": "x"}}]
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(x) + "\n" for x in lines))
    res = kvcli("generate", str(inp), "--model", str(tiny_models["llama"]), "-q")
    assert res.returncode == 1
    errors = [json.loads(x)["error"]["message"] for x in res.stdout.splitlines()]
    accepted = "kvcli generate accepts /v1/chat/completions and /v1/completions"
    assert all(accepted in m and "supported: " not in m for m in errors), errors
    assert errors[0].startswith("url: unsupported endpoint '/v1/embeddings'")
    assert "give a Responses body as a plain line" in errors[1]
