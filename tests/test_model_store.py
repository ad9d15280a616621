"""kvcli's model store ($KVCLI_HOME/models): checksums, listed names, one copy per GGUF, quiet
conversions, hub downloads, and non-finite logits as a per-request error."""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvcli.checkpoint import integrity, resolve
from kvcli.checkpoint.convert import MARKER, read_record
from kvcli.checkpoint.resolve import DEFAULT_MODEL_NAME, ModelResolveError, list_models
from kvcli.cli import main
from kvcli.engine.llm_engine import NONFINITE_LOGITS
from kvcli.model.gguf_convert import resolve_model

README = Path(__file__).resolve().parents[1] / "README.md"


def _generate(model: str, lines: list[dict], *args: str):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "in.jsonl")
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        return CliRunner().invoke(main, ["generate", str(path), "--model", model, "--max-tokens",
                                         "3", "-q", *args], catch_exceptions=False)


def _overwrite_middle(path: Path, size: int) -> None:
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        f.write(b"\xff" * size)


# ---- checksums of converted files ---------------------------------------------------
def test_a_damaged_converted_file_is_an_error_naming_the_directory(tiny_models, kvcli_home):
    converted = resolve_model(str(tiny_models.gguf("llama")))
    files = read_record(converted).files
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(files)
    assert files["model.safetensors"]["sha256"] == integrity.sha256_file(
        converted / "model.safetensors")
    _overwrite_middle(converted / "model.safetensors", 4096)  # same size, new mtime
    # --quantization none: the float32 conversion (auto would run the GGUF itself)
    result = _generate(str(tiny_models.gguf("llama")), [{"prompt": "The fox"}],
                       "--quantization", "none")
    assert result.exit_code == 2 and result.stdout == ""
    [line] = result.stderr.splitlines()
    assert "model.safetensors was modified after kvcli wrote it" in line
    assert f"delete the directory {converted}" in line
    assert f"the next run converts {tiny_models.gguf('llama').resolve()} again" in line


def test_a_truncated_converted_file_names_the_cache_directory(tiny_models, kvcli_home):
    converted = resolve_model(str(tiny_models.gguf("llama")))
    weights = converted / "model.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[: size // 2])
    with pytest.raises(ModelResolveError, match=rf"is {size // 2:,} bytes, kvcli wrote {size:,}"
                                                rf".*delete the directory {converted}"):
        resolve_model(str(tiny_models.gguf("llama")))
    # A conversion from before checksums adopts the files as they are; the loader then names
    # the directory too.
    record = json.loads((converted / MARKER).read_text())
    del record["files"]
    (converted / MARKER).write_text(json.dumps(record))
    result = _generate(str(tiny_models.gguf("llama")), [{"prompt": "The fox"}],
                       "--quantization", "none")
    assert result.exit_code == 2
    [line] = result.stderr.splitlines()
    assert f"{weights}: unreadable (SafetensorError: " in line
    assert f"delete the directory {converted}" in line


def test_verification_hashes_only_after_a_file_changes(tiny_models, kvcli_home, monkeypatch):
    converted = resolve_model(str(tiny_models.gguf("llama")))
    hashed: list[str] = []
    real = integrity.sha256_file
    monkeypatch.setattr(integrity, "sha256_file", lambda p: hashed.append(p.name) or real(p))
    assert resolve_model(str(tiny_models.gguf("llama"))) == converted
    assert hashed == []  # unchanged: a stat per file
    os.utime(converted / "config.json", ns=(1, 10**18))  # touched, not changed
    assert resolve_model(str(tiny_models.gguf("llama"))) == converted
    assert hashed == ["config.json"]
    assert read_record(converted).files["config.json"]["mtime_ns"] == 10**18
    assert resolve_model(str(tiny_models.gguf("llama"))) == converted
    assert hashed == ["config.json"]  # the new mtime was recorded


# ---- names `kvcli models` lists; one conversion per GGUF content ------------------------
def test_every_name_kvcli_models_lists_works_with_model(tiny_models, kvcli_home, monkeypatch):
    monkeypatch.setattr(resolve, "default_gguf_path", lambda: tiny_models.gguf("llama"))
    resolve_model(str(tiny_models.gguf("mistral")))
    resolve_model(None)
    listed = json.loads(CliRunner().invoke(main, ["models", "--json"]).stdout)["models"]
    names = [m["name"] for m in listed]
    assert names[0] == DEFAULT_MODEL_NAME and names[1].startswith("gguf-tiny-mistral-")
    for name in names:
        result = _generate(name, [{"prompt": "The fox"}])
        assert result.exit_code == 0, (name, result.stderr)
    (kvcli_home / "models" / "gguf-half-0123").mkdir()  # a conversion that was interrupted
    assert {i.name: i.status for i in list_models()}["gguf-half-0123"] == "incomplete"
    with pytest.raises(ModelResolveError, match="gguf-half-0123 is an unfinished conversion"):
        resolve_model("gguf-half-0123")


def test_a_copy_of_a_converted_gguf_reuses_its_conversion(tiny_models, kvcli_home, tmp_path,
                                                          monkeypatch):
    monkeypatch.setattr(resolve, "default_gguf_path", lambda: tiny_models.gguf("llama"))
    copy = Path(shutil.copy(tiny_models.gguf("llama"), tmp_path / "SmolLM2-copy.gguf"))
    assert resolve_model(str(copy)) == kvcli_home / "models" / DEFAULT_MODEL_NAME
    mistral = resolve_model(str(tiny_models.gguf("mistral")))
    other = Path(shutil.copy(tiny_models.gguf("mistral"), tmp_path / "m.gguf"))
    assert resolve_model(str(other)) == mistral
    assert sorted(p.name for p in (kvcli_home / "models").iterdir()) == sorted(
        [DEFAULT_MODEL_NAME, mistral.name])
    # The same size with other bytes is another model: converted on its own.
    _overwrite_middle(other, 8)
    assert resolve_model(str(other)) not in (mistral, kvcli_home / "models" / DEFAULT_MODEL_NAME)


# ---- conversion output: bars on a terminal only, nothing with --quiet ------------------------
class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("stderr, quiet", [("pipe", False), ("pipe", True), ("terminal", False)])
def test_conversion_progress_depends_on_the_terminal_and_quiet(tiny_models, kvcli_home,
                                                               monkeypatch, stderr, quiet):
    gguf_path = tiny_models.gguf("llama")  # built first: the fixture prints bars of its own
    stream = _Terminal() if stderr == "terminal" else io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    resolve_model(str(gguf_path), quiet=quiet)
    text = stream.getvalue()
    if quiet:
        assert text == ""
    elif stderr == "pipe":  # one line per phase, no carriage-return bar updates
        lines = text.splitlines()
        assert "\r" not in text and 3 <= len(lines) <= 5, text
        assert all(line.startswith("kvcli: ") for line in lines)
        assert lines[-1].startswith("kvcli: converted tiny-llama.gguf in ")
    else:
        assert "\r" in text and "de-quantizing" in text  # the libraries' bars, as before


def test_generate_quiet_converts_without_a_word(tiny_models, kvcli_home):
    result = _generate(str(tiny_models.gguf("mistral")), [{"prompt": "The fox"}])
    assert result.exit_code == 0 and result.stderr == ""


# ---- Hugging Face repo ids: downloaded when online, said so ----------------------------------
def test_a_repo_missing_from_the_hub_cache_is_downloaded_and_said_so(tiny_models, tmp_path,
                                                                     monkeypatch, capsys):
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    snapshot = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / "0123"
    calls: list[dict] = []

    def fake_download(repo_id: str, **kwargs):  # the hub, minus the network
        calls.append(kwargs)
        if kwargs.get("local_files_only"):
            raise FileNotFoundError(repo_id)
        shutil.copytree(tiny_models["qwen3"], snapshot)
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    assert resolve_model("acme/tiny") == snapshot.resolve()
    err = capsys.readouterr().err
    assert "kvcli: downloading acme/tiny from the Hugging Face hub" in err
    assert "HF_HUB_OFFLINE=1" in err and "*.safetensors" in calls[-1]["allow_patterns"]
    assert "*.bin" not in calls[-1]["allow_patterns"]  # never pickles unless --allow-pickle
    readme = " ".join(README.read_text().split())
    assert "downloaded from the Hugging Face hub when it is not in the local hub cache" in readme
    assert "HF_HUB_OFFLINE=1" in readme


# ---- non-finite logits --------------------------------------------------------------
def test_non_finite_logits_are_that_requests_error(tiny_models, tmp_path):
    from safetensors.torch import load_file, save_file

    model = Path(shutil.copytree(tiny_models["mistral"], tmp_path / "m"))  # untied lm_head
    weights = load_file(model / "model.safetensors")
    weights["model.embed_tokens.weight"][77] = float("nan")  # token 77: damaged weights
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    lines = [{"id": "ok", "prompt_token_ids": [5, 6, 7]},
             {"id": "bad", "prompt_token_ids": [5, 77, 7]},
             {"id": "bad-sampled", "prompt_token_ids": [77, 9], "temperature": 0.8, "n": 2},
             {"id": "ok-sampled", "prompt_token_ids": [9, 9], "temperature": 0.8}]
    result = _generate(str(model), lines)
    assert result.exit_code == 1
    by_id = {r["id"]: r for r in map(json.loads, result.stdout.splitlines())}
    for bad in ("bad", "bad-sampled"):
        assert by_id[bad]["error"]["code"] == "engine_error"
        assert by_id[bad]["error"]["message"] == NONFINITE_LOGITS
    clean = _generate(str(tiny_models["mistral"]), [lines[0], lines[3]])
    expected = {r["id"]: r for r in map(json.loads, clean.stdout.splitlines())}
    assert by_id["ok"] == expected["ok"] and by_id["ok-sampled"] == expected["ok-sampled"]
