"""kvcli.paths: every cache directory derives from one home, read at call time."""

from pathlib import Path

from kvcli import paths


def test_every_cache_path_is_under_the_home(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KVCLI_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KVCLI_KERNELS_DIR", raising=False)
    home = tmp_path / "home"
    assert paths.kvcli_home() == home
    assert paths.models_dir() == home / "models"
    assert paths.gguf_dir() == home / "gguf"
    assert paths.kernels_dir() == home / "kernels"
    assert paths.file_digests_dir() == home / "file-digests"
    assert paths.models_dir(tmp_path / "other") == tmp_path / "other" / "models"


def test_kernels_may_live_outside_the_home(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KVCLI_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KVCLI_KERNELS_DIR", str(tmp_path / "shared"))
    assert paths.kernels_dir() == tmp_path / "shared"
    assert paths.models_dir() == tmp_path / "home" / "models"  # only the kernels move
    assert paths.kernels_dir(tmp_path / "other") == tmp_path / "other" / "kernels"


def test_the_default_home_and_the_hub_cache(monkeypatch, tmp_path: Path) -> None:
    for name in ("KVCLI_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert paths.kvcli_home() == tmp_path / ".cache" / "kvcli"
    assert paths.hub_cache_dir() == tmp_path / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert paths.hub_cache_dir() == tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    assert paths.hub_cache_dir() == tmp_path / "cache"
