"""`kvcli bench --compare kvcli-gguf,kvcli-int8`: quantized kvcli against its float32 weights.

Quantized systems are not expected to reproduce float32's greedy tokens, so the report gives
their agreement (share of identical outputs, mean first-divergence position) rather than a
pass/fail match. A GGUF of float32 tensors runs the very same weights in gguf mode, so its
agreement must be complete: that pins the measurement to the real engine, not to a stand-in.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kvcli.bench.runner import first_divergence, greedy_agreement
from kvcli.bench.suite import parse_compare
from kvcli.cli import main
from kvcli.model import native

# In the bench's process (fast); tests/test_bench_isolate.py runs such rows in their own.
SMALL = ["--num-prompts", "3", "--max-tokens", "4", "--scale", "0.1", "--threads", "1",
         "--no-warmup", "--no-isolate"]


def invoke(*args: str):
    return CliRunner().invoke(main, ["bench", *args], catch_exceptions=False)


def test_first_divergence_and_agreement():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 9, 3], [1, 2, 3]) == 1
    assert first_divergence([7], [1]) == 0
    assert first_divergence([1, 2], [1, 2, 3]) == 2  # a shorter output differs where it ends
    ref = [[1, 2, 3, 4], [5, 6, 7, 8], [1, 1, 1, 1], [2, 2, 2, 2]]
    out = [[1, 2, 3, 4], [5, 0, 7, 8], [1, 1, 1, 0], [2, 2, 2, 2]]
    agree = greedy_agreement(out, ref)
    assert agree == {"identical_share": 0.5, "diverged": 2, "mean_first_divergence": 2.0,
                     "mean_agreeing_tokens": 3.0}  # (4 + 1 + 3 + 4) / 4
    assert greedy_agreement(ref, ref)["mean_first_divergence"] is None
    assert parse_compare("kvcli-gguf,kvcli-int8") == ["kvcli-gguf", "kvcli-int8"]


def test_int8_agreement_is_reported_not_failed(tiny_models):
    result = invoke("--workload", "distinct", "--model", str(tiny_models["llama"]),
                    "--compare", "kvcli-int8", "--json", *SMALL)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    ref, q = doc["systems"]
    assert ref["name"] == "kvcli" and ref["exact"] is True
    assert ref["agreement"]["identical_share"] == 1.0
    assert q["name"] == "kvcli-int8" and q["exact"] is False
    agree = q["agreement"]
    assert agree["identical_share"] == pytest.approx(q["outputs_matching"] / 3, abs=1e-4)
    assert 0 <= agree["mean_agreeing_tokens"] <= 4 and q["generated_tokens"] == 12
    assert q["details"]["num_blocks"] > 0 and "kvcli-int8" in doc["speedup"]


def test_gguf_of_float32_tensors_agrees_fully_and_table_says_so(tiny_models, kvcli_home):
    gguf = tiny_models.gguf("llama")
    result = invoke("--workload", "shared-prefix", "--model", str(gguf), "--quantization",
                    "none", "--compare", "kvcli-gguf,kvcli-int8", *SMALL)
    assert result.exit_code == 0, result.output
    assert "kvcli-gguf greedy agreement with kvcli float32: 100.0% identical" in result.stdout
    assert "kvcli-int8 greedy agreement with kvcli float32:" in result.stdout
    assert "3/3 (quantized)" in result.stdout


def test_the_kvcli_row_runs_the_bench_quantization(tiny_models, kvcli_home):
    """--quantization picks the kvcli row's weights (auto: a GGUF in its own types, as generate
    runs it); every row of the report names its precision."""
    gguf = str(tiny_models.gguf("llama"))
    docs = {}
    for mode in ("auto", "none", "int8"):
        result = invoke("--workload", "decode-1", "--model", gguf, "--quantization", mode,
                        "--compare", "hf-generate", "--json", *SMALL)
        assert result.exit_code == 0, result.output
        docs[mode] = json.loads(result.stdout)
    precision = {m: [(e["name"], e["precision"]) for e in d["systems"]] for m, d in docs.items()}
    int8 = ("int8 weights, int8 activations per 32 values, float32 KV"  # not "(exact)"
            if native.qint_available(native.load())
            else "int8 weights, float32 activations, float32 KV (exact)")
    assert precision == {
        "auto": [("kvcli", "gguf weights, float32 activations, float32 KV (exact)"),
                 ("hf-generate", "float32")],
        "none": [("kvcli", "float32 weights, float32 KV (exact)"), ("hf-generate", "float32")],
        "int8": [("kvcli", int8), ("hf-generate", "float32")]}
    # A float32 GGUF's own tensors are the float32 weights: the same greedy tokens.
    assert docs["auto"]["systems"][1]["outputs_match"] is True
    table = invoke("--workload", "decode-1", "--model", gguf, "--compare", "none", *SMALL)
    assert table.stdout.splitlines()[1].split()[:2] == ["system", "weights"]
    assert "quantized" in table.stdout.splitlines()[2]


def test_gguf_without_a_gguf_is_a_usage_error(tiny_models):
    result = CliRunner().invoke(main, ["bench", "--workload", "decode-1", "--model",
                                       str(tiny_models["llama"]), "--compare", "kvcli-gguf",
                                       *SMALL])
    assert result.exit_code == 2
    assert "--compare kvcli-gguf:" in result.output and "GGUF" in result.output


def test_gguf_fast_row_is_precision_fast_on_the_gguf_itself(tiny_models, tmp_path):
    """--compare kvcli-gguf-fast loads what `generate --model X.gguf --precision fast` loads
    (the GGUF's own blocks), where kvcli-fast loads the bench's float weights."""
    from kvcli.bench.kvcli_rows import kvcli_row
    from kvcli.bench.suite import BenchConfig

    gguf = str(tiny_models.gguf("llama"))
    cfg = BenchConfig(workloads=["decode-1"], model=gguf, compare=["kvcli-gguf-fast"])
    assert parse_compare("kvcli-gguf-fast,kvcli-fast") == ["kvcli-gguf-fast", "kvcli-fast"]
    row = kvcli_row("kvcli-gguf-fast", tmp_path, cfg)
    assert (row.model, row.quantization, row.precision) == (gguf, "auto", "fast")
    assert kvcli_row("kvcli-fast", tmp_path, cfg).model == str(tmp_path)
