"""Messages and numbers that must not mislead (issue 28, items 15, 17, 18, 19): every claim a
report or an error makes is checked against what kvcli did, with real processes where the exit
status is the claim."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner
from test_audit_support import SYSTEM, TOOLS, chat, system, user, write_jsonl

from kvcli.audit.auditor import Summary
from kvcli.audit.profiles import get_profile
from kvcli.audit.report_text import summary_lines
from kvcli.audit.style import Style
from kvcli.batch.summary import format_summary
from kvcli.cli import main
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
    lines = [{"custom_id": "e", "method": "POST", "url": "/v1/moderations", "body": {"input": "x"}},
             {"custom_id": "r", "method": "POST", "url": "/v1/responses",
              "body": {"input": "x", "max_output_tokens": 2}}]
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(x) + "\n" for x in lines))
    res = CliRunner().invoke(main, ["generate", str(inp), "--model", str(tiny_models["llama"]),
                                    "-q"], catch_exceptions=False)
    assert res.exit_code == 1
    out = {r["custom_id"]: r for r in map(json.loads, res.stdout.splitlines())}
    message = out["e"]["error"]["message"]
    assert message == ("url: unsupported endpoint '/v1/moderations'; kvcli generate accepts "
                       "/v1/chat/completions, /v1/completions, /v1/responses and /v1/embeddings")
    assert out["r"]["response"]["body"]["object"] == "response"  # listed, and answered


# ---- 17: the summary's counters add up ------------------------------------------------------
PREFIX = "Caching the keys and values of a shared prompt prefix saves a great deal of work. "


def _lines(tmp_path: Path, n: int, count: int = 8) -> Path:
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": f"r{i}", "prompt": PREFIX * 2 + f"Fox {i} ran",
                                       "n": n, "max_tokens": 8 + i % 3}) + "\n"
                           for i in range(count)))
    return inp


def _adds_up(stats: dict, out: Path) -> None:
    """The invariants of kvcli/batch/summary.py, against the output file itself."""
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert stats["prompt_tokens"] == sum(r["usage"]["prompt_tokens"] for r in rows[-stats["ok"]:])
    prefill = stats["prefill_tokens_computed"] + stats["prefill_tokens_skipped"]
    assert prefill == (stats["sequence_prompt_tokens"] + stats["prefill_tokens_recomputed"]
                       + stats["prefill_tokens_unwritten"])


def _generate(tiny_models, inp: Path, out: Path, *extra: str) -> dict:
    stats = out.with_suffix(".stats.json")
    res = CliRunner().invoke(main, ["generate", str(inp), "-o", str(out), "--model",
                                    str(tiny_models["llama"]), "--ignore-eos", "--stats",
                                    str(stats), *extra], catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    summary = json.loads(stats.read_text())
    _adds_up(summary, out)
    line = next(x for x in res.stderr.splitlines() if x.startswith("  prefill"))
    total = summary["prefill_tokens_computed"] + summary["prefill_tokens_skipped"]
    assert f"= {total:,}: {summary['sequence_prompt_tokens']:,} of the written" in line
    return summary


def test_counters_add_up_with_n_samples_and_preemption(tiny_models, tmp_path) -> None:
    plain = _generate(tiny_models, _lines(tmp_path, 2), tmp_path / "a.jsonl")
    assert plain["sequences"] == 16 and plain["sequence_prompt_tokens"] == 2 * plain["prompt_tokens"]
    assert plain["prefill_tokens_recomputed"] == plain["prefill_tokens_unwritten"] == 0
    tiny = _generate(tiny_models, _lines(tmp_path, 2), tmp_path / "b.jsonl", "--num-blocks", "8")
    assert tiny["preemptions"] > 0 and tiny["prefill_tokens_recomputed"] > 0
    one = _generate(tiny_models, _lines(tmp_path, 1), tmp_path / "c.jsonl")
    assert one["prefill_tokens_skipped"] == one["cached_tokens"]  # n = 1: the same tokens
    assert one["prefill_tokens_computed"] + one["cached_tokens"] == one["prompt_tokens"]


def test_counters_add_up_after_an_interrupt_and_on_resume(tiny_models, tmp_path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    stats = tmp_path / "stats.json"
    args = [sys.executable, "-m", "kvcli", "generate", str(inp), "-o", str(out), "--model",
            str(tiny_models["llama"]), "--ignore-eos", "--max-tokens", "200", "--stats",
            str(stats), "--max-num-seqs", "4"]
    lines = [json.dumps({"id": f"r{i}", "prompt": PREFIX + f"Fox {i}", "n": 2,
                         "max_tokens": 40 + 20 * (i % 4)}) for i in range(40)]
    inp.write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen(args, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            stderr=subprocess.PIPE)
    end = time.monotonic() + 300
    while not (out.exists() and out.read_bytes().count(b"\n") >= 3):
        assert proc.poll() is None and time.monotonic() < end, proc.stderr.read()
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    first = json.loads(stats.read_text())
    _adds_up(first, out)
    assert first["prefill_tokens_unwritten"] > 0  # the requests running at the interrupt
    done = subprocess.run([*args, "--resume"], env={**os.environ, "OMP_NUM_THREADS": "1"},
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr
    second = json.loads(stats.read_text())
    _adds_up(second, out)
    assert second["skipped"] == first["ok"] and first["ok"] + second["ok"] == 40
    assert second["prefill_tokens_unwritten"] == 0


# ---- 15: a flag the machine cannot meet names the flag and the cause -----------------------
def _refused(tiny_models, tmp_path, *flags: str) -> str:
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"prompt": "hi"}\n')
    res = kvcli("generate", str(inp), "--model", str(tiny_models["llama"]), "-q", *flags)
    err = res.stderr.decode()
    assert res.returncode == 2 and "Traceback" not in err, err
    assert "cannot load model" not in err, err  # the model is fine: the flag is the cause
    return err.strip()


def test_kv_cache_memory_beyond_the_machine_names_both_sizes(tiny_models, tmp_path) -> None:
    from kvcli.batch.resources import gib, machine_memory

    err = _refused(tiny_models, tmp_path, "--kv-cache-memory", "1024TiB")
    assert err == (f"kvcli generate: --kv-cache-memory 1,048,576 GiB is more than this "
                   f"machine's memory ({gib(machine_memory())}); give a smaller SIZE")


def test_unknown_and_unavailable_devices(tiny_models, tmp_path) -> None:
    import torch

    assert _refused(tiny_models, tmp_path, "--device", "tpu") == (
        "kvcli generate: --device tpu: unknown device; use cpu or cuda (cuda:N for one GPU)")
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        err = _refused(tiny_models, tmp_path, "--device", f"cuda:{count}")
        assert f"this machine has {count} CUDA device" in err
        return
    err = _refused(tiny_models, tmp_path, "--device", "cuda")
    if not torch.backends.cuda.is_built():
        assert err.startswith("kvcli generate: --device cuda: this torch build has no CUDA")
    else:
        assert err.startswith("kvcli generate: --device cuda: no CUDA device is visible")


# ---- 19: what the README promises ----------------------------------------------------------
SAMPLE = Path(__file__).resolve().parents[1] / "samples" / "openai_batch.jsonl"


def test_deterministic_ids_make_openai_files_byte_identical(tiny_models, tmp_path) -> None:
    def run(name: str, *flags: str) -> bytes:
        out = tmp_path / name
        res = CliRunner().invoke(main, ["generate", str(SAMPLE), "--model",
                                        str(tiny_models["llama"]), "-o", str(out), "--ordered",
                                        "-q", "--max-tokens", "8", *flags],
                                 catch_exceptions=False)
        assert res.exit_code == 0, res.stderr
        return out.read_bytes()

    a, b = run("a", "--deterministic-ids"), run("b", "--deterministic-ids")
    assert a == b
    rows = [json.loads(x) for x in a.splitlines()]
    ids = [r["id"] for r in rows] + [r["response"]["body"]["id"] for r in rows]
    assert len(set(ids)) == len(ids) and all(r["response"]["body"]["created"] == 0 for r in rows)
    random_ids = run("c")
    assert random_ids != a  # the default: random ids, the time
    strip = lambda data: [json.loads(x)["response"]["body"]["choices"] for x in data.splitlines()]  # noqa: E731
    assert strip(random_ids) == strip(a)  # what is identical either way


def test_stop_reason_is_null_for_an_eos_stop_as_in_vllm() -> None:
    from kvcli.engine.request import Request
    from kvcli.engine.stop import reported_stop_reason
    from kvcli.sampling_params import SamplingParams

    def stopped(reason, **params) -> object:
        req = Request("r", [1, 2], SamplingParams(**params), eos_token_ids=(2,))
        req.stop_reason = reason
        return reported_stop_reason(req)

    assert stopped(2) is None  # the end-of-sequence token (vLLM: None)
    assert stopped(2, stop_token_ids=[2]) is None  # EOS is checked first, as vLLM's check_stop
    assert stopped(2, ignore_eos=True, stop_token_ids=[2]) == 2
    assert stopped(7, stop_token_ids=[7]) == 7 and stopped("END", stop=["END"]) == "END"


def test_context_overflow_names_clamp_max_tokens(tiny_models, tmp_path) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"id": "big", "prompt": "hi", "max_tokens": 100000}\n')
    def run(*flags: str):
        return CliRunner().invoke(main, ["generate", str(inp), "--model",
                                         str(tiny_models["llama"]), "-q", *flags],
                                  catch_exceptions=False)

    res = run()
    assert res.exit_code == 1
    message = json.loads(res.stdout)["error"]["message"]
    assert message.startswith("max_tokens: 100000 new tokens after the ")
    assert "(--clamp-max-tokens caps it there instead)" in message
    clamped = run("--clamp-max-tokens", "--ignore-eos")
    assert clamped.exit_code == 0 and json.loads(clamped.stdout)["finish_reason"] == "length"


def test_usage_errors_read_like_every_other_message(tmp_path) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"prompt": "hi"}\n')
    for args, words in ((["generate", str(inp), "--max-line-bytes", "3Q"], "--max-line-bytes"),
                        (["generate", str(inp), "--workers", "2"], "--workers needs --ray"),
                        (["generate", str(tmp_path / "none.jsonl")], "cannot read")):
        res = kvcli(*args)
        err = res.stderr.decode()
        assert res.returncode == 2 and words in err, err
        assert err.startswith("kvcli generate: ") and "Error:" not in err, err
