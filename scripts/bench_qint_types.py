"""One decoder layer's matmuls on the integer kernels (--quantization gguf-int) per weight type,
at the same shapes: Q4_0 / Q4_1 / Q8_0 against the k-quants Q4_K / Q5_K / Q6_K, and beside them
the same weights' float-activation matmuls (--quantization gguf: qgemm.c up to 64 rows). The weights are
random blocks (every bit pattern is a valid block; fp16 scales set small), so only the speed
means anything. Default shapes: a Llama-3.2-1B layer (hidden 2048, k/v 512, FFN 8192), whose
widths hold whole 256-weight superblocks.

    PYTHONPATH=. python scripts/bench_qint_types.py [--rows 1,64] [--types Q4_1,Q4_K]
"""

from __future__ import annotations

import argparse
import os
import platform
from dataclasses import replace

import numpy as np
import torch
from bench_qint_layer import best_ms  # the sibling script: scripts/ is on sys.path

from kvcli.model import native
from kvcli.model.quant.int_weights import INT_TYPES, pack
from kvcli.model.quant.weights import BLOCK_ELEMS, QuantWeight
from kvcli.model.routes import process_routes

BLOCK_BYTES = {2: 18, 3: 20, 8: 34, 12: 144, 13: 176, 14: 210}
FP16_AT = {2: (0,), 3: (0, 2), 8: (0,), 12: (0, 2), 13: (0, 2), 14: (208,)}
SHAPES = ((2048, 2048), (512, 2048), (512, 2048), (2048, 2048), (8192, 2048), (8192, 2048),
          (2048, 8192))  # q, k, v, o, gate, up, down as [out, in]


def random_weight(kind: int, out_f: int, in_f: int, rng: np.random.Generator) -> QuantWeight:
    per = BLOCK_ELEMS.get(kind, 32)
    blocks = rng.integers(0, 256, (out_f, in_f // per, BLOCK_BYTES[kind]), dtype=np.uint8)
    for at in FP16_AT[kind]:
        d = rng.uniform(0.0005, 0.004, blocks.shape[:2]).astype(np.float16)
        blocks[:, :, at : at + 2] = d.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return QuantWeight(kind, torch.from_numpy(blocks.reshape(out_f, -1)), (out_f, in_f))


def layer_ms(weights: list, rows: int, routes=None) -> float:
    """Best time of one pass of ``rows`` random rows through every matrix of the layer."""
    x = {k: torch.randn(rows, k) for k in {w.shape[1] for w in weights}}
    return best_ms(lambda: [w.linear(x[w.shape[1]], None, routes) for w in weights],
                   max(3, 40 // rows))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="1,64")
    parser.add_argument("--types", default="Q4_1,Q4_K,Q5_K,Q6_K")
    args = parser.parse_args()
    kinds = {name: kind for kind, name in INT_TYPES.items()}
    routes = process_routes()
    variant = native.qint_variant(routes.native)
    routes = replace(routes, int_matmul=variant)
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), platform.processor())
    print(f"CPU {cpu}, {variant}, threads {native.num_threads()}, load {os.getloadavg()[0]:.2f}")
    rng = np.random.default_rng(0)
    print("ms for the layer's 7 matmuls (best of reps): gguf-int / gguf")
    for name in args.types.split(","):
        source = [random_weight(kinds[name], *shape, rng) for shape in SHAPES]
        mats = [pack(w, routes) for w in source]
        mib = sum(m.packed.numel() for m in mats) / 2**20
        cells = []
        for rows in (int(r) for r in args.rows.split(",")):
            ints, floats = layer_ms(mats, rows), layer_ms(source, rows, routes)
            cells.append(f"{rows} rows {ints:7.2f} / {floats:7.2f}")
        print(f"{name}: packed {mib:5.1f} MiB  " + "  ".join(cells))


if __name__ == "__main__":
    main()
