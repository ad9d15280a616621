"""`kvcli bench --compare openvino`: the runner's export, protocol, fresh pipelines, errors, CLI.

OpenVINO GenAI is not installed in CI (optimum-intel pins its own torch); these tests run
the real runner script under this interpreter against tests/fake_openvino, a stand-in
with openvino_genai's continuous-batching API and a fake `optimum-cli export`, so the
export cache, pipe protocol, per-run rebuild and error paths are exercised for real.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from tiny_models import make_tiny_model

from kvcli.bench.openvino_system import (
    IR_DIR_NAME,
    OpenVinoSystem,
    OpenVinoUnavailable,
    first_unused_token,
)
from kvcli.bench.systems import pages_needed
from kvcli.cli import main

FAKE = Path(__file__).parent / "fake_openvino"
SMALL = ["--num-prompts", "3", "--max-tokens", "3", "--scale", "0.1", "--threads", "1"]
PROMPTS = [[1, 2, 3, 4, 5], [1, 2, 3, 4, 9], [7, 7, 7, 7]]


@pytest.fixture()
def fake_openvino(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", str(FAKE))
    monkeypatch.setenv("FAKE_OPENVINO_EXPORT_LOG", str(tmp_path / "exports.log"))
    return tmp_path / "exports.log"


def _system(model_dir: Path, python: Path = Path(sys.executable)) -> OpenVinoSystem:
    return OpenVinoSystem(python, model_dir, 1024, 1)


def test_runner_exports_once_and_outputs_travel(fake_openvino, tmp_path):
    system = _system(tmp_path).start()
    try:
        assert system.version == "0.0-fake" and system.load_s >= 0
        assert (tmp_path / IR_DIR_NAME / "openvino_model.xml").is_file()
        system.before_run(PROMPTS, 3)
        result = system.run(PROMPTS, 3)
        assert result.outputs == [[(sum(p) + i) % 97 for i in range(3)] for p in PROMPTS]
        assert result.prefill_tokens_computed is None and result.cached_tokens is None
        assert len(result.ttfts) == 3 and all(t >= 0 for t in result.ttfts)
        assert result.details["kv_cache_bytes"] == pages_needed(PROMPTS, 3, 32) * 1000
        assert result.details["steps"] == 4  # one prefill step, then a token per step
    finally:
        system.close()
    again = _system(tmp_path).start()  # the IR is reused: no second export
    again.close()
    assert again.export_s == 0.0 and not system.needs_export
    exports = fake_openvino.read_text().splitlines()
    assert len(exports) == 1 and "--weight-format fp32" in exports[0]


def test_every_timed_run_gets_a_fresh_prefix_cache(fake_openvino, tmp_path):
    system = _system(tmp_path).start()
    try:
        system.before_run(PROMPTS, 3)
        system.run(PROMPTS, 3)
        warm = system.run(PROMPTS, 3)  # same pipeline: the finished prefixes are cached
        assert warm.details["steps"] == 3
        system.before_run(PROMPTS, 3)
        assert system.run(PROMPTS, 3).details["steps"] == 4 and system.reset_s >= 0
    finally:
        system.close()


def test_warm_token_never_starts_a_prompt():
    assert first_unused_token([[0, 5], [1], [3]]) == 2
    assert first_unused_token([[5], []]) == 0


def test_missing_openvino_names_the_install(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    with pytest.raises(OpenVinoUnavailable, match="pip install openvino-genai==2026.4.1.0"):
        _system(tmp_path).start()
    with pytest.raises(OpenVinoUnavailable, match="--openvino-python .*: no such file"):
        _system(tmp_path, tmp_path / "nope" / "python").start()


def test_failed_export_leaves_no_ir(fake_openvino, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_OPENVINO_FAIL_EXPORT", "1")
    with pytest.raises(OpenVinoUnavailable,
                       match=r"(?s)export openvino .* failed.*log.*fake optimum-cli: export failed"):
        _system(tmp_path).start()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exports.log"]


def test_load_failure_carries_the_runner_error(fake_openvino, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_OPENVINO_FAIL_LOAD", "1")
    with pytest.raises(OpenVinoUnavailable, match="RuntimeError: fake compile failure"):
        _system(tmp_path).start()


def test_cli_needs_openvino_python(monkeypatch):
    monkeypatch.delenv("KVCLI_OPENVINO_PYTHON", raising=False)
    result = CliRunner().invoke(main, ["bench", "--workload", "decode-1", "--compare",
                                       "openvino"])
    assert result.exit_code == 2 and "--openvino-python" in result.output
    assert "openvino-genai==2026.4.1.0" in result.output


def test_cli_side_by_side_with_the_peer(fake_openvino, tmp_path, monkeypatch):
    model_dir = make_tiny_model("llama", tmp_path / "llama")
    monkeypatch.setenv("KVCLI_OPENVINO_PYTHON", sys.executable)
    result = CliRunner().invoke(main, ["bench", "--workload", "shared-prefix", "--model",
                                       str(model_dir), "--compare", "openvino", "--json", "-q",
                                       "--repeat", "2", *SMALL])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    kv, peer = doc["systems"]
    assert peer["name"] == "openvino" and "openvino" in doc["speedup"]
    assert peer["details"]["version"] == "0.0-fake" and peer["generated_tokens"] == 9
    assert peer["details"]["steps"] == 4  # a fresh pipeline for the second run too
    assert peer["prefill_tokens_computed"] is None and peer["peak_rss_mb"] is not None
    assert peer["outputs_matching"] == 0  # the stand-in does not run the model: reported as such
    assert kv["outputs_match"] is True


def test_openvino_default_forces_no_precision_and_reports_its_own(fake_openvino, tmp_path,
                                                                  monkeypatch):
    model_dir = make_tiny_model("llama", tmp_path / "llama")
    monkeypatch.setenv("KVCLI_OPENVINO_PYTHON", sys.executable)
    result = CliRunner().invoke(main, ["bench", "--workload", "shared-prefix", "--model",
                                       str(model_dir), "--compare", "openvino,openvino-default",
                                       "--json", "-q", *SMALL])
    assert result.exit_code == 0, result.output
    _, forced, default = json.loads(result.stdout)["systems"]
    assert (forced["name"], forced["exact"]) == ("openvino", True)
    assert forced["precision"] == "inference f32, KV f32 (forced)"
    assert (default["name"], default["exact"], default["weights"]) == (
        "openvino-default", False, "defaults")
    assert default["precision"] == "inference bf16, KV u8 (its defaults)"
    # the stand-in drifts from the third token at its defaults: the pipeline got no f32 hints
    runs = []
    for defaults in (False, True):
        system = OpenVinoSystem(Path(sys.executable), model_dir, 1024, 1, defaults=defaults)
        try:
            system.start().before_run(PROMPTS, 4)
            runs.append(system.run(PROMPTS, 4).outputs)
        finally:
            system.close()
    assert [o[:2] for o in runs[0]] == [o[:2] for o in runs[1]] and runs[0] != runs[1]
