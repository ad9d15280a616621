"""Where kvcli keeps what it caches: the home directory and every path under it (torch-free).

One place for the layout, so the model store, the C kernel loader, the disk KV tier and the
auditor never reach into each other for a directory. Everything is read at call time
(``$KVCLI_HOME`` may change between calls, as the tests set it).
"""

from __future__ import annotations

import os
from pathlib import Path

# The default model (--model's default), converted once into models_dir() / DEFAULT_MODEL_NAME;
# here, not in checkpoint/, so the engine's options read it without loading the resolver.
DEFAULT_MODEL_NAME = "smollm2-135m"


def kvcli_home(home: Path | None = None) -> Path:
    """kvcli's cache root: `home`, else $KVCLI_HOME, else ~/.cache/kvcli."""
    if home is not None:
        return Path(home)
    env = os.environ.get("KVCLI_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kvcli"


def models_dir(home: Path | None = None) -> Path:
    """Converted models (the names `kvcli models` lists)."""
    return kvcli_home(home) / "models"


def gguf_dir(home: Path | None = None) -> Path:
    """Config-and-tokenizer directories of GGUFs run as they are (``--quantization gguf``)."""
    return kvcli_home(home) / "gguf"


def kernels_dir(home: Path | None = None) -> Path:
    """The compiled C kernels, one shared library per source/flags/compiler/CPU key:
    ``home``'s, else $KVCLI_KERNELS_DIR (one build shared by several homes, as the test
    suite's processes share one), else $KVCLI_HOME's."""
    env = os.environ.get("KVCLI_KERNELS_DIR")
    if home is None and env:
        return Path(env).expanduser()
    return kvcli_home(home) / "kernels"


def file_digests_dir(home: Path | None = None) -> Path:
    """Remembered weight-file digests of the disk KV tier's fingerprint (engine and auditor)."""
    return kvcli_home(home) / "file-digests"


def calibration_dir(home: Path | None = None) -> Path:
    """`kvcli bench --calibrate`'s measured prefill/decode rates, one file per model, CPU and dtype."""
    return kvcli_home(home) / "calibration"


def hub_cache_dir() -> Path:
    """Hugging Face's hub cache, where `--model ORG/NAME` snapshots live."""
    # Read at call time: huggingface_hub reads these once, when it is imported.
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return Path(os.environ[name]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"
