"""A dummy attention backend for tests/test_attention_selector.py: the torch SDPA route,
counting the layer calls it serves. Adding a backend to kvcli is this one file plus one line
in kvcli/model/attention/selector.py's BACKENDS."""

from __future__ import annotations

from typing import ClassVar

import torch

from kvcli.model.attention.common import LayerAttention
from kvcli.model.attention.torch_sdpa import TorchMetadata, TorchSDPABackend, TorchSDPAImpl
from kvcli.model.platform import Platform


class CountingBackend(TorchSDPABackend):
    name: ClassVar[str] = "counting"
    decode: ClassVar[str] = "counting torch batched + cascade"
    prefill: ClassVar[str] = "counting torch SDPA per sequence + prefix cascade"
    calls: ClassVar[list[int]] = []  # rows of each layer call

    @classmethod
    def accepts(cls, platform: Platform, layers: list[LayerAttention]) -> bool:
        return platform.cpu and all(spec.softcap is None for spec in layers)

    def layer(self, spec: LayerAttention) -> CountingImpl:
        return CountingImpl(spec.scale, spec.sliding_window)


class CountingImpl(TorchSDPAImpl):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_layer: torch.Tensor,
                meta: TorchMetadata) -> torch.Tensor:
        CountingBackend.calls.append(q.shape[0])
        return super().forward(q, k, v, kv_layer, meta)
