"""One decode step's paged attention (all 30 layers of SmolLM2-135M, 32 sequences of distinct's
context lengths, blocks scattered over the pool) for each KV cache dtype, alternated in one
process, and optionally for several builds of the kernels (so the K/V stream from memory as in
a real step, not from cache).

    .venv/bin/python scripts/bench_decode_attention.py [BUILD.so ...]   (env SEQS, LEN, DTYPES)

Without builds it times the kernels `kvcli` compiles here; prints ms per step per dtype and build
and the K/V bytes a step reads.
"""

from __future__ import annotations

import ctypes
import os
import random
import sys
import time

import torch

from kvcli.model import native
from kvcli.model.attention.native_int8 import INT8_ROW_EXTRA

LAYERS, H, HKV, D, BS, REPS = 30, 9, 3, 64, 16, 9


def huge(t: torch.Tensor) -> torch.Tensor:
    """``t`` (not yet touched) advised into transparent huge pages where HUGE=1."""
    if os.environ.get("HUGE") == "1":
        libc = ctypes.CDLL(None)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        start = -(-t.data_ptr() // (2 << 20)) * (2 << 20)
        end = (t.data_ptr() + t.numel() * t.element_size()) // (2 << 20) * (2 << 20)
        if end > start:
            assert libc.madvise(start, end - start, 14) == 0  # MADV_HUGEPAGE
    return t


def pools(kind: str, slots: int) -> list[torch.Tensor]:
    out = []
    for _ in range(LAYERS):
        x = huge(torch.empty(2, slots, HKV, D)).normal_()
        if kind == "float32":
            out.append(x)
        elif kind == "bfloat16":
            out.append(huge(torch.empty(x.shape, dtype=torch.bfloat16)).copy_(x))
        else:
            layer = huge(torch.empty(2, slots, HKV, D + INT8_ROW_EXTRA, dtype=torch.uint8))
            lib = native.load()
            every = torch.arange(slots, dtype=torch.int64)
            for half in range(2):
                native.quantize_kv(lib, x[half], every, layer[half])
            out.append(layer)
    return out


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """The decode kernels' signatures (native.load_variant's), for a build loaded by path: only
    these, so an older build, which may lack later entry points, loads too."""
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    for suffix in ("", "_int8", "_bf16"):
        fn = getattr(lib, f"kvcli_paged_decode_attention{suffix}")
        fn.argtypes = [ptr] * 6 + [i64] * 7 + [ctypes.c_float, i64]
        fn.restype = ctypes.c_int
    return lib


def main() -> None:
    seqs = int(os.environ.get("SEQS", "32"))
    rng = random.Random(0)
    lens = [rng.randint(50, 500) + int(os.environ.get("LEN", "32")) for _ in range(seqs)]
    max_blocks = max(-(-n // BS) for n in lens)
    num_blocks = sum(-(-n // BS) for n in lens) + 8
    order = list(range(num_blocks))
    if os.environ.get("SHUFFLE", "1") == "1":  # blocks scattered over the pool
        rng.shuffle(order)
    tables = torch.zeros(seqs, max_blocks, dtype=torch.int64)
    at = 0
    for s, n in enumerate(lens):
        for b in range(-(-n // BS)):
            tables[s, b] = order[at]
            at += 1
    seq_lens = torch.tensor(lens, dtype=torch.int64)
    q = torch.randn(seqs, H, D)
    libs = [declare(ctypes.CDLL(p)) for p in sys.argv[1:]] or [native.load()]
    kinds = os.environ.get("DTYPES", "float32,int8").split(",")
    data = {k: pools(k, num_blocks * BS) for k in kinds}
    best = {(k, i): float("inf") for k in kinds for i in range(len(libs))}
    for _rep in range(REPS):
        for k in kinds:
            for i, lib in enumerate(libs):
                start = time.perf_counter()
                for layer in data[k]:
                    native.paged_decode_attention(lib, q, layer, tables, seq_lens, BS, None, 0.125)
                best[k, i] = min(best[k, i], time.perf_counter() - start)
    tokens = sum(lens)
    for (k, i), t in best.items():
        row = data[k][0][0, 0].numel() * data[k][0].element_size()  # all KV heads of a token
        mb = tokens * row * 2 * LAYERS / 1e6
        print(f"{k:9s} build {i}: {t * 1e3:7.2f} ms/step  {mb:6.0f} MB K/V  {mb / t / 1e3:5.1f} GB/s")


if __name__ == "__main__":
    main()
