"""Decode-sized matmuls of the native kernels' AVX2 and AVX-512 builds, paired in one process.

    .venv/bin/python scripts/bench_isa_matmul.py [REPS]

ms per call summed over SmolLM2-135M's four matrix shapes (576x960 q/k/v, 576x3,072 gate/up,
1,536x576 down, 576x49,152 output layer) for Q4_1 and int8 (native/qgemm.c) and float32
(native/gemm.c, the [in, out] layout the engine stores). The builds alternate call-set by
call-set (KVCLI_NATIVE_ISA=avx512|avx2, see kvcli/model/native) and their ratio is taken per
pair; medians are printed. Needs a CPU with AVX-512 (the AVX2 build runs there too).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from kvcli.model import native
from kvcli.model.quant.weights import Q4_1, QuantWeight, quantize_int8

SHAPES = [(960, 576), (3072, 576), (576, 1536), (49152, 576)]  # (out, in)
ROWS, CALLS, ISAS = (1, 4, 16, 64), 5, ("avx512", "avx2")


def weights(kind: str) -> list:
    torch.manual_seed(0)
    dense = [torch.randn(o, i) / i**0.5 for o, i in SHAPES]
    if kind == "float32":
        return [w.T.contiguous() for w in dense]
    if kind == "int8":
        return [quantize_int8(w) for w in dense]
    return [QuantWeight(Q4_1, torch.from_numpy(quantize(w.numpy(), GGMLQuantizationType.Q4_1)),
                        tuple(w.shape)) for w in dense]


def one_pass(kind: str, ws: list, rows: int, isa: str) -> float:
    """ms per call of all four shapes on the ``isa`` build."""
    os.environ["KVCLI_NATIVE_ISA"] = isa
    lib = native.load()
    xs = [torch.randn(rows, w.shape[0] if kind == "float32" else w.shape[1]) for w in ws]
    start = time.perf_counter()
    for _ in range(CALLS):
        for x, w in zip(xs, ws, strict=True):
            native.gemm(lib, x, w, None) if kind == "float32" else w.linear(x, None)
    return (time.perf_counter() - start) * 1e3 / CALLS


def main(reps: int) -> None:
    print(f"threads {native.num_threads()}, load {os.getloadavg()[0]:.2f}, {reps} pairs")
    print("| kind | rows | avx512 ms | avx2 ms | avx2 / avx512 |")
    print("|---|---|---|---|---|")
    for kind in ("Q4_1", "int8", "float32"):
        ws = weights(kind)
        for rows in ROWS:
            for isa in ISAS:
                one_pass(kind, ws, rows, isa)  # warm-up: builds, page faults, worker threads
            times = {isa: [] for isa in ISAS}
            for rep in range(reps):
                for isa in ISAS if rep % 2 == 0 else ISAS[::-1]:
                    times[isa].append(one_pass(kind, ws, rows, isa))
            ratio = statistics.median(b / a for a, b in zip(*times.values(), strict=True))
            med = {isa: statistics.median(t) for isa, t in times.items()}
            print(f"| {kind} | {rows} | {med['avx512']:.2f} | {med['avx2']:.2f} | {ratio:.2f}x |",
                  flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 7)
