"""The CPU KV pool's memory: zero pages from the kernel, faulted in by a background thread.

``torch.zeros`` of the default 1 GiB pool spent ~1.4 s of start-up writing zeros (each page's
first-touch fault plus a memset), before the first request could run. An anonymous ``mmap`` is
zero by the kernel's guarantee and costs nothing until touched; a daemon thread then asks the
kernel to fault the pages in (``MADV_POPULATE_WRITE``, Linux 5.14+), which never changes a
page's contents, so it may run while the engine already writes KV blocks. Decode steps later
meet populated pages, as they did with ``torch.zeros`` (first-touch faults inside decode steps
cost ~20 us each on a VM, see attention/kv_cache.py). Where the kernel lacks the advice
the pages are simply faulted in on first use.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import threading
import weakref

import torch

_MADV_POPULATE_WRITE = 23  # linux/mman.h
_CHUNK = 64 << 20  # bytes per madvise call


def _populate(pool: weakref.ref, address: int, size: int) -> None:
    # A weak reference to the pool's mapping: a dropped engine's pool is unmapped at once
    # instead of living (fully faulted in) until this thread ends. The mapping is held only
    # during each chunk's call, so its pages cannot be unmapped (and reused) meanwhile.
    try:
        madvise = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True).madvise
    except (OSError, AttributeError, TypeError):
        return
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for start in range(0, size, _CHUNK):
        mapping = pool()
        if mapping is None:
            return
        # ctypes releases the GIL for the call; a non-zero return (an old kernel: EINVAL) ends
        # the prefault, and the pages then fault in on first use.
        status = madvise(address + start, min(_CHUNK, size - start), _MADV_POPULATE_WRITE)
        del mapping
        if status != 0:
            return


def zeroed_cpu_tensor(shape: tuple[int, ...], dtype: torch.dtype,
                      prefault: bool = True) -> torch.Tensor:
    """A zero ``shape`` tensor in fresh anonymous memory; ``prefault``: fault its pages in on a
    daemon thread (the call returns at once)."""
    numel = 1
    for dim in shape:
        numel *= dim
    size = numel * torch.empty((), dtype=dtype).element_size()
    if size == 0:
        return torch.zeros(shape, dtype=dtype)
    buffer = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    tensor = torch.frombuffer(buffer, dtype=dtype).view(shape)  # keeps `buffer` alive
    if prefault:
        args = (weakref.ref(buffer), tensor.data_ptr(), size)
        threading.Thread(target=_populate, args=args, daemon=True, name="kvcli-kv-prefault").start()
    return tensor
