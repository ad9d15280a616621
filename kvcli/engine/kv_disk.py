"""The engine side of the disk KV cache: blocks between the KV tensor and kvcli/kvstore.

``load`` runs while the scheduler walks a request's prefix (before the step that
attends the block): one file read, checksum, one copy into the pool block. ``save``
runs right after a step: the blocks it filled are gathered out of the KV tensor in
one copy (a block may be reused by the next step) and handed to the write-behind
thread; nothing else happens in the step. Blocks already on disk are not copied.

On CPU both copies go through NumPy views of the pool's bytes: one single-threaded
memcpy per contiguous run. torch's threaded ``copy_`` of a strided block measured
0.38 ms per SmolLM2 block with one thread and 4.5 ms with two on this busy 2-core
machine, NumPy 0.12 ms. Written blocks' buffers are reused (up to 32 MiB): a fresh
9.6 MB copy-out buffer cost 25-75 ms of first-touch page faults per step, the same
copy into touched memory 6 ms.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kvcli.hashing import BlockHash
from kvcli.kvstore import DEFAULT_MAX_BYTES, WriteBehind, open_model_store
from kvcli.kvstore.fingerprint import model_fingerprint
from kvcli.kvstore.store import ModelStore

MAX_SPARE_BYTES = 32 << 20  # copy-out buffers kept for reuse after their block is written


class DiskKVTier:
    def __init__(self, store: ModelStore, writer: WriteBehind, kv: torch.Tensor,
                 block_size: int) -> None:
        layers, two, slots, heads, head_dim = kv.shape
        self.store = store
        self.writer = writer
        self.kv = kv
        self.block_size = block_size
        # [block, layers, 2, block_size, heads, head_dim]: one block is one index of a view.
        self._by_block = kv.view(layers, two, slots // block_size, block_size, heads, head_dim) \
            .permute(2, 0, 1, 3, 4, 5)
        self._block_shape = (layers, two, block_size, heads, head_dim)
        self.block_bytes = layers * two * block_size * heads * head_dim * kv.element_size()
        # The same blocks as bytes, [block, layers, 2, block_size, heads, head_dim * itemsize]
        # (a view: any dtype, bfloat16 included, since NumPy only sees uint8).
        self._host: np.ndarray | None = None
        if kv.device.type == "cpu":
            raw = kv.view(torch.uint8).numpy()
            self._host = raw.reshape(layers, two, slots // block_size, block_size, heads, -1) \
                .transpose(2, 0, 1, 3, 4, 5)
        self._spare: list[np.ndarray] = []  # appended by the writer thread, popped here
        self.load_s = 0.0  # reading, checking and copying into the pool
        self.save_s = 0.0  # the step's share of writing: the gather copy

    def load(self, block_hash: BlockHash, block_id: int) -> bool:
        t0 = time.perf_counter()
        payload = self.store.read(block_hash, self.block_bytes)  # another size: never read
        if payload is None:
            return False
        if self._host is not None:
            np.copyto(self._host[block_id],
                      np.frombuffer(payload, np.uint8).reshape(self._host.shape[1:]))
        else:
            src = torch.frombuffer(payload, dtype=torch.uint8).view(self.kv.dtype)
            self._by_block[block_id].copy_(src.view(self._block_shape))
        self.load_s += time.perf_counter() - t0
        return True

    def save(self, blocks: list[tuple[int, BlockHash]]) -> None:
        if not blocks or self.writer.stopped:
            return
        t0 = time.perf_counter()
        todo = [(bid, h) for bid, h in blocks if not self.store.contains(h)]
        room = len(todo)
        while room and not self.writer.has_room(room * self.block_bytes):
            room -= 1
        self.writer.count_dropped(len(todo) - room)
        todo = todo[:room]
        if self._host is None:
            self._save_from_device(todo)
        else:
            self._save_from_host(self._host, todo)
        self.save_s += time.perf_counter() - t0

    def _save_from_host(self, host: np.ndarray, todo: list[tuple[int, BlockHash]]) -> None:
        for block_id, block_hash in todo:
            buf = self._spare.pop() if self._spare else np.empty(self.block_bytes, np.uint8)
            np.copyto(buf.reshape(host.shape[1:]), host[block_id])
            recycle = partial(self._recycle, buf)
            if not self.writer.offer(block_hash, memoryview(buf), recycle):
                recycle()

    def _save_from_device(self, todo: list[tuple[int, BlockHash]]) -> None:
        """One gather and one device-to-host copy for all blocks (CUDA and other devices)."""
        if not todo:
            return
        ids = torch.tensor([bid for bid, _ in todo], device=self.kv.device)
        gathered = self._by_block.index_select(0, ids).contiguous().cpu()
        rows = gathered.view(torch.uint8).reshape(len(todo), -1).numpy()
        for row, (_, block_hash) in zip(rows, todo, strict=True):
            self.writer.offer(block_hash, memoryview(row))

    def _recycle(self, buf: np.ndarray) -> None:
        if (len(self._spare) + 1) * self.block_bytes <= MAX_SPARE_BYTES:
            self._spare.append(buf)

    def report(self, hit_tokens: int, flush: bool = True) -> dict[str, Any]:
        """The disk-cache numbers so far; ``flush`` waits for queued writes first, so the
        write counts are complete (never while steps run: Ray workers report periodically)."""
        if flush:
            self.writer.flush()
        stats = self.store.stats.to_dict()
        load_gb_s = self.store.stats.bytes_read / self.load_s / 1e9 if self.load_s else None
        return {"dir": str(self.store.root), "hit_tokens": hit_tokens, **stats,
                "load_s": round(self.load_s, 4), "save_s": round(self.save_s, 4),
                "load_gb_s": None if load_gb_s is None else round(load_gb_s, 3),
                "write_stopped": self.writer.stopped}

    def close(self) -> None:
        self.writer.close()


def open_disk_tier(cache_dir: str, max_bytes: int | None, model: Any, model_dir: Path,
                   kv: torch.Tensor, block_size: int, label: str,
                   quantization: str | None = None, insecure: bool = False,
                   dtype: str | None = None) -> DiskKVTier:
    """A tier for ``model`` (loaded from ``model_dir``, in ``dtype``: default the pool's) over
    the cache directory ``cache_dir``; the pool's own element type keys int8 blocks apart."""
    from kvcli.model.attention import kv_cache_dtype_name
    from kvcli.paths import file_digests_dir

    kv_dtype = kv_cache_dtype_name(kv.dtype)
    fingerprint = model_fingerprint(model.config, model_dir, dtype or kv_dtype, kv.device.type,
                                    block_size, label, file_digests_dir(), quantization, kv_dtype)
    store = open_model_store(cache_dir, fingerprint, insecure)
    return DiskKVTier(store, WriteBehind(store, max_bytes or DEFAULT_MAX_BYTES), kv, block_size)


def disk_tier_for(config: Any, model: Any, model_dir: Path | None, kv: torch.Tensor) -> DiskKVTier:
    """The tier an ``EngineConfig`` with ``kv_cache_dir`` asks for (ValueError: it cannot be)."""
    if not config.enable_prefix_caching:
        raise ValueError("kv_cache_dir: the disk cache needs prefix caching enabled")
    if model_dir is None:
        raise ValueError("kv_cache_dir: needs the model directory (to fingerprint weights)")
    return open_disk_tier(config.kv_cache_dir, config.kv_cache_dir_max_bytes, model,
                          Path(model_dir), kv, config.block_size,
                          config.model or str(model_dir), weights_form(config, model),
                          config.kv_cache_dir_insecure,
                          str(getattr(model, "compute_dtype", kv.dtype)).removeprefix("torch."))


def weights_form(config: Any, model: Any) -> str | None:
    """What the K/V depend on besides the checkpoint's bytes: the quantization, or float weights
    stored narrower than float32 (--dtype bfloat16 on the CPU keeps a float32 KV cache whose
    values differ from float32 weights'); None: float32 weights. from_config resolved "auto";
    an engine built around a model passed in (the bench, tests) runs that model as it is,
    float unless the config names a quantized mode."""
    if config.quantization not in (None, "auto", "none"):
        # fast's bfloat16 or int8 prefill (quant/int_weights.py) and int8 batched decode
        # (quant/w8a8.py) copies compute other K/V than the integers on the weights' own blocks
        routes = getattr(model, "routes", None)
        wide = " with bfloat16 prefill" if getattr(routes, "bf16_prefill_rows", 0) else ""
        wide += " with int8 prefill" if getattr(routes, "i8_prefill_rows", 0) else ""
        if wide and any(getattr(getattr(m, "wide", None), "tiles", False) for m in model.modules()):
            wide += " (MLP front on AMX-BF16 tiles)"  # packed.SwiGLU: oneDNN's sums, reordered
        few = " with int8 batched decode" if getattr(routes, "w8a8_rows", 0) else ""
        return f"{config.quantization}{wide}{few}"
    platform = getattr(model, "platform", None)
    weights = getattr(platform, "weights", torch.float32)
    computed = getattr(model, "compute_dtype", getattr(platform, "kv_dtype", weights))
    if weights == computed:  # the dtype keys it already
        return None
    return str(weights).removeprefix("torch.") + " weights"
