"""Quantized models end to end: ``--quantization gguf`` on a tiny GGUF written with Q8_0, Q4_0 and
Q4_1 tensors, ``--quantization int8`` on a tiny safetensors model, through the model and the CLI.

The GGUF mode runs the very weights transformers de-quantizes when kvcli converts the file, so
it must agree with the converted float32 model to float32 rounding (logits atol 1e-4) and
give the same greedy tokens. int8 changes the weights: its logits must stay close to float32
(the bound below is measured on these random models: max |delta| ~0.01-0.03 of logits ~3),
a published quality figure rather than equality.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from mapped_pages import SMAPS, resident_kb
from quant_runs import PROMPT, check_gguf_int_is_gguf_on_q8_0, greedy, python_matmuls, q8_0
from tiny_models import make_tiny_gguf

from kvcli.checkpoint.quant_modes import available_modes, gguf_source
from kvcli.cli import main
from kvcli.model import native
from kvcli.model.gguf_convert import resolve_model
from kvcli.model.loader import load_model
from kvcli.model.quant import QuantError, apply
from kvcli.model.quant.gguf_file import read_gguf
from kvcli.model.quant.int_weights import IntWeight
from kvcli.model.quant.load import load_quantized
from kvcli.model.quant.weights import Q4_0, Q4_1, Q8_0, QuantWeight, quantize_int8


def _kind_for(name: str) -> int:
    """Per tensor: the embedding Q8_0, layer 0 Q4_0, layer 1 and the output layer Q4_1."""
    if name.startswith("token_embd"):
        return Q8_0
    return Q4_0 if name.startswith("blk.0.") else Q4_1


@pytest.fixture(scope="module", params=["llama", "mistral"])  # tied and untied output layers
def quant_gguf(request, tiny_models, tmp_path_factory) -> Path:
    """A tiny GGUF whose matrices are quantized (gguf's own quantizer), norms float32."""
    real_add = gguf.GGUFWriter.add_tensor

    def add_tensor(self, name, array, *args, **kwargs):
        if array.ndim == 2 and array.dtype == np.float32:
            kind = gguf.GGMLQuantizationType(_kind_for(name))
            array = gguf.quants.quantize(np.ascontiguousarray(array), kind)
            return real_add(self, name, array, raw_dtype=kind)
        return real_add(self, name, array, *args, **kwargs)

    path = tmp_path_factory.mktemp("qgguf") / f"tiny-{request.param}-q.gguf"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf.GGUFWriter, "add_tensor", add_tensor)
        make_tiny_gguf(tiny_models[request.param], path)
    return path


def test_gguf_mode_equals_the_converted_float32_model(quant_gguf, kvcli_home):
    model_dir = resolve_model(str(quant_gguf))
    reference = load_model(model_dir)
    quant = load_quantized(model_dir, "gguf")
    kinds = {m.weight.kind for m in quant.modules() if isinstance(getattr(m, "weight", None),
                                                                  QuantWeight)}
    assert kinds == {Q8_0, Q4_0, Q4_1}
    want, want_logits = greedy(reference, PROMPT, 6)
    got, got_logits = greedy(quant, PROMPT, 6)
    assert got == want
    for a, b in zip(got_logits, want_logits, strict=True):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)
    assert available_modes(model_dir) == ["int8", "gguf", "gguf-int"]


@torch.no_grad()
def _with_int8_rounded_weights(model):
    """The float32 model with every matrix replaced by its int8 de-quantization."""
    for module in model.modules():
        if type(module).__name__ in ("Linear", "Embedding"):
            module.weight.copy_(quantize_int8(module.weight).dequantize())
    return model


def _no_integer_kernels() -> str:
    raise ValueError("integer-activation kernels need an x86 CPU with AVX2, FMA and F16C")


def test_int8_mode_computes_with_the_rounded_weights(tiny_models, monkeypatch):
    """Where the CPU has no integer kernels, int8 keeps float32 activations: it is the float
    model with its weights rounded."""
    monkeypatch.setattr(native, "qint_variant", lambda lib: _no_integer_kernels())
    model_dir = tiny_models["llama-gqa"]
    quant = load_quantized(model_dir, "int8")
    assert all(isinstance(m.weight, QuantWeight) for m in quant.modules()
               if type(m).__name__ in ("Linear", "QuantEmbedding"))
    want_tokens, want = greedy(_with_int8_rounded_weights(load_model(model_dir)), PROMPT[:20], 4)
    got_tokens, got = greedy(quant, PROMPT[:20], 4)
    assert got_tokens == want_tokens
    for a, b in zip(got, want, strict=True):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)
    # Quality against float32, measured on this random model: max |delta logit| 5% of the
    # largest logit (random weights with std 0.2 are far rougher than a trained model's).
    _, exact = greedy(load_model(model_dir), PROMPT[:20], 1)
    assert (got[0] - exact[0]).abs().max() < 0.1 * exact[0].abs().max()
    assert available_modes(model_dir) == ["int8"]


def test_int8_mode_runs_the_integer_kernels(tiny_models, monkeypatch):
    """With the integer kernels (any x86 CPU with AVX2), int8 is its float-activation path on
    q8_0-rounded matmul inputs, to float32 rounding."""
    model_dir = tiny_models["llama-gqa"]
    quant = load_quantized(model_dir, "int8")
    assert all(isinstance(m.weight, IntWeight) for m in quant.modules()
               if type(m).__name__ in ("Linear", "QuantEmbedding"))
    got_tokens, got = greedy(quant, PROMPT[:20], 4)
    monkeypatch.setattr(native, "qint_variant", lambda lib: _no_integer_kernels())
    real_linear = QuantWeight.linear
    monkeypatch.setattr(QuantWeight, "linear",
                        lambda self, x, bias, routes=None: real_linear(self, q8_0(x), bias, routes))
    want_tokens, want = greedy(python_matmuls(load_quantized(model_dir, "int8")), PROMPT[:20], 4)
    assert got_tokens == want_tokens
    for a, b in zip(got, want, strict=True):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)


def test_gguf_mode_needs_a_gguf_model(tiny_models):
    with pytest.raises(QuantError, match="not converted from a GGUF"):
        load_quantized(tiny_models["llama"], "gguf")
    with pytest.raises(QuantError, match="CPU with float32"):
        load_quantized(tiny_models["llama"], "int8", dtype=torch.bfloat16)


def _generate(tmp_path: Path, *args: str) -> list[dict]:
    batch = tmp_path / "in.jsonl"
    batch.write_text("".join(json.dumps({"id": f"r{i}", "prompt": p, "max_tokens": 8}) + "\n"
                             for i, p in enumerate(["Once upon a time", "The capital of"])))
    out = tmp_path / f"out{len(list(tmp_path.iterdir()))}.jsonl"
    res = CliRunner().invoke(main, ["generate", str(batch), "-o", str(out), "-q", "--ordered",
                                    "--token-ids", *args], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_cli_quantization_modes(quant_gguf, tiny_models, tmp_path, kvcli_home):
    """auto (the default) runs the GGUF in its own types, none converts it to float32: the same
    greedy tokens either way, and as --quantization gguf."""
    float_run = _generate(tmp_path, "--model", str(quant_gguf), "--quantization", "none")
    assert not (kvcli_home / "gguf").exists()  # none: the float32 conversion, no gguf directory
    auto_run = _generate(tmp_path, "--model", str(quant_gguf))
    assert (kvcli_home / "gguf").is_dir()  # auto ran the file itself
    gguf_run = _generate(tmp_path, "--model", str(quant_gguf), "--quantization", "gguf")
    assert [r["token_ids"] for r in auto_run] == [r["token_ids"] for r in float_run]
    assert [r["token_ids"] for r in gguf_run] == [r["token_ids"] for r in float_run]
    int_run = _generate(tmp_path, "--model", str(quant_gguf), "--quantization", "gguf-int")
    assert [r["token_ids"] for r in int_run] == [r["token_ids"] for r in gguf_run]
    int8_run = _generate(tmp_path, "--model", str(tiny_models["llama"]), "--quantization", "int8")
    assert [len(r["token_ids"]) for r in int8_run] == [8, 8]
    res = CliRunner().invoke(main, ["generate", "-", "--model", str(tiny_models["llama"]),
                                    "--quantization", "gguf"], input='{"prompt": "hi"}\n')
    assert res.exit_code == 2 and "not converted from a GGUF" in res.output


def test_models_lists_the_quantization_modes(quant_gguf, tiny_models, kvcli_home):
    runner = CliRunner()
    assert runner.invoke(main, ["models", "convert", str(quant_gguf)]).exit_code == 0
    listed = json.loads(runner.invoke(main, ["models", "--json"]).output)["models"]
    converted = [m for m in listed if m["source"] == str(quant_gguf)]
    assert [m["quantization"] for m in converted] == [["int8", "gguf", "gguf-int"]]
    table = runner.invoke(main, ["models"]).output.splitlines()
    assert table[0].split()[:4] == ["NAME", "SIZE", "MODE", "QUANTIZATION"]
    assert any("float32  int8,gguf,gguf-int" in line for line in table[1:])  # a conversion
    assert [m["mode"] for m in converted] == ["none"]


def test_tensor_directory_matches_gguf_reader(quant_gguf, tmp_path):
    """kvcli's metadata-skipping reader sees the same tensors as gguf's own GGUFReader."""
    meta, tensors = read_gguf(quant_gguf)
    reader = gguf.GGUFReader(str(quant_gguf))
    assert meta["general.architecture"] == "llama"
    assert meta["llama.attention.head_count"] == reader.fields[
        "llama.attention.head_count"].contents()
    assert [(t.name, t.kind, t.shape) for t in tensors] == [
        (t.name, int(t.tensor_type), tuple(int(d) for d in t.shape)) for t in reader.tensors]
    for mine, theirs in zip(tensors, reader.tensors, strict=True):
        assert np.array_equal(mine.data.reshape(-1).view(np.uint8),
                              np.asarray(theirs.data).reshape(-1).view(np.uint8))
    for cut in (4000, quant_gguf.stat().st_size - 100):  # in the metadata; in the last tensor
        bad = tmp_path / "bad.gguf"
        bad.write_bytes(quant_gguf.read_bytes()[:cut])
        with pytest.raises(QuantError, match="truncated"):
            read_gguf(bad)


@pytest.mark.slow
def test_default_model_gguf_mode_equals_float32(default_model_dir):
    """The default model's Q4_1 GGUF run in its own types gives float32's greedy tokens (its
    float32 conversion is these weights de-quantized; logits of ~20 agree to 1e-3)."""
    prompt = list(range(1000, 1040))
    want, want_logits = greedy(load_model(default_model_dir), prompt, 8)
    got, got_logits = greedy(load_quantized(default_model_dir, "gguf"), prompt, 8)
    assert got == want
    assert all(torch.allclose(a, b, atol=1e-3, rtol=1e-4)
               for a, b in zip(got_logits, want_logits, strict=True))



def test_gguf_int_mode_is_gguf_on_q8_0_activations(quant_gguf, kvcli_home, monkeypatch):
    """gguf-int is the gguf model whose every matmul input is rounded to q8_0 first. Each
    integer matmul of a whole greedy run is checked against the gguf weights' float matmul of
    the q8_0-rounded *same* input, to float32 rounding; comparing two whole runs instead lets
    an activation within rounding of a q8_0 half step take the other code on one side (seen
    on an AMD Zen 4) and propagate. Greedy tokens equal those of the gguf model computing on
    q8_0-rounded inputs, and every step stays near gguf's float activations."""
    model_dir = resolve_model(str(quant_gguf), quantization="gguf-int")
    model = load_quantized(model_dir, "gguf-int")
    assert {type(m.weight) for m in model.modules()
            if type(m).__name__ in ("Linear", "QuantEmbedding")} == {IntWeight}
    check_gguf_int_is_gguf_on_q8_0(model, model_dir, monkeypatch)


# One family: the refusal comes before any matrix is repacked (apply.py's _pack_model), so the
# output layer (tied or untied, what the other family adds) cannot change it.
@pytest.mark.parametrize("quant_gguf", ["llama"], indirect=True)
def test_gguf_int_without_native_kernels_is_a_clear_error(quant_gguf, monkeypatch, kvcli_home):
    monkeypatch.setattr(native, "load", lambda: None)  # no C compiler
    res = CliRunner().invoke(main, ["generate", "-", "--model", str(quant_gguf),
                                    "--quantization", "gguf-int"], input='{"prompt": "hi"}\n')
    assert res.exit_code == 2 and "gguf-int needs the native kernels" in res.output


@pytest.mark.skipif(not SMAPS.exists(), reason="reads /proc/self/smaps")
@pytest.mark.parametrize("quant_gguf", ["llama"], indirect=True)
def test_gguf_int_repacks_without_holding_the_files_pages(quant_gguf, kvcli_home, monkeypatch):
    """The repacked copies and the GGUF's pages never count in full together (the default
    model's load peaked ~100 MB above its steady state): each matrix's source pages are
    dropped once it is repacked, so when the next one starts at most one is resident."""
    model_dir = resolve_model(str(quant_gguf), quantization="gguf-int")
    source = gguf_source(model_dir).resolve()
    seen, sizes, real_pack = [], [], apply.pack

    def pack(weight, *args, **kwargs):
        seen.append(resident_kb(source))
        sizes.append(weight.data.numel() // 1024 + 8)  # kB, and two pages at its ends
        return real_pack(weight, *args, **kwargs)

    monkeypatch.setattr(apply, "pack", pack)
    load_quantized(model_dir, "gguf-int")
    assert len(seen) > 3 and sum(sizes) > 2 * max(sizes)  # holding them all would show
    assert max(seen) <= max(sizes), (seen, sizes)
