"""The attention route on CUDA (and any other torch device): the torch route without the
prefix cascade for prefill chunks, whose fused log-sum-exp kernel is CPU-only."""

from __future__ import annotations

from typing import ClassVar

from kvcli.model.attention.common import LayerAttention
from kvcli.model.attention.torch_sdpa import TorchSDPABackend
from kvcli.model.platform import Platform


class TorchDeviceBackend(TorchSDPABackend):
    decode: ClassVar[str] = "torch batched + cascade"
    prefill: ClassVar[str] = "torch SDPA per sequence"
    prefill_cascade: ClassVar[bool] = False

    @property
    def name(self) -> str:  # type: ignore[override] - "cuda" or another torch device type
        return self.platform.device.type

    @classmethod
    def accepts(cls, platform: Platform, layers: list[LayerAttention]) -> bool:
        return not platform.cpu
