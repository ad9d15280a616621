"""A bfloat16 KV cache under a float32 model (``--kv-cache-dtype bfloat16``) on the native CPU
kernels.

The pool is a bfloat16 tensor of the usual layout (common.py); new K/V are rounded to bfloat16
(round to nearest even) as they are written, and the decode, shared-prefix decode and prefill
kernels read them in place, widening to float32 in registers (bfloat16 is float32's upper
half: a shift), with all arithmetic in float32: ``paged_attention_bf16.c`` and
``prefill_attention_bf16.c`` are the int8 cache's kernels built for bfloat16 rows. Half the
bytes of a float32 cache, 8 significant bits per element (int8: 255 levels per row, ~3.6x
fewer bytes). The rows a step attends are the float32 route's (native_cpu.py's metadata).

A bfloat16 *model* (``--dtype bfloat16``) keeps its own-dtype cache on the torch route: the
native kernels are built for float32 queries.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from kvcli.model.attention.common import LayerAttention, write_kv
from kvcli.model.attention.native_cpu import NativeCPUBackend, NativeMetadata, native_forward
from kvcli.model.platform import Platform


class NativeBF16Backend(NativeCPUBackend):
    name: ClassVar[str] = "native-cpu-bf16kv"
    decode: ClassVar[str] = "native paged, bfloat16 KV"
    prefill: ClassVar[str] = "native paged, bfloat16 KV"

    @classmethod
    def accepts(cls, platform: Platform, layers: list[LayerAttention]) -> bool:
        # platform.native is loaded for float32 models only (platform.py)
        return (platform.cpu and platform.kv_dtype == torch.bfloat16
                and platform.native is not None and all(spec.softcap is None for spec in layers))

    def layer(self, spec: LayerAttention) -> NativeBF16Impl:
        return NativeBF16Impl(spec.scale, spec.sliding_window)


class NativeBF16Impl:
    """Round the step's K/V into their bfloat16 slots, then the bfloat16 kernels."""

    def __init__(self, scale: float, sliding_window: int | None = None) -> None:
        self.scale = scale
        self.sliding_window = sliding_window

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_layer: torch.Tensor,
                meta: NativeMetadata) -> torch.Tensor:
        write_kv(kv_layer, meta.common, k.to(torch.bfloat16), v.to(torch.bfloat16))
        return native_forward(q, kv_layer, meta, self.sliding_window, self.scale)
