"""The capacity figure in the run's KV dtype: with --model and --dtype, bytes per block, --cache-size
in bytes and the default pool are what the engine's own sizing code gives for that dtype."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_audit_support import SAMPLES, run

from kvcli.audit.capacity import model_config
from kvcli.engine.config import EngineConfig, budget_num_blocks
from kvcli.model.attention import kv_cache_bytes_per_block


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_bytes_follow_generates_kv_dtype(tiny_models, dtype: str) -> None:
    model = Path(tiny_models["llama"])
    per_block = kv_cache_bytes_per_block(model_config(model), 16, getattr(torch, dtype))
    budget = per_block * 40 + per_block // 2  # 40.5 blocks' worth: the pool rounds down
    result = run([str(SAMPLES / "clean.jsonl"), "--model", str(model), "--dtype", dtype, "--cache-size",
                  f"{budget}B", "--format", "json", "--fail-on", "never"])
    assert result.exit_code == 0, result.output
    capacity = json.loads(result.stdout)["capacity"]
    assert capacity["kv_dtype"] == dtype
    assert capacity["kv_bytes_per_token"] * 16 == per_block
    assert capacity["bounded"]["blocks"] == budget_num_blocks(EngineConfig(kv_cache_memory=budget, dtype=dtype),
                                                              per_block) == 40
    assert capacity["engine_pool"]["blocks"] == budget_num_blocks(EngineConfig(dtype=dtype), per_block)
    text = run([str(SAMPLES / "clean.jsonl"), "--model", str(model), "--dtype", dtype, "--cache-size", "40blocks",
                "--fail-on", "never"]).output
    assert f"KV: {per_block // 16:,} bytes per token in {dtype}" in text


def test_int8_kv_bytes_follow_generates_pool(tiny_models) -> None:
    """--kv-cache-dtype int8: the engine's own bytes per block (codes + scale and zero point)."""
    from kvcli.model.attention.native_int8 import INT8_STORAGE

    model = Path(tiny_models["llama"])
    per_block = kv_cache_bytes_per_block(model_config(model), 16, INT8_STORAGE)
    assert per_block < kv_cache_bytes_per_block(model_config(model), 16, torch.float32) / 2
    budget = per_block * 40 + per_block // 2
    result = run([str(SAMPLES / "clean.jsonl"), "--model", str(model), "--kv-cache-dtype", "int8",
                  "--cache-size", f"{budget}B", "--format", "json", "--fail-on", "never"])
    assert result.exit_code == 0, result.output
    capacity = json.loads(result.stdout)["capacity"]
    assert capacity["kv_dtype"] == "int8" and capacity["kv_bytes_per_token"] * 16 == per_block
    assert capacity["bounded"]["blocks"] == 40
    text = run([str(SAMPLES / "clean.jsonl"), "--model", str(model), "--kv-cache-dtype", "int8",
                "--cache-size", "40blocks", "--fail-on", "never"]).output
    assert "--kv-cache-dtype int8` allocates" in text
