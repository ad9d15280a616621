"""Two or more builds of the native kernels' quantized float-math GEMM (native/qgemm.c, the
exact `--quantization gguf` mode), alternated in one process, on the default model's own
weights: every layer's GGUF matrices (Q4_1, ~84 MB, so they stream from memory as in a decode
step) plus the tied embedding as the LM head (Q8_0) where rows <= 1.

    .venv/bin/python scripts/bench_qgemm_builds.py OLD.so NEW.so [...]   (env ROWS="1 2 8 32")

TYPE=Q4_K (or Q5_K, Q6_K) times random blocks of that k-quant instead, in the shapes of 4 layers
of a Llama-3.2-1B-sized model (hidden 2,048, FFN 8,192: SmolLM2's 576-wide rows are not whole
256-value super-blocks), ~140-200 MB.

Best of 12 per build and row count; prints the first build's ms and every other build's time
as a ratio to it, and the largest difference between the builds' outputs (relative to the
output's largest magnitude).
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from pathlib import Path

import torch

from kvcli.checkpoint.resolve import default_gguf_path
from kvcli.model.quant.gguf_weights import gguf_weights
from kvcli.model.quant.weights import QuantWeight

REPS = 12
K_SHAPES = [(2048, 2048), (512, 2048), (512, 2048), (2048, 2048), (8192, 2048), (8192, 2048),
            (2048, 8192)]  # (out, in): q, k, v, o, gate, up, down


def k_quant_layers(name: str) -> list[QuantWeight]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from k_quant_blocks import random_k_quant  # the tests' random (valid) k-quant blocks

    kind = {"Q4_K": 12, "Q5_K": 13, "Q6_K": 14}[name]
    return [random_k_quant(kind, o, i, seed) for seed, (o, i) in enumerate(K_SHAPES * 4)]


def run(lib: ctypes.CDLL, rows: int, mats: list[QuantWeight], xs: dict, ys: list) -> None:
    threads = torch.get_num_threads()
    for w, y in zip(mats, ys, strict=True):
        status = lib.kvcli_qgemm(w.kind, xs[w.shape[1]].data_ptr(), w.data.data_ptr(), None,
                                 None, y.data_ptr(), rows, w.shape[0], w.shape[1], threads)
        assert status == 0, w.kind


def main() -> None:
    libs = [ctypes.CDLL(path) for path in sys.argv[1:]]
    if len(libs) < 2:
        sys.exit(__doc__)
    for lib in libs:
        lib.kvcli_qgemm.argtypes = [ctypes.c_int64] + [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 4
    if "TYPE" in os.environ:
        layers, head = k_quant_layers(os.environ["TYPE"]), []
    else:
        everything = [(n, w) for n, w in gguf_weights(default_gguf_path())
                      if isinstance(w, QuantWeight)]
        layers = [w for n, w in everything if n.startswith("model.layers.")]
        head = [w for n, w in everything if "embed" in n]
    for rows in map(int, os.environ.get("ROWS", "1 2 8 32").split()):
        mats = layers + (head if rows <= 1 else [])
        xs = {k: torch.randn(rows, k) for k in {w.shape[1] for w in mats}}
        outs = [[torch.empty(rows, w.shape[0]) for w in mats] for _ in libs]
        best = [float("inf")] * len(libs)
        for rep in range(REPS):
            for index in [(rep + i) % len(libs) for i in range(len(libs))]:  # rotate the first
                start = time.perf_counter()
                run(libs[index], rows, mats, xs, outs[index])
                best[index] = min(best[index], time.perf_counter() - start)
        diff = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
                   for other in outs[1:] for a, b in zip(other, outs[0], strict=True))
        ratios = " ".join(f"{b / best[0]:.2f}" for b in best[1:])
        print(f"{rows:3d} rows: {best[0] * 1e3:7.2f} ms ({len(mats)} matrices) | others / first: "
              f"{ratios} | max relative difference {diff:.1e}", flush=True)


if __name__ == "__main__":
    main()
