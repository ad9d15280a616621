"""The CPU KV pool's memory: zero pages from the kernel, faulted in ahead of the engine's use.

``torch.zeros`` of the default 1 GiB pool spent ~1.4 s of start-up writing zeros (each page's
first-touch fault plus a memset), before the first request could run. An anonymous ``mmap`` is
zero by the kernel's guarantee and costs nothing until touched; a daemon thread asks the kernel
to fault pages in (``MADV_POPULATE_WRITE``, Linux 5.14+), which never changes a page's contents,
so it may run while the engine already writes KV blocks. Decode steps then meet populated pages,
as they did with ``torch.zeros`` (first-touch faults inside decode steps cost ~20 us each on a
VM, see attention/kv_cache.py).

Not all of it at once: a one-line job uses 3 of the default pool's 1,456 blocks, and faulting in
the whole GiB made it the largest part of such a job's memory (peak RSS 1.39 GiB, 0.47 GiB with
this) and took a core for the zeroing. The pool is ``(layers, 2, slots, ...)``, whose slots the
engine fills from the lowest (engine/block_pool.py hands out free blocks from the front, in
block order), so each of the ``layers * 2`` regions is faulted in from its start: 1 MiB first
(~85 blocks of the default model), and again as much as is in once the engine has written into
its second half (seen as non-zero bytes: a written K/V row is never all zeros). The lead doubles
each time, so a workload that fills the pool has all of it in after a few rounds, each well
ahead of its writes. A guess wrong either way costs page faults, never a changed byte. Where the
kernel lacks the advice the pages are simply faulted in on first use.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import threading
import time
import weakref
from collections.abc import Callable

import torch

_MADV_POPULATE_WRITE = 23  # linux/mman.h
_FIRST = 1 << 20  # bytes of each region faulted in before the engine writes anything
_PROBE = 64  # rows read at the watched offset: any block size up to 64 slots has its first there
_POLL_S = 0.02


def _madvise() -> Callable[[int, int, int], int] | None:
    try:
        madvise = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True).madvise
    except (OSError, AttributeError, TypeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return madvise


def _populate(pool: weakref.ref, address: int, size: int, regions: int = 1, row: int = 1,
              first: int = _FIRST) -> None:
    """Fault in ``regions`` equal parts of the pool at ``address`` from their starts, ahead of
    the engine's writes of ``row``-byte slots (the module docstring). A weak reference to the
    pool's mapping: a dropped engine's pool is unmapped at once instead of living until this
    thread ends; the mapping is held only during each call, so its pages cannot be unmapped
    (and reused) meanwhile."""
    madvise = _madvise()
    region, done = size // regions, 0
    while madvise is not None and done < region:
        end = min(region, max(done * 2, first))
        for start in range(address, address + regions * region, region):
            mapping = pool()
            if mapping is None:
                return
            # ctypes releases the GIL for the call; a non-zero return (an old kernel: EINVAL)
            # ends the prefault, and the pages then fault in on first use.
            # A region need not start on a page (madvise wants one): from the page it starts in.
            low = (start + done) & ~(mmap.PAGESIZE - 1)
            status = madvise(low, start + end - low, _MADV_POPULATE_WRITE)
            del mapping
            if status != 0:
                return
        done = end
        probe = min(_PROBE * row, done // 2)
        if done < region and not _wait_for_writes(pool, address + done // 2, probe):
            return


def _wait_for_writes(pool: weakref.ref, address: int, size: int) -> bool:
    """Until the engine has written into the ``size`` bytes at ``address`` (faulted in already,
    so reading them costs no fault); False: the pool was dropped meanwhile."""
    while True:
        mapping = pool()
        if mapping is None:
            return False
        written = ctypes.string_at(address, size).count(0) != size
        del mapping
        if written:
            return True
        time.sleep(_POLL_S)


def fault_in(pool: torch.Tensor) -> None:
    """Every page of a CPU ``pool`` in now, on the calling thread (the bench's untimed prepare:
    a pool filled lazily would fault its pages in during the first timed run); nothing where
    the kernel lacks the advice or the pool is not on the CPU."""
    size = pool.numel() * pool.element_size()
    if pool.device.type == "cpu" and size:  # _populate's one round: the whole pool at once
        _populate(weakref.ref(pool), pool.data_ptr(), size, first=size)


def zeroed_cpu_tensor(shape: tuple[int, ...], dtype: torch.dtype,
                      prefault: bool = True) -> torch.Tensor:
    """A zero ``shape`` tensor in fresh anonymous memory; ``prefault``: fault its pages in on a
    daemon thread (the call returns at once), each ``shape[0] * shape[1]`` region from its start
    ahead of the writes where ``shape`` is a KV pool's ``(layers, 2, slots, ...)``."""
    numel = 1
    for dim in shape:
        numel *= dim
    element = torch.empty((), dtype=dtype).element_size()
    size = numel * element
    if size == 0:
        return torch.zeros(shape, dtype=dtype)
    buffer = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    tensor = torch.frombuffer(buffer, dtype=dtype).view(shape)  # keeps `buffer` alive
    if prefault:
        regions = shape[0] * shape[1] if len(shape) >= 3 else 1
        row = size // (regions * shape[2]) if len(shape) >= 3 else element
        args = (weakref.ref(buffer), tensor.data_ptr(), size, regions, row)
        threading.Thread(target=_populate, args=args, daemon=True, name="kvcli-kv-prefault").start()
    return tensor
