"""The execution backend is chosen once per model, named, and reported (kvcli/model/backend.py)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kvcli.cli import main
from kvcli.engine.llm import LLM
from kvcli.model import native

KEYS = {"name", "isa", "precision", "kv_cache_dtype", "decode_attention", "prefill_attention",
        "batch1_decode", "matmul", "elementwise"}


def test_native_cpu_backend_names_every_phase(tiny_models) -> None:
    if native.load() is None:
        pytest.skip("no C compiler: the native kernels cannot be built here")
    chosen = LLM(str(tiny_models["llama"])).engine.runner.backend
    assert chosen.name == "native-cpu" and chosen.native is native.load()  # the one handle
    assert chosen.isa in {"avx512", "avx2+fma", "neon", "generic"}
    assert chosen.decode_attention == "native paged"
    assert chosen.batch1_decode.startswith("native fused")  # float32 weights too (gemv.c)
    assert set(chosen.describe()) == KEYS


def test_without_native_kernels_the_torch_backend_runs(tiny_models, monkeypatch) -> None:
    monkeypatch.setattr(native, "load", lambda: None)
    engine = LLM(str(tiny_models["llama"])).engine
    chosen = engine.runner.backend
    assert (chosen.name, chosen.native, chosen.elementwise) == ("torch-cpu", None, "torch")
    assert engine.runner.native is None  # attention metadata then builds torch decode batches


def test_generate_stats_report_the_backend(tiny_models, tmp_path) -> None:
    src, stats = tmp_path / "in.jsonl", tmp_path / "stats.json"
    src.write_text('{"prompt": "Once upon a time", "max_tokens": 3}\n')
    res = CliRunner().invoke(main, ["generate", str(src), "--model", str(tiny_models["llama"]),
                                    "--stats", str(stats), "--quiet"], catch_exceptions=False)
    assert res.exit_code == 0
    reported = json.loads(stats.read_text())["backend"]
    assert set(reported) == KEYS and reported["name"] in {"native-cpu", "torch-cpu"}
