"""Two or more builds of the native kernels' float32 decode GEMM (native/gemm.c), alternated in
one process: the way to compare a kernel change on a machine whose speed drifts.

    .venv/bin/python scripts/bench_gemm_builds.py OLD.so NEW.so [...]   (env ROWS="2 8 32 64")

A build is the shared object `kvcli` compiles into its kernels directory (``$KVCLI_HOME/kernels``
or ``$KVCLI_KERNELS_DIR``); build the old one from a checkout of the old code with its own home.
Times all 30 layers' four matrices of SmolLM2-135M (425 MB, so the weights stream from memory
as in a decode step), each build in turn per repetition, best of 12; prints the first build's
ms and GFLOP/s and every other build's time as a ratio to it.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time

import torch

LAYERS = 30
SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576)]  # (in, out): q/k/v, o, gate/up, down
REPS = 12


def best_times(libs: list[ctypes.CDLL], rows: int, weights: list[torch.Tensor]) -> list[float]:
    xs = [torch.randn(rows, w.shape[0]) for w in weights]
    ys = [torch.empty(rows, w.shape[1]) for w in weights]
    threads = torch.get_num_threads()
    best = [float("inf")] * len(libs)
    for rep in range(REPS):
        for index in [(rep + i) % len(libs) for i in range(len(libs))]:  # rotate who goes first
            start = time.perf_counter()
            for x, w, y in zip(xs, weights, ys, strict=True):
                libs[index].kvcli_gemm(x.data_ptr(), w.data_ptr(), None, y.data_ptr(), rows,
                                       w.shape[1], w.shape[0], threads)
            best[index] = min(best[index], time.perf_counter() - start)
    return best


def main() -> None:
    libs = [ctypes.CDLL(path) for path in sys.argv[1:]]
    if len(libs) < 2:
        sys.exit(__doc__)
    for lib in libs:
        lib.kvcli_gemm.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 4
    weights = [torch.randn(k, n) for _ in range(LAYERS) for k, n in SHAPES]
    for rows in map(int, os.environ.get("ROWS", "2 4 6 8 12 16 24 32 48 64").split()):
        best = best_times(libs, rows, weights)
        flop = sum(2 * rows * w.shape[0] * w.shape[1] for w in weights)
        ratios = " ".join(f"{b / best[0]:.2f}" for b in best[1:])
        print(f"{rows:3d} rows: {best[0] * 1e3:7.2f} ms {flop / best[0] / 1e9:6.1f} GFLOP/s | "
              f"others / first: {ratios}", flush=True)


if __name__ == "__main__":
    main()
