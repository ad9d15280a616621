"""The int8 KV cache (``--kv-cache-dtype int8``) on the native CPU kernels.

Each (slot, KV head) row of the pool is ``head_dim`` uint8 codes followed by a float32 scale
and zero point (OpenVINO's asymmetric u8 layout, per token and head; kvcli/model/native/kv_int8.h):
the pool is a uint8 tensor ``[layers, 2, slots, Hkv, head_dim + 8]``, so the disk cache, the
prefix cache and the block bookkeeping move a block's codes and parameters together as bytes.
New K/V are quantized as they are written (native ``kvcli_quantize_kv``); the decode,
shared-prefix decode and prefill kernels read the codes in place (paged_attention_int8.c,
prefill_attention_int8.c): no de-quantized copy of the cache is made. Where the CPU has
AVX512-VNNI the kernels score in integers: each query row rounded to int8 (one scale per row
and head) against the keys' codes, 64 products per instruction (native/kv_int8.h,
decode_vnni.h, prefill_scores.h); the values' side stays float32. Where it also has AMX-INT8
and AMX-BF16, the many-row kernel (prefill chunks, decode tokens sharing a prefix) runs both
products on AMX tiles (native/prefill_amx.h: the same integer scores; the values' side as two
bfloat16s times the codes, float32 sums). The rows a step attends
are the same as the float32 route's (native_cpu.py's metadata), so only the K/V write and the
kernels differ.

Without the native kernels (no C compiler, ``KVCLI_NATIVE=0``) or off the CPU an int8 cache is
refused at model set-up (selector.py): the torch routes have no int8 reader.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from kvcli.model import native
from kvcli.model.attention.common import LayerAttention
from kvcli.model.attention.native_cpu import NativeCPUBackend, NativeMetadata, native_forward
from kvcli.model.platform import Platform

#: The pool's element type for an int8 cache: a row's codes and its parameters as bytes.
INT8_STORAGE = torch.uint8
#: Bytes after a row's codes: float32 scale and zero point (kv_int8.h KV8_EXTRA).
INT8_ROW_EXTRA = 8


def _probe() -> torch.Tensor:
    """A one-row int8 layer of head size 64: which kernels' build the report asks."""
    return torch.empty(2, 1, 1, 64 + INT8_ROW_EXTRA, dtype=INT8_STORAGE)


class NativeInt8Backend(NativeCPUBackend):
    name: ClassVar[str] = "native-cpu-int8kv"

    @property  # type: ignore[override]
    def decode(self) -> str:  # what the report names: the kernels' scores where VNNI has them
        if self.lib is not None and native.int_scores(self.lib, _probe(), 64):
            return "native paged, int8 KV, VNNI integer scores (head sizes % 64)"
        return "native paged, int8 KV"

    @property  # type: ignore[override]
    def prefill(self) -> str:  # the many-row kernel: on AMX tiles where it can run them
        if self.lib is not None and native.attention_amx(self.lib, _probe()):
            return ("native paged, int8 KV, AMX tiles (int8 scores, bf16 values; "
                    "head sizes % 64)")
        return self.decode

    @classmethod
    def accepts(cls, platform: Platform, layers: list[LayerAttention]) -> bool:
        return (platform.cpu and platform.kv_dtype == INT8_STORAGE and platform.native is not None
                and all(spec.softcap is None for spec in layers))

    def layer(self, spec: LayerAttention) -> NativeInt8Impl:
        return NativeInt8Impl(spec.scale, spec.sliding_window)


class NativeInt8Impl:
    """Quantize the step's K/V into their slots, then the int8 kernels over the codes."""

    def __init__(self, scale: float, sliding_window: int | None = None) -> None:
        self.scale = scale
        self.sliding_window = sliding_window

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_layer: torch.Tensor,
                meta: NativeMetadata) -> torch.Tensor:
        slots = meta.common.slot_mapping
        native.quantize_kv(meta.lib, k, slots, kv_layer[0])
        native.quantize_kv(meta.lib, v, slots, kv_layer[1])
        return native_forward(q, kv_layer, meta, self.sliding_window, self.scale)

