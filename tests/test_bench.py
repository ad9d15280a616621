"""`kvcli bench`: workload shapes, the report's numbers and schema, the CLI's exit codes.

The end-to-end runs use a tiny random Llama (2 layers) with a small --scale so every
system finishes in well under a second per run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from tiny_models import make_tiny_model

from kvcli.bench.measure import RssTracker, percentile
from kvcli.bench.report import format_table
from kvcli.bench.runner import TimedRun, run_workload, system_entry
from kvcli.bench.systems import RunResult
from kvcli.bench.workloads import DEFAULT_NEW_TOKENS, WORKLOAD_NAMES, Workload, build_workload
from kvcli.cli import main
from kvcli.hashing import hash_token_blocks

SMALL = ["--num-prompts", "3", "--max-tokens", "3", "--scale", "0.1", "--threads", "1"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_tiny_model("llama", tmp_path_factory.mktemp("bench") / "llama")


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from kvcli.tokenizer import Tokenizer

    return Tokenizer.from_dir(model_dir)


def invoke(*args: str):
    return CliRunner().invoke(main, ["bench", *args], catch_exceptions=False)


# ------------------------------------------------------------------ workloads
@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_workloads_are_deterministic(tokenizer, name):
    a = build_workload(name, tokenizer, num_prompts=5, seed=7)
    b = build_workload(name, tokenizer, num_prompts=5, seed=7)
    c = build_workload(name, tokenizer, num_prompts=5, seed=8)
    assert a.prompts == b.prompts and a.sessions == b.sessions
    assert a.prompts != c.prompts
    assert a.max_new_tokens == DEFAULT_NEW_TOKENS[name]
    assert all(isinstance(t, int) for p in a.prompts for t in p)


def test_shared_prefix_shares_one_system_prompt(tokenizer):
    w = build_workload("shared-prefix", tokenizer, num_prompts=6)
    common = len(os.path.commonprefix(w.prompts))
    assert 400 <= common <= 440  # ~400 tokens of system prompt plus the template's header
    assert len({tuple(p) for p in w.prompts}) == 6
    for p in w.prompts:
        assert 40 <= len(p) - common <= 100  # the distinct question (+ template tokens)
    first = hash_token_blocks(w.prompts[0])[: common // 16]
    assert all(hash_token_blocks(p)[: common // 16] == first for p in w.prompts)


def test_chat_sessions_are_append_only(tokenizer):
    w = build_workload("chat-sessions", tokenizer, num_prompts=10)
    assert len(w.prompts) == 10
    assert [len(s) for s in w.sessions] == [4, 3, 3]
    assert sorted(i for s in w.sessions for i in s) == list(range(10))
    for session in w.sessions:
        for prev, cur in zip(session, session[1:], strict=False):
            assert prev < cur  # turn-major order keeps turns in order
            shorter, longer = w.prompts[prev], w.prompts[cur]
            assert longer[: len(shorter)] == shorter and len(longer) > len(shorter) + 40
    firsts = [w.prompts[s[0]] for s in w.sessions]
    # Each session has its own system prompt: they share only its opening words.
    assert len(os.path.commonprefix(firsts)) < 32


def test_distinct_prompts_share_no_block_and_mix_lengths(tokenizer):
    w = build_workload("distinct", tokenizer, num_prompts=12)
    lengths = [len(p) for p in w.prompts]
    assert min(lengths) >= 40 and max(lengths) <= 560 and max(lengths) - min(lengths) > 150
    first_blocks = [hash_token_blocks(p)[0] for p in w.prompts]
    assert len(set(first_blocks)) == len(first_blocks)


def test_decode_1_is_one_short_request(tokenizer):
    w = build_workload("decode-1", tokenizer, num_prompts=9)
    assert len(w.prompts) == 1 and len(w.prompts[0]) < 100 and w.max_new_tokens == 128


def test_bad_workload_arguments(tokenizer):
    with pytest.raises(ValueError, match="workload: expected one of"):
        build_workload("nope", tokenizer)
    with pytest.raises(ValueError, match="scale: expected > 0"):
        build_workload("distinct", tokenizer, scale=0)


# ---------------------------------------------------------------- aggregation
def _timed(wall: float, outputs: list[list[int]]) -> TimedRun:
    return TimedRun(RunResult(outputs, prefill_tokens_computed=10, ttfts=[0.1, 0.3, 0.2]),
                    wall, 100.0, 5.0)


def test_system_entry_reports_best_median_and_matches():
    w = Workload("x", "d", [[1, 2], [3]], 2)
    ref = [[5, 6], [7, 8]]
    entry = system_entry("peer", [_timed(4.0, [[5, 6], [7, 9]]), _timed(2.0, [[5, 6], [7, 9]]),
                                  _timed(3.0, ref)], w, ref)
    assert entry["wall_s"] == 2.0 and entry["wall_s_median"] == 3.0
    assert entry["wall_s_runs"] == [4.0, 2.0, 3.0]
    assert entry["output_tok_s"] == 2.0 and entry["total_tok_s"] == 3.5  # (3 + 4) / 2
    assert entry["outputs_matching"] == 1 and entry["outputs_match"] is False
    assert entry["ttft_p50_s"] == 0.2 and entry["ttft_p90_s"] == 0.3


class _Scripted:
    def __init__(self, name: str, calls: list[str]) -> None:
        self.name, self.calls = name, calls

    def run(self, prompts, max_new_tokens):
        self.calls.append(self.name)
        return RunResult([[1] * max_new_tokens for _ in prompts], 0, [0.0])


class _Prepared(_Scripted):
    def prepare(self, prompts, max_new_tokens):
        self.calls.append(f"prepare {self.name} {len(prompts)}x{max_new_tokens}")


def test_run_workload_alternates_and_computes_speedups():
    calls: list[str] = []
    systems = [_Prepared("kvcli", calls), _Scripted("hf-generate", calls)]
    doc = run_workload(Workload("x", "d", [[1], [2]], 3), systems, 3, lambda m: None)
    warmup = ["prepare kvcli 2x3", "kvcli", "hf-generate"]  # sized untimed, before warm-up
    assert calls == warmup + ["kvcli", "hf-generate", "hf-generate", "kvcli", "kvcli",
                              "hf-generate"]
    assert [e["name"] for e in doc["systems"]] == ["kvcli", "hf-generate"]
    kv, hf = doc["systems"]
    assert doc["speedup"]["hf-generate"] > 0 and set(doc["speedup"]) == {"hf-generate"}
    assert hf["outputs_match"] is True and hf["generated_tokens"] == 6
    assert doc["float32_gflops_start"] > 0 and doc["float32_gflops_end"] > 0  # machine speed
    machine = {"processor": "x", "cpu_count": 2, "threads": 2, "torch": "t", "transformers": "t"}
    assert "float32 GEMM" in format_table({**doc, "machine": machine, "model": "m"})


class _Broken(_Scripted):
    """A peer whose server stops answering at its second timed run."""

    def run(self, prompts, max_new_tokens):
        if self.calls.count(self.name) == 2:
            raise ConnectionError("server gone")
        return super().run(prompts, max_new_tokens)


class _NoStart(_Prepared):
    def prepare(self, prompts, max_new_tokens):
        raise RuntimeError("llama-server did not start")


def test_a_failing_peer_becomes_its_rows_error_and_the_others_still_run():
    calls: list[str] = []
    systems = [_Scripted("kvcli", calls), _Broken("vllm", calls), _NoStart("llamacpp", calls),
               _Scripted("openvino", calls)]
    messages: list[str] = []
    doc = run_workload(Workload("x", "d", [[1], [2]], 3), systems, 3, messages.append)
    assert "llamacpp" not in calls and calls.count("kvcli") == calls.count("openvino") == 4
    assert calls.count("vllm") == 2  # warm-up and run 1; run 2 failed, run 3 not tried
    assert [e["name"] for e in doc["systems"]] == ["kvcli", "vllm", "llamacpp", "openvino"]
    kv, vllm, llama, ov = doc["systems"]
    assert vllm["error"] == "run 2: ConnectionError: server gone" and "wall_s" not in vllm
    assert llama["error"] == "prepare: RuntimeError: llama-server did not start"
    assert ov["outputs_match"] and set(doc["speedup"]) == {"openvino"}
    assert any("vllm failed" in m and "the other systems go on" in m for m in messages)
    machine = {"processor": "x", "cpu_count": 2, "threads": 2, "torch": "t", "transformers": "t"}
    table = format_table({**doc, "machine": machine, "model": "m"})
    assert "llamacpp failed at prepare: RuntimeError: llama-server did not start" in table
    broken_reference = [_NoStart("kvcli", calls), _Scripted("openvino", calls)]
    with pytest.raises(RuntimeError, match="did not start"):  # no reference, no bench
        run_workload(Workload("x", "d", [[1]], 3), broken_reference, 1, messages.append)


def test_percentile_and_rss_tracker():
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0
    assert percentile([3.0, 1.0, 2.0, 4.0], 90) == 4.0
    rss = RssTracker()
    rss.start()
    if rss.start_kib is None:
        pytest.skip("no /proc/self/clear_refs here")
    block = bytearray(64 << 20)  # touch 64 MiB
    peak, growth = rss.stop()
    assert len(block) and growth is not None and growth >= 60 and peak >= growth


# ------------------------------------------------------------------------ CLI
def test_json_report_schema_and_greedy_match(model_dir):
    result = invoke("--workload", "shared-prefix", "--model", str(model_dir), "--json",
                    "--compare", "hf-generate,hf-generate-batch", "--hf-batch-size", "2", *SMALL)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["workload"] == "shared-prefix" and doc["model"] == str(model_dir)
    assert {"cpu_count", "load_avg_1_5_15", "torch", "threads"} <= doc["machine"].keys()
    assert doc["machine"]["threads"] == 1
    names = [s["name"] for s in doc["systems"]]
    assert names == ["kvcli", "hf-generate", "hf-generate-batch"]
    assert set(doc["speedup"]) == {"hf-generate", "hf-generate-batch"}
    kv, hf, cb = doc["systems"]
    for entry in doc["systems"]:
        assert entry["outputs_match"] is True, entry
        assert entry["generated_tokens"] == 9 and entry["outputs_total"] == 3
        assert entry["wall_s"] > 0 and entry["output_tok_s"] > 0 and entry["ttft_p90_s"] > 0
        assert entry["prompt_tokens"] == doc["prompt_tokens"]
    assert kv["cached_tokens"] > 0 and kv["prefill_tokens_computed"] < doc["prompt_tokens"]
    assert hf["prefill_tokens_computed"] >= doc["prompt_tokens"]  # padded batches of 2
    assert 0 < hf["kv_utilization"] <= 1


def test_table_several_workloads_and_plot(model_dir, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "bench.png"
    result = invoke("--workload", "chat-sessions", "--workload", "decode-1", "--model",
                    str(model_dir), "--compare", "kvcli-no-cache", "--no-isolate", "--plot",
                    str(png), *SMALL)
    assert result.exit_code == 0, result.output
    assert "workload chat-sessions" in result.stdout and "workload decode-1" in result.stdout
    assert "peak RSS of kvcli, kvcli-no-cache: the bench's process" in result.stdout
    assert "kvcli speedup over kvcli-no-cache" in result.stdout and "load avg" in result.stdout
    assert "run 1/1 kvcli" in result.stderr  # progress goes to stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_usage_errors_exit_2(model_dir, monkeypatch):
    result = invoke("--workload", "shared-prefix", "--compare", "unknown")
    assert result.exit_code == 2 and "unknown system(s) 'unknown'" in result.output
    assert "hf-generate-batch" in result.output
    assert invoke("--workload", "nope").exit_code == 2
    too_long = invoke("--workload", "shared-prefix", "--model", str(model_dir), "--scale", "2")
    assert too_long.exit_code == 2 and "context of 512" in too_long.output
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    no_mpl = invoke("--workload", "decode-1", "--plot", "x.png")
    assert no_mpl.exit_code == 2 and "needs matplotlib" in no_mpl.output


def test_command_module_does_not_import_torch():
    code = ("import sys, kvcli.commands.bench, kvcli.bench.suite; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_timed_run_waits_for_quiet_cpus_first(monkeypatch):
    """A peer that spins on after its batch (vLLM's engine) would slow the row timed next:
    timed runs wait until the CPUs were 90% idle over a window, at most a bound."""
    from kvcli.bench import measure

    busy, idle = [(0, 100), (5, 200), (10, 300)], [(100, 400)]  # (idle, total) jiffies
    readings = iter(busy + idle)
    monkeypatch.setattr(measure, "_cpu_times", lambda: next(readings))
    assert 0.03 <= measure.wait_for_quiet(timeout_s=5.0, window_s=0.01) < 5.0
    assert next(readings, None) is None  # it read until the first idle window, no further
    monkeypatch.setattr(measure, "_cpu_times", lambda: (0, 100))  # never a tick idle
    assert 0.1 <= measure.wait_for_quiet(timeout_s=0.1, window_s=0.01) < 1.0
    monkeypatch.setattr(measure, "_cpu_times", lambda: None)  # no /proc/stat: no wait
    assert measure.wait_for_quiet(timeout_s=5.0, window_s=0.01) == 0.0


def test_the_prepared_pool_is_in_and_serves_the_warm_up(model_dir):
    """The bench's untimed prepare faults the workload's pool in, and the short warm-up runs on
    it: rebuilt for the warm-up, the first timed run built a new pool and faulted its pages in
    (1.5 s of kernel time beside vLLM's process, docs/BENCHMARKS.md 2026-12-08)."""
    from test_quant_gguf_mode import _resident

    from kvcli.bench.systems import KvcliSystem

    system = KvcliSystem.load(str(model_dir), 256)
    prompts = [[(5 * i + j) % 90 + 3 for i in range(40 + 9 * j)] for j in range(4)]
    system.prepare(prompts, 8)
    engine, pool = system._engine, system._engine.runner.kv_cache
    size = pool.numel() * pool.element_size()
    start = pool.data_ptr() & ~4095
    assert _resident(start, pool.data_ptr() + size - start) >= size
    system.run(prompts[:2], 4)  # the warm-up's few blocks fit the workload's pool
    assert system._engine is engine
    full = system.run(prompts, 8)
    assert system._engine is engine and len(full.outputs) == 4
    system.run(prompts + prompts, 8)  # more than it holds: a bigger pool
    assert system._engine is not engine
