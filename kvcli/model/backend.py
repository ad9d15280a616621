"""What runs where for a model, as ``kvcli generate --stats`` and the bench JSON report it.

Every choice is made once per model, where it is used: the attention backend by
kvcli/model/attention/selector.py, the matmul, norm, RoPE and quantized-matmul routes by
kvcli/model/routes.py, the fused NumPy batch-1 decode by the model (``enable_fast_decode``).
:class:`Backend` holds those objects and :meth:`Backend.describe` prints them, so a number
names the code that produced it (the CPU kind of a machine varies between sessions, see
docs/BENCHMARKS.md).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from kvcli.model.attention import AttentionBackend
from kvcli.model.platform import Platform
from kvcli.model.precision import Precision
from kvcli.model.routes import KernelRoutes


@dataclass(frozen=True, slots=True)
class Backend:
    platform: Platform
    attention: AttentionBackend
    routes: KernelRoutes
    batch1_decode: str
    precision: Precision | None = None  # what --precision / --dtype chose (None: built directly)

    @property
    def native(self) -> ctypes.CDLL | None:
        """The compiled kernels the model runs (None: the torch routes)."""
        return self.routes.native

    @property
    def name(self) -> str:  # "native-cpu" | "torch-cpu" | "cuda" | another torch device type
        if not self.platform.cpu:
            return self.platform.device.type
        return "native-cpu" if self.native is not None else "torch-cpu"

    @property
    def isa(self) -> str:
        return self.platform.isa

    @property
    def decode_attention(self) -> str:
        return self.attention.decode

    @property
    def prefill_attention(self) -> str:
        return self.attention.prefill

    @property
    def elementwise(self) -> str:
        return self.routes.describe()["elementwise"] if self.platform.cpu else "torch"

    @property
    def matmul(self) -> str:
        return self.routes.describe()["matmul"] if self.platform.cpu else "torch"

    @property
    def precision_label(self) -> str:
        """``exact: float32 weights`` or ``fast: bfloat16 weights (why)``."""
        if self.precision is None:
            return str(self.platform.weights).removeprefix("torch.") + " weights"
        return self.precision.label

    def describe(self) -> dict[str, str]:
        """What runs where, for ``--stats`` and the bench JSON."""
        from kvcli.model.attention import kv_cache_dtype_name

        return {"name": self.name, "isa": self.isa, "precision": self.precision_label,
                "kv_cache_dtype": kv_cache_dtype_name(self.platform.kv_dtype),
                "decode_attention": self.decode_attention,
                "prefill_attention": self.prefill_attention, "batch1_decode": self.batch1_decode,
                "matmul": self.matmul, "elementwise": self.elementwise}


def model_backend(model: Any) -> Backend:
    """The choices ``model`` made when it was built (kvcli/model/llama.py), in one object."""
    decoder = getattr(model, "_numpy_decoder", None)
    if decoder is None:
        batch1 = "as batched"
    elif decoder.native_step is not None:  # model/native_step.py
        batch1 = "native fused (one call a step, as are batched steps of decode tokens only)"
    else:
        batch1 = "numpy fused" + (
            ", OpenBLAS threads adapt to load" if decoder.threads is not None else "")
    return Backend(model.platform, model.attention_backend, model.routes, batch1,
                   getattr(model, "precision", None))
