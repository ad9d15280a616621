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
    VARIANTS,
    OpenVinoSystem,
    OpenVinoUnavailable,
    first_unused_token,
    weights_text,
)
from kvcli.bench.suite import parse_compare
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


def _system(model_dir: Path, python: Path = Path(sys.executable),
            name: str = "openvino") -> OpenVinoSystem:
    return OpenVinoSystem(python, model_dir, 1024, 1, name=name)


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


def test_variants_at_their_defaults_force_nothing_and_report_what_ran(fake_openvino, tmp_path,
                                                                     monkeypatch):
    model_dir = make_tiny_model("llama", tmp_path / "llama")
    monkeypatch.setenv("KVCLI_OPENVINO_PYTHON", sys.executable)
    result = CliRunner().invoke(main, ["bench", "--workload", "shared-prefix", "--model",
                                       str(model_dir), "--compare", ",".join(VARIANTS),
                                       "--json", "-q", *SMALL])
    assert result.exit_code == 0, result.output
    _, *rows = json.loads(result.stdout)["systems"]
    got = [(r["name"], r["exact"], r["weights"], r["precision"]) for r in rows]
    assert got == [
        ("openvino", True, "float32", "fp32 weights, inference f32, KV f32 (forced)"),
        ("openvino-default", False, "defaults", "fp32 weights, inference bf16, KV u8 (its defaults)"),
        ("openvino-int8", False, "int8",
         "int8 asym per channel weights, inference bf16, KV u8 (its defaults)"),
        ("openvino-int4", False, "int4",
         "int4 asym group 64, int8 asym backup weights, inference bf16, KV u8 (its defaults)")]
    # the fp32 IR is shared by openvino and openvino-default: three exports for four rows
    assert [Path(r["details"]["ir_dir"]).name for r in rows] == [
        "openvino-fp32", "openvino-fp32", "openvino-int8", "openvino-int4"]
    assert len(fake_openvino.read_text().splitlines()) == 3
    # the stand-in drifts from the third token by the IR's weights: each ran its own IR,
    # and none at its defaults got the f32 hints
    runs = []
    for name in VARIANTS:
        system = _system(model_dir, name=name)
        try:
            system.start().before_run(PROMPTS, 4)
            runs.append(system.run(PROMPTS, 4).outputs)
        finally:
            system.close()
    assert all([o[:2] for o in run] == [o[:2] for o in runs[0]] for run in runs)
    assert len({json.dumps(run) for run in runs}) == len(VARIANTS)


def test_int_exports_each_get_their_own_ir_once(fake_openvino, tmp_path):
    for name, options in (("openvino-int8", "--weight-format int8 "),
                          ("openvino-int4", "--weight-format int4 --group-size 64 ")):
        for _ in range(2):  # the second start reuses the IR
            system = _system(tmp_path, name=name).start()
            system.close()
        assert system.ir_dir == tmp_path / name and not system.needs_export
        assert system.export_s == 0.0 and system.compression["mode"] == f"{name[-4:]}_asym"
        assert options in fake_openvino.read_text().splitlines()[-1]
    assert len(fake_openvino.read_text().splitlines()) == 2
    assert not (tmp_path / IR_DIR_NAME).exists()  # no fp32 export for them


def test_weights_text_names_the_compression():
    assert weights_text({}) == "fp32"
    assert weights_text({"mode": "int8_sym", "group_size": "-1", "ratio": "1.0",
                         "backup_mode": "int8_sym"}) == "int8 sym per channel"
    assert weights_text({"mode": "int4_asym", "group_size": "64", "ratio": "0.8",
                         "backup_mode": "int8_asym"}) == (
        "int4 asym group 64, 80% of layers, int8 asym backup")


def test_every_variant_is_a_compare_name_needing_the_python(monkeypatch):
    assert parse_compare(",".join(VARIANTS)) == list(VARIANTS)
    monkeypatch.delenv("KVCLI_OPENVINO_PYTHON", raising=False)
    result = CliRunner().invoke(main, ["bench", "--workload", "decode-1", "--compare",
                                       "hf-generate,openvino-int4"])
    assert result.exit_code == 2
    assert "--compare openvino-int4 needs --openvino-python" in result.output
