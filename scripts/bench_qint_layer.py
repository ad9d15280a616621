"""One decoder layer's matmuls of the default model (SmolLM2-135M, Q4_1), timed per mode in one
run: gguf (float activations, qgemm.c / de-quantized panel + torch GEMM past 64 rows), gguf-int
(qint.c, each variant this CPU runs) and float32 (the de-quantized matrix through kvcli's routes).

    PYTHONPATH=. python scripts/bench_qint_layer.py [--rows 1,8,32,512] [--layer 0]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from dataclasses import replace

import torch

from kvcli.checkpoint.resolve import default_gguf_path
from kvcli.model import native
from kvcli.model.quant.gguf_weights import gguf_weights
from kvcli.model.quant.int_weights import pack
from kvcli.model.quant.weights import QuantWeight
from kvcli.model.routes import process_routes

PARTS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def best_ms(fn, reps: int) -> float:
    """Best of ``reps`` timed calls of ``fn`` (after one untimed), in ms."""
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="1,8,32,512")
    parser.add_argument("--layer", type=int, default=0)
    args = parser.parse_args()
    weights = {name.split(".")[-2]: value for name, value in gguf_weights(default_gguf_path())
               if name.startswith(f"model.layers.{args.layer}.") and isinstance(value, QuantWeight)}
    mats = list(weights.values())
    routes = process_routes()
    lib = routes.native
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), platform.processor())
    print(f"CPU {cpu}, threads {native.num_threads()}, load {os.getloadavg()[0]:.2f}")
    variants = [v for v in native.QINT_VARIANTS
                if v in _runnable(lib)]
    packed = {v: [pack(w, replace(routes, int_matmul=v)) for w in mats] for v in variants}
    dense = [w.dequantize() for w in mats]
    print(f"{'rows':>5} {'float32':>9} {'gguf':>9} " + " ".join(f"{v:>12}" for v in variants)
          + "   (ms for the layer's 7 matmuls, best of reps)")
    for rows in (int(r) for r in args.rows.split(",")):
        x = {w.shape[1]: torch.randn(rows, w.shape[1]) for w in mats}
        reps = max(3, 200 // rows)
        f32 = best_ms(lambda x=x: [routes.linear(x[d.shape[1]], d) for d in dense], reps)
        gg = best_ms(lambda x=x: [w.linear(x[w.shape[1]], None, routes) for w in mats], reps)
        ints = [best_ms(lambda x=x, v=v: [w.linear(x[w.shape[1]], None) for w in packed[v]], reps)
                for v in variants]
        print(f"{rows:>5} {f32:>9.3f} {gg:>9.3f} " + " ".join(f"{t:>12.3f}" for t in ints))


def _runnable(lib) -> list[str]:
    found = []
    for v in native.QINT_VARIANTS:
        os.environ["KVCLI_QINT_ISA"] = v
        try:
            native.qint_variant(lib)
            found.append(v)
        except ValueError:
            pass
    os.environ.pop("KVCLI_QINT_ISA")
    return found


if __name__ == "__main__":
    main()
