"""`kvcli cache stats|ls|prune|clear DIR` over a directory two runs have filled."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from kvcli import LLM, SamplingParams
from kvcli.cli import main
from kvcli.kvstore.directory import iter_block_files, total_bytes

PROMPTS = ["Caching the keys and values of a shared prompt prefix saves work. The fox went",
           "Caching the keys and values of a shared prompt prefix saves work. Once upon"]


@pytest.fixture
def filled(tiny_models, kvcli_home, tmp_path):
    kv = tmp_path / "kv"
    for _ in range(2):  # the second run hits what the first wrote
        llm = LLM(str(tiny_models["llama"]), block_size=4, kv_cache_dir=str(kv))
        llm.generate(PROMPTS, SamplingParams(max_tokens=4))
        llm.engine.close()
    return kv


def cli(*args: str, code: int = 0) -> str:
    res = CliRunner().invoke(main, ["cache", *args], catch_exceptions=False)
    assert res.exit_code == code, res.output
    return res.output


def test_stats_and_ls_report_models_blocks_and_hits(filled):
    stats = json.loads(cli("stats", str(filled), "--json"))
    files = list(iter_block_files(filled))
    assert stats["models"] == 1 and stats["blocks"] == len(files) > 0
    assert stats["bytes"] == total_bytes(filled)
    assert stats["runs"] == 2 and stats["hit_blocks"] > 0
    assert stats["written_blocks"] == len(files)
    [model] = [json.loads(line) for line in cli("ls", str(filled), "--json").splitlines()]
    assert model["description"]["block_size"] == 4 and model["description"]["dtype"] == "float32"
    line = cli("ls", str(filled))
    assert model["fingerprint"][:12] in line and "float32 block 4 on cpu" in line
    assert f"{stats['blocks']:,} blocks" in cli("stats", str(filled))


def test_prune_and_clear(filled):
    before = total_bytes(filled)
    out = cli("prune", str(filled), "--max-bytes", str(before // 2))
    assert total_bytes(filled) <= before // 2 and "removed" in out
    cli("clear", str(filled), "--model", "0000")  # another fingerprint: nothing removed
    assert total_bytes(filled) > 0
    cli("clear", str(filled))
    assert total_bytes(filled) == 0 and json.loads(cli("stats", str(filled), "--json"))["runs"]


def test_a_directory_that_is_not_a_cache_is_refused(tmp_path):
    (tmp_path / "x").write_text("x")
    assert "not a kvcli KV cache" in cli("clear", str(tmp_path), code=1)
    assert os.listdir(tmp_path) == ["x"]
    assert "no kvcli KV cache" in cli("stats", str(tmp_path / "new"), code=1)
    assert not (tmp_path / "new").exists()
