"""The model fingerprint: everything the cached K/V of a token depends on besides its prefix.

Blocks are keyed by ``(fingerprint, chain hash)``. The chain hash names the prefix
(tokens and ``cache_salt``); the fingerprint names what turns a prefix into K/V:
the weights' and config's bytes, dtype, KV-cache dtype (``--kv-cache-dtype``: an int8 block's
bytes are codes and scales, never float32 K/V), device type (CPU and CUDA kernels round
differently, and outputs with the cache must equal outputs without it), weight
quantization (``--quantization``), block size, attention layout, RoPE settings and kvcli's
KV format version. Changing any of them changes the fingerprint, so a block of another
model or setting is never found. Kernel routes (native or torch matmuls, chunk sizes) are
not keyed: they differ in the last bits exactly as the in-memory cache already mixes K/V
computed in chunks of different sizes.

Hashing the weights (0.5 GB for SmolLM2-135M, ~0.3 s) is done once per file version: the
digest is remembered in ``$KVCLI_HOME/file-digests`` under a key that no rewrite keeps.
Size and mtime alone are not that key: a build that normalises timestamps (Nix, reproducible
builds, ``touch -r``, ``os.utime``) rewrites weights in place with both unchanged, and the old
digest would serve the old model's K/V. The key is the resolved path, device, inode, size,
mtime and ctime (which no user can set back: any write or ``utime`` moves it) plus a SHA-256
of sampled pages (head, tail and eight 64 KiB pages at fixed offsets, under 1 MB read), so a
file system with a coarse or unreliable ctime still sees a change in most rewrites. Anything
that differs means hashing the whole file again.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

#: Bumped whenever the bytes kvcli stores for a block change meaning (layout, RoPE placement).
KV_FORMAT_VERSION = 1

# Files whose bytes the K/V depend on; tokenizer files do not matter (blocks hold token ids).
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")  # .gguf: gguf mode


@dataclass(slots=True, frozen=True)
class ModelFingerprint:
    weights_sha256: str
    architecture: str
    dtype: str
    device_type: str
    block_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    rope: dict[str, Any] = field(hash=False)
    # EngineConfig.quantization (int8, gguf), narrower float weights ("bfloat16 weights": the
    # engine's kv_disk.weights_form) or none
    quantization: str = "none"
    # The pool's element type where it differs from ``dtype`` (--kv-cache-dtype int8); "" when
    # it is the model's dtype, and then not keyed, so caches written before it still match.
    kv_cache_dtype: str = ""
    kv_format_version: int = KV_FORMAT_VERSION
    label: str = field(default="", compare=False)  # the model as the user named it (not keyed)

    def describe(self) -> dict[str, Any]:
        return asdict(self)

    def digest(self) -> bytes:
        keyed = {k: v for k, v in asdict(self).items()
                 if k != "label" and not (k == "kv_cache_dtype" and not v)}
        return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).digest()


def model_fingerprint(cfg: Any, model_dir: Path, dtype: str, device_type: str, block_size: int,
                      label: str = "", digest_cache: Path | None = None,
                      quantization: str | None = None,
                      kv_cache_dtype: str | None = None) -> ModelFingerprint:
    """The fingerprint of a model from its ``ModelConfig`` (kvcli/checkpoint/config.py, torch-free),
    so the engine and a torch-free caller (the audit) compute the same key."""
    return ModelFingerprint(
        weights_sha256=weights_digest(model_dir, digest_cache), architecture=cfg.architecture,
        dtype=dtype, device_type=device_type, block_size=block_size, num_layers=cfg.num_layers,
        num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, rope=asdict(cfg.rope),
        quantization=quantization or "none",
        kv_cache_dtype="" if kv_cache_dtype in (None, "auto", dtype) else kv_cache_dtype,
        label=label)


def weights_digest(model_dir: Path, digest_cache: Path | None) -> str:
    """sha256 over the names and contents of ``config.json`` and the weight files."""
    files = sorted(p for p in Path(model_dir).iterdir()
                   if p.is_file() and (p.name == "config.json" or p.suffix in _WEIGHT_SUFFIXES))
    if not any(p.suffix in _WEIGHT_SUFFIXES for p in files):
        raise ValueError(f"{model_dir}: no weight files to fingerprint")
    whole = hashlib.sha256()
    for path in files:
        whole.update(path.name.encode() + b"\0" + file_digest(path, digest_cache).encode())
    return whole.hexdigest()


def file_digest(path: Path, digest_cache: Path | None) -> str:
    """sha256 of one file's bytes, remembered under :func:`version_key` (module docstring)."""
    resolved = path.resolve()
    with open(resolved, "rb") as f:
        key = version_key(resolved, os.fstat(f.fileno()), f)
        memo = digest_cache / key if digest_cache is not None else None
        if memo is not None:
            try:
                text = memo.read_text().strip()
                if len(text) == 64:
                    return text
            except OSError:
                pass
        f.seek(0)
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    if memo is not None:
        _remember(memo, digest)
    return digest


SAMPLE_PAGE = 64 << 10
SAMPLE_PAGES = 8  # besides the head and the tail


def version_key(resolved: Path, st: os.stat_result, f: BinaryIO) -> str:
    """A key that changes whenever the file's bytes do: identity and times from ``st``, and a
    hash of sampled pages of the open file ``f`` (st's own size fixes their offsets)."""
    size = st.st_size
    key = hashlib.sha256(f"{resolved}\0{st.st_dev}\0{st.st_ino}\0{size}\0{st.st_mtime_ns}\0"
                         f"{st.st_ctime_ns}\0".encode())
    offsets = {0, max(0, size - SAMPLE_PAGE)}
    offsets.update(size * i // (SAMPLE_PAGES + 1) for i in range(1, SAMPLE_PAGES + 1))
    for offset in sorted(offsets):
        f.seek(offset)
        key.update(f.read(SAMPLE_PAGE))
    return key.hexdigest()


def _remember(memo: Path, digest: str) -> None:
    """Best effort: an unwritable cache only means hashing again next time."""
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(f"{memo.name}.{os.getpid()}.tmp")
        tmp.write_text(digest + "\n")
        os.replace(tmp, memo)
    except OSError:
        pass
