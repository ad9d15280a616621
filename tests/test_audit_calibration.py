"""Worth in time from a calibrated rate: `kvcli bench --calibrate` measures prefill and decode
once per model, CPU and dtype and stores them; `kvcli audit --model` reads the stored rate
(kvcli/calibration.py, torch-free) when --prefill-tok-s is not given, and says how to get one
when there is none."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_audit_support import SAMPLES, run

from kvcli.calibration import Calibration, calibration_path, load_calibration, save_calibration
from kvcli.cli import main


def _stored(model: Path, rate: float = 2000.0, dtype: str = "float32") -> Calibration:
    from kvcli.calibration import cpu_model

    cal = Calibration(str(model), cpu_model(), dtype, rate, 50.0, "2026-12-01T10:00:00+00:00", 512, 2, (1.0, 1.0, 1.0))
    save_calibration(cal)
    return cal


def test_bench_calibrate_measures_and_stores_the_rate(tiny_model_dir: Path, kvcli_home: Path) -> None:
    result = CliRunner().invoke(main, ["bench", "--calibrate", "--model", str(tiny_model_dir), "--scale", "0.1",
                                       "--num-prompts", "2", "--max-tokens", "8", "--json", "-q"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["prefill_tok_s"] > 0 and doc["decode_tok_s"] > 0 and doc["prompt_tokens"] == 51
    assert Path(doc["path"]).is_relative_to(kvcli_home / "calibration")
    stored = load_calibration(tiny_model_dir, "float32")
    assert stored is not None and stored.prefill_tok_s == doc["prefill_tok_s"] and stored.cpu == doc["cpu"]
    assert load_calibration(tiny_model_dir, "bfloat16") is None  # another dtype: not measured


def test_bench_calibrate_refuses_what_it_does_not_read(tiny_model_dir: Path, kvcli_home: Path) -> None:
    for args in (["--workload", "distinct"], ["--compare", "vllm"], ["--repeat", "3"]):
        result = CliRunner().invoke(main, ["bench", "--calibrate", "--model", str(tiny_model_dir), *args])
        assert result.exit_code == 2 and "not read with it" in result.output, result.output
    result = CliRunner().invoke(main, ["bench", "--model", str(tiny_model_dir)])
    assert result.exit_code == 2 and "--workload NAME (or --calibrate)" in result.output
    # --dtype is kvcli's row's with --workload, the measured dtype with --calibrate; the preset
    # is not calibrated (a calibration is keyed by dtype)
    result = CliRunner().invoke(main, ["bench", "--calibrate", "--model", str(tiny_model_dir),
                                       "--precision", "fast"])
    assert result.exit_code == 2 and "--precision not read with it" in result.output


def test_the_key_is_model_cpu_and_dtype(tmp_path: Path, kvcli_home: Path) -> None:
    a = calibration_path(tmp_path / "m", "float32", "CPU A")
    assert a != calibration_path(tmp_path / "m", "float32", "CPU B")
    assert a != calibration_path(tmp_path / "m", "bfloat16", "CPU A")
    assert a != calibration_path(tmp_path / "other", "float32", "CPU A")
    assert a.parent == kvcli_home / "calibration"
    cal = _stored(tmp_path / "m")
    assert load_calibration(tmp_path / "m", "float32") == cal
    calibration_path(tmp_path / "m", "float32").write_text("{not json")  # damaged: as good as none
    assert load_calibration(tmp_path / "m", "float32") is None
    save_calibration(replace(cal, cpu="another machine's CPU", prefill_tok_s=1.0))  # measured elsewhere
    assert load_calibration(tmp_path / "m", "float32") is None  # ... is not this machine's rate
    save_calibration(cal)
    assert load_calibration(tmp_path / "m", "float32") == cal


def test_audit_uses_the_stored_rate_and_names_it(tiny_model_dir: Path, kvcli_home: Path) -> None:
    model = str(tiny_model_dir)
    hint = run([str(SAMPLES), "--model", model, "--fail-on", "never", "--format", "json"])
    worth = json.loads(hint.stdout)["worth"]
    assert worth["prefill_tok_s"] is None and worth["rate_source"] is None
    assert f"kvcli bench --calibrate --model {model} --dtype float32" in worth["rate_note"]
    text = run([str(SAMPLES), "--model", model, "--fail-on", "never"]).output
    assert "── worth" in text and "no prefill time: give --prefill-tok-s RATE, or calibrate" in text
    _stored(tiny_model_dir, 2000.0)
    doc = json.loads(run([str(SAMPLES), "--model", model, "--fail-on", "never", "--format", "json"]).stdout)
    w, tokens = doc["worth"], doc["summary"]["tokens"]
    assert w["rate_source"] == "calibration" and w["prefill_tok_s"] == 2000.0
    assert w["prefill_s_uncached"] == pytest.approx(tokens / 2000.0)
    text = run([str(SAMPLES), "--model", model, "--fail-on", "never"]).output
    assert "── worth" in text and "an estimate, calibrated on 2026-12-01 " in text
    given = json.loads(run([str(SAMPLES), "--model", model, "--fail-on", "never", "--format", "json",
                            "--prefill-tok-s", "10"]).stdout)["worth"]
    assert given["rate_source"] == "--prefill-tok-s" and given["prefill_s_uncached"] == pytest.approx(tokens / 10)
    other = json.loads(run([str(SAMPLES), "--model", model, "--fail-on", "never", "--format", "json",
                            "--dtype", "bfloat16"]).stdout)["worth"]
    assert other["rate_source"] is None and "--dtype bfloat16" in other["rate_note"]  # measured in float32 only


def test_trace_replay_uses_the_stored_rate_too(tiny_model_dir: Path, kvcli_home: Path, tmp_path: Path) -> None:
    from kvcli.bench.audit_trace import TraceShape, generate

    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in generate(TraceShape(50, 16), seed=1)))
    args = [str(trace), "--trace-block-size", "16", "--model", str(tiny_model_dir), "--format", "json"]
    assert json.loads(run(args).stdout)["worth"]["prefill_tok_s"] is None
    _stored(tiny_model_dir, 4000.0)
    worth = json.loads(run(args).stdout)["worth"]
    assert worth["prefill_tok_s"] == 4000.0 and "calibrated on 2026-12-01" in worth["rate_source"]
    assert worth["prefill_s_uncached"] > 0
    text = run(args[:-2]).output
    assert "at 4,000 tokens/s (calibrated on 2026-12-01" in text
