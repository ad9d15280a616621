"""Optional native CPU kernels: C compiled with the system compiler on first use, then cached.

Nothing waits on a compile step more than once per machine: the shared object is keyed by
the source, the flags, the compiler and the CPU's feature flags, and lives in
``$KVCLI_HOME/kernels``. Without a compiler (or with ``KVCLI_NATIVE=0``) ``load()`` returns
None and the engine keeps its torch path, which computes the same attention.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch

log = logging.getLogger("kvcli.native")

SOURCE = Path(__file__).with_name("paged_attention.c")
# -ffast-math lets the compiler vectorise the dot products and sums (float32 results then differ
# from torch's in the last bits, as OpenBLAS's do) and call glibc's vector expf (score exps were
# a third of the kernel). It is given to the compile step only: linking with it would add
# crtfastmath.o, which flushes denormals to zero for the whole process (torch and NumPy too).
FLAGS = ("-O3", "-march=native", "-fPIC", "-pthread", "-ffast-math")
LINK = ("-shared", "-pthread")
I64, F32P, I64P = ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return os.uname().machine


def _build(compiler: str) -> Path:
    from kvcli.model.resolve import kvcli_home

    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256("\0".join([SOURCE.read_text(), *FLAGS, *LINK, version, _cpu_flags()])
                         .encode()).hexdigest()[:16]
    target = kvcli_home() / "kernels" / f"paged_attention-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    obj = tmp[:-3] + ".o"
    try:
        for cmd in ([compiler, "-c", *FLAGS, str(SOURCE), "-o", obj],
                    [compiler, *LINK, obj, "-o", tmp, "-lm"]):
            subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120)
        os.replace(tmp, target)  # atomic: concurrent builders each publish a whole file
    finally:
        for path in (tmp, obj):
            if os.path.exists(path):
                os.unlink(path)
    return target


@cache
def load() -> ctypes.CDLL | None:
    """The compiled kernels, or None where they cannot be built (the torch path is used)."""
    if os.environ.get("KVCLI_NATIVE", "1") == "0":
        return None
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        log.info("no C compiler: native CPU kernels off")
        return None
    try:
        lib = ctypes.CDLL(str(_build(compiler)))
    except (OSError, subprocess.SubprocessError) as err:
        detail = getattr(err, "stderr", "") or err
        log.warning("native CPU kernels off: build failed: %s", detail)
        return None
    fn = lib.kvcli_paged_decode_attention
    fn.argtypes = [F32P, F32P, F32P, I64P, I64P, F32P, *[I64] * 7, ctypes.c_float, I64]
    fn.restype = ctypes.c_int
    return lib


def num_threads() -> int:
    """Kernel threads: the cores this process may run on (KVCLI_NATIVE_THREADS overrides)."""
    env = os.environ.get("KVCLI_NATIVE_THREADS")
    if env:
        return max(1, int(env))
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def paged_decode_attention(
    lib: ctypes.CDLL,
    q: torch.Tensor,  # [S, H, D] float32
    kv_layer: torch.Tensor,  # [2, num_slots, Hkv, D] float32, contiguous
    block_tables: torch.Tensor,  # [S, max_blocks] int64
    seq_lens: torch.Tensor,  # [S] int64
    block_size: int,
    window: int | None,
    scale: float,
) -> torch.Tensor:  # [S, H, D]
    q = q.contiguous()
    out = torch.empty_like(q)
    num_seqs, num_heads, head_dim = q.shape
    status = lib.kvcli_paged_decode_attention(
        q.data_ptr(), kv_layer[0].data_ptr(), kv_layer[1].data_ptr(), block_tables.data_ptr(),
        seq_lens.data_ptr(), out.data_ptr(), num_seqs, num_heads, kv_layer.shape[2], head_dim,
        block_size, block_tables.shape[1], window or 0, scale, num_threads())
    if status:
        raise MemoryError("paged decode attention: out of memory for its score buffers")
    return out
