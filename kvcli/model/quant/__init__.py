"""Quantized weights on CPU (issues 21, 32): ``--quantization int8``, ``gguf`` and ``gguf-int``.

- ``int8``: a safetensors (or converted) model is loaded in float32 and each matrix quantized
  at load, symmetric per output channel; the embedding too (it is the tied output layer). Where
  the CPU has the integer kernels (x86 with AVX2) its matmuls run them as ``gguf-int``'s do.
- ``gguf``: a model that came from a GGUF file (the default model, a ``.gguf`` spec) runs the
  file's own tensors, memory-mapped, in their own types (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K;
  F16/F32 as float32); no float32 conversion is made or read: config and tokenizer come from
  the GGUF (kvcli/checkpoint/gguf_meta.py).
- ``gguf-int``: the same tensors (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) repacked at load for
  integer-activation matmuls (int_weights.py, native/qint.c): activations quantized to int8 per
  32 values.

Quality is measured, not asserted (docs/BENCHMARKS.md); float32 stays the default. Which modes a
model accepts is torch-free (kvcli/checkpoint/quant_modes.py); loading is ``load.load_quantized``.
"""

__all__ = ["QuantError"]


class QuantError(ValueError):
    """A weight that cannot be quantized or run in the requested mode."""
