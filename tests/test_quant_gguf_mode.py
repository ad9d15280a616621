"""``--quantization gguf`` runs a GGUF never converted: config and tokenizer come from the file
(kvcli/checkpoint/gguf_meta.py, derived once into $KVCLI_HOME/gguf), the weights are the file's
own tensors. It must give what the converted path gives, bit for bit, without converting."""

from __future__ import annotations

import json
import weakref
from pathlib import Path

import torch
from click.testing import CliRunner
from test_quant_model import _greedy, quant_gguf  # noqa: F401 - the tiny quantized GGUF fixture

from kvcli.checkpoint import gguf_meta
from kvcli.cli import main
from kvcli.kvstore.fingerprint import weights_digest
from kvcli.model.gguf_convert import resolve_model
from kvcli.model.kv_pool import _populate, zeroed_cpu_tensor
from kvcli.model.quant.load import load_quantized

COMPANIONS = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "chat_template.jinja")


def _conversions(home: Path) -> list[str]:
    models = home / "models"
    return sorted(p.name for p in models.iterdir()) if models.is_dir() else []


def test_gguf_mode_directory_equals_the_conversion(quant_gguf, kvcli_home):  # noqa: F811
    meta_dir = resolve_model(str(quant_gguf), quiet=True, quantization="gguf")
    assert meta_dir.parent == kvcli_home / "gguf" and _conversions(kvcli_home) == []
    assert gguf_meta.linked_gguf(meta_dir) == quant_gguf.resolve()
    converted = resolve_model(str(quant_gguf), quiet=True)  # the float32 conversion
    for name in COMPANIONS:
        assert (meta_dir / name).read_bytes() == (converted / name).read_bytes(), name
    prompt = list(range(5, 45))
    want, want_logits = _greedy(load_quantized(converted, "gguf"), prompt, 4)
    got, got_logits = _greedy(load_quantized(meta_dir, "gguf"), prompt, 4)
    assert got == want
    assert all(torch.equal(a, b) for a, b in zip(got_logits, want_logits, strict=True))
    # A disk KV cache keys gguf-mode blocks by the GGUF's bytes (model.gguf links to it).
    assert weights_digest(meta_dir, None) != weights_digest(converted, None)


def test_gguf_mode_derives_once_and_redoes_an_unfinished_directory(quant_gguf, kvcli_home,  # noqa: F811
                                                                   monkeypatch):
    first = resolve_model(str(quant_gguf), quiet=True, quantization="gguf")
    real = gguf_meta._write_metadata

    def refuse(*args):
        raise AssertionError("derived again")

    monkeypatch.setattr(gguf_meta, "_write_metadata", refuse)
    assert resolve_model(str(quant_gguf), quiet=True, quantization="gguf") == first
    (first / gguf_meta._DONE).unlink()  # as if killed before its last write
    calls = []
    monkeypatch.setattr(gguf_meta, "_write_metadata", lambda *a: calls.append(a) or real(*a))
    assert resolve_model(str(quant_gguf), quiet=True, quantization="gguf") == first
    assert len(calls) == 1 and gguf_meta.linked_gguf(first) is not None


def _run(tmp_path: Path, name: str, *args: str) -> list[list[int]]:
    batch = tmp_path / "in.jsonl"
    batch.write_text("".join(json.dumps({"prompt": p, "max_tokens": 6}) + "\n"
                             for p in ("Once upon a time", "The capital of")))
    out = tmp_path / name
    res = CliRunner().invoke(main, ["generate", str(batch), "-o", str(out), "-q", "--ordered",
                                    "--token-ids", *args], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return [json.loads(line)["token_ids"] for line in out.read_text().splitlines()]


def test_cli_gguf_mode_runs_without_a_conversion(quant_gguf, kvcli_home, tmp_path):  # noqa: F811
    quant = _run(tmp_path, "q.jsonl", "--model", str(quant_gguf), "--quantization", "gguf")
    assert _conversions(kvcli_home) == []
    assert quant == _run(tmp_path, "f.jsonl", "--model", str(quant_gguf))  # converts now
    assert len(_conversions(kvcli_home)) == 1


def test_kv_pool_is_zero_and_prefaulting_keeps_what_was_written():
    """The CPU KV pool (kvcli/model/kv_pool.py) is lazily zeroed memory; faulting its pages in
    while the engine already writes blocks must not change a byte."""
    pool = zeroed_cpu_tensor((4, 1 << 18), torch.float32, prefault=False)  # 4 MiB
    assert pool.is_contiguous() and not pool.any()
    pool[1, 7] = 3.5
    _populate(weakref.ref(pool), pool.data_ptr(), pool.numel() * 4)
    assert pool[1, 7] == 3.5 and int((pool != 0).sum()) == 1


def test_a_dropped_pool_is_freed_while_its_prefault_runs():
    """The prefault thread must not keep a dropped engine's pool (fully faulted in) alive: the
    test suite's in-process engines piled up gigabytes that way."""
    pool = zeroed_cpu_tensor((64, 1 << 20), torch.float32)  # 256 MiB: its prefault takes a while
    alive = weakref.ref(pool)
    del pool
    assert alive() is None
