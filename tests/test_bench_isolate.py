"""`kvcli bench --isolate`: each kvcli row in a process of its own, its peak RSS its own.

The proof that a row's peak is of its own process: this test process holds a ballast of
512 MiB while the bench runs in it (CliRunner). A row run in the bench's process cannot peak
below that ballast, since the peak counter restarts from the current RSS; a row in its own
process, a fresh interpreter with a tiny model, peaks far below it. The rows' outputs must be
those of the same rows run in the bench's process.
"""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

from kvcli.bench.kvcli_process import KvcliProcessSystem
from kvcli.bench.kvcli_rows import KvcliRow, load_row
from kvcli.bench.report import format_table
from kvcli.bench.suite import BenchConfig
from kvcli.cli import main

BALLAST_MB = 512
SMALL = ["--num-prompts", "3", "--max-tokens", "4", "--scale", "0.1", "--threads", "1",
         "--no-warmup", "--json"]
COMMON = list(range(1, 21))  # one full 16-token block shared by the first two prompts
PROMPTS = [[*COMMON, 40, 41], [*COMMON, 50], [30, 31, 32]]


def bench(model_dir, compare: str, *flags: str) -> dict:
    result = CliRunner().invoke(main, ["bench", "--workload", "shared-prefix", "--model",
                                       str(model_dir), "--compare", compare, *flags, *SMALL],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak RSS needs /proc")
def test_isolated_rows_report_their_own_peak_and_the_same_outputs(tiny_models):
    model = tiny_models["llama"]
    ballast = bytearray(b"\x01") * (BALLAST_MB << 20)  # resident: every page written
    shared = bench(model, "kvcli-no-cache,kvcli-int8", "--no-isolate")
    isolated = bench(model, "kvcli-no-cache,kvcli-int8")  # the default with kvcli-* rows
    assert len(ballast) and shared["isolated"] is False and isolated["isolated"] is True
    for here, alone in zip(shared["systems"], isolated["systems"], strict=True):
        assert here["name"] == alone["name"]
        assert here["rss_own_process"] is False and here["peak_rss_mb"] > BALLAST_MB
        assert alone["rss_own_process"] is True and alone["details"]["process"] == "own"
        assert 0 < alone["peak_rss_mb"] < BALLAST_MB, alone  # not this process's ballast
        assert alone["details"]["load_rss_mb"] <= alone["peak_rss_mb"]
        assert alone["rss_growth_mb"] is not None and alone["rss_growth_mb"] >= 0
        # the same engine on the same token ids: the same greedy outputs and precision
        for key in ("outputs_matching", "agreement", "generated_tokens", "precision", "exact",
                    "prefill_tokens_computed", "cached_tokens", "prompt_tokens"):
            assert here[key] == alone[key], key
    ref, no_cache, _ = isolated["systems"]
    assert ref["outputs_match"] is True and no_cache["outputs_match"] is True
    assert no_cache["cached_tokens"] == 0 < ref["cached_tokens"]
    # The table says when rows share the bench's peak, and only then.
    note = "peak RSS of kvcli, kvcli-no-cache, kvcli-int8: the bench's process"
    assert note in format_table(shared) and "peak RSS of" not in format_table(isolated)


def test_a_row_process_runs_the_engine_the_bench_would(tiny_models):
    """One row directly: the workload tokenized there, the pool sized, two runs from an
    empty prefix cache each, outputs equal to the in-process engine's."""
    row = KvcliRow("kvcli", str(tiny_models["llama"]), 256)
    system = KvcliProcessSystem(row, threads=1).start()
    try:
        assert system.name == "kvcli" and system.exact and system.max_model_len == 512
        workload = system.workload("decode-1", max_new_tokens=3)
        assert workload == load_row(row).workload("decode-1", max_new_tokens=3)
        system.prepare(PROMPTS, 4)
        first, again = system.run(PROMPTS, 4), system.run(PROMPTS, 4)
    finally:
        system.close()
    here = load_row(row).run(PROMPTS, 4)
    assert first.outputs == again.outputs == here.outputs
    # A second run from a warm cache would hit both prompts' 16-token blocks: it does not.
    assert first.cached_tokens == again.cached_tokens == here.cached_tokens <= 16
    assert first.peak_rss_mb is not None and first.details["engine_wall_s"] > 0


def test_a_row_that_cannot_load_is_a_usage_error_from_its_process(tiny_models):
    result = CliRunner().invoke(main, ["bench", "--workload", "decode-1", "--model",
                                       str(tiny_models["llama"]), "--compare", "kvcli-gguf",
                                       "--isolate", *SMALL])
    assert result.exit_code == 2, result.output
    assert "--compare kvcli-gguf:" in result.output and "GGUF" in result.output


def test_isolation_defaults_on_with_a_kvcli_row_only():
    assert not BenchConfig(["decode-1"]).isolated  # hf-generate: kvcli alone in the bench
    assert not BenchConfig(["decode-1"], compare=["vllm", "llamacpp"]).isolated
    assert BenchConfig(["decode-1"], compare=["hf-generate", "kvcli-fast"]).isolated
    assert not BenchConfig(["decode-1"], compare=["kvcli-fast"], isolate=False).isolated
    assert BenchConfig(["decode-1"], compare=[], isolate=True).isolated


def test_each_workload_gets_the_pool_it_needs(tiny_models):
    """A smaller workload after a bigger one runs on a pool sized for it, not the bigger one
    kept (its peak RSS would be the earlier workload's); the same workload again reuses it."""
    from kvcli.bench.systems import pages_needed

    system = load_row(KvcliRow("kvcli", str(tiny_models["llama"]), 256))
    block = system.base.config.block_size
    big, small = [list(range(1, 200))] * 4, [[1, 2, 3]]
    system.prepare(big, 8)
    assert system._engine.num_blocks == pages_needed(big, 8, block)
    system.prepare(small, 4)
    engine = system._engine
    assert engine.num_blocks == pages_needed(small, 4, block)
    system.prepare(small, 4)
    assert system._engine is engine
