"""Two or more builds of the native integer-activation kernels (native/qint.c: --quantization
gguf-int and int8, the fast preset's), alternated in one process, on the default model's layer
matrices: its own Q4_1 blocks (gguf-int), or with TYPE=int8 the same matrices de-quantized and
re-quantized per output channel (int8 / --precision fast on a float checkpoint).

    .venv/bin/python scripts/bench_qint_builds.py OLD.so NEW.so [...]   (env ROWS="1 32 512",
                                                                       ISA=avx2|avxvnni|vnni512)

Every build packs the weights itself (the layout may differ between builds). Best of REPS per
build and row count; prints the first build's ms and every other build's time as a ratio to it,
and the largest difference between the builds' outputs (relative to the output's largest
magnitude).
"""

from __future__ import annotations

import ctypes
import os
import sys
import time

import torch

from kvcli.checkpoint.resolve import default_gguf_path
from kvcli.model.quant.gguf_weights import gguf_weights
from kvcli.model.quant.weights import QuantWeight, quantize_int8

ISAS = {"vnni512": 0, "avxvnni": 1, "avx2": 2}


def matrices() -> list[QuantWeight]:
    """The model's layer matrices, Q4_1 or (TYPE=int8) per-channel int8."""
    mats = [w for n, w in gguf_weights(default_gguf_path())
            if n.startswith("model.layers.") and isinstance(w, QuantWeight)]
    if os.environ.get("TYPE", "Q4_1") == "int8":
        mats = [quantize_int8(w.dequantize()) for w in mats]
    return mats


def packed(lib: ctypes.CDLL, w: QuantWeight) -> torch.Tensor:
    out = torch.empty(lib.kvcli_qint_packed_bytes(w.kind, *w.shape), dtype=torch.uint8)
    scale = None if w.scale is None else w.scale.data_ptr()
    assert lib.kvcli_qint_pack(w.kind, w.data.data_ptr(), scale, out.data_ptr(), *w.shape) == 0
    return out


def main() -> None:
    libs = [ctypes.CDLL(path) for path in sys.argv[1:]]
    if len(libs) < 2:
        sys.exit(__doc__)
    for lib in libs:
        lib.kvcli_qint_gemm.argtypes = [ctypes.c_int64] * 2 + [ctypes.c_void_p] * 4 + \
            [ctypes.c_int64] * 4
        lib.kvcli_qint_packed_bytes.restype = ctypes.c_int64
        lib.kvcli_qint_packed_bytes.argtypes = [ctypes.c_int64] * 3
        lib.kvcli_qint_pack.argtypes = [ctypes.c_int64] + [ctypes.c_void_p] * 3 + \
            [ctypes.c_int64] * 2
    isa, threads = ISAS[os.environ.get("ISA", "avx2")], torch.get_num_threads()
    mats = matrices()
    packs = [[packed(lib, w) for w in mats] for lib in libs]
    for rows in map(int, os.environ.get("ROWS", "1 32 512").split()):
        xs = {k: torch.randn(rows, k) for k in {w.shape[1] for w in mats}}
        outs = [[torch.empty(rows, w.shape[0]) for w in mats] for _ in libs]
        best = [float("inf")] * len(libs)
        for rep in range(int(os.environ.get("REPS", 8))):
            for index in [(rep + i) % len(libs) for i in range(len(libs))]:  # rotate the first
                start = time.perf_counter()
                for w, p, y in zip(mats, packs[index], outs[index], strict=True):
                    status = libs[index].kvcli_qint_gemm(
                        isa, w.kind, xs[w.shape[1]].data_ptr(), p.data_ptr(), None,
                        y.data_ptr(), rows, w.shape[0], w.shape[1], threads)
                    assert status == 0, (w.kind, status)
                best[index] = min(best[index], time.perf_counter() - start)
        diff = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
                   for other in outs[1:] for a, b in zip(other, outs[0], strict=True))
        macs = rows * sum(w.shape[0] * w.shape[1] for w in mats)
        ratios = " ".join(f"{b / best[0]:.2f}" for b in best[1:])
        print(f"{rows:4d} rows: {best[0] * 1e3:8.2f} ms ({macs / best[0] / 1e9:5.1f} GMAC/s, "
              f"{len(mats)} matrices) | others / first: {ratios} | max relative difference "
              f"{diff:.1e}", flush=True)


if __name__ == "__main__":
    main()
