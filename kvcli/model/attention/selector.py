"""The one place an attention backend is chosen: from the platform (device, KV dtype, the CPU's
compiled kernels) and the model's layers, once per model.

``BACKENDS`` lists the routes of a cache in the model's dtype by priority, ``CONVERTING`` those
of a cache in another (``--kv-cache-dtype``); the first that accepts wins. A new kernel or
KV-cache dtype is one backend file (the contract: kvcli/model/attention/common.py
AttentionBackend) plus one line here.
"""

from __future__ import annotations

import torch

from kvcli.model.attention.common import AttentionBackend, LayerAttention
from kvcli.model.attention.cuda import TorchDeviceBackend
from kvcli.model.attention.kv_cache import kv_cache_dtype_name
from kvcli.model.attention.native_bf16 import NativeBF16Backend
from kvcli.model.attention.native_cpu import NativeCPUBackend
from kvcli.model.attention.native_int8 import INT8_STORAGE, NativeInt8Backend
from kvcli.model.attention.softcap import SoftcapBackend
from kvcli.model.attention.torch_sdpa import TorchSDPABackend
from kvcli.model.platform import Platform

BACKENDS: tuple[type[AttentionBackend], ...] = (
    SoftcapBackend,  # capped logits (Gemma 2): no fused kernel caps them
    NativeCPUBackend,  # CPU float32 with the compiled kernels
    TorchSDPABackend,  # CPU otherwise (another dtype, no compiler, KVCLI_NATIVE=0)
    TorchDeviceBackend,  # CUDA and other torch devices
)


#: The backends of a cache in another dtype than the model's (--kv-cache-dtype), by priority.
CONVERTING: tuple[type[AttentionBackend], ...] = (
    NativeInt8Backend,  # int8 rows with their scale and zero point (always a converted cache)
    NativeBF16Backend,  # a bfloat16 cache under a float32 model
)


def select_attention_backend(platform: Platform, layers: list[LayerAttention],
                             model_dtype: torch.dtype | None = None) -> AttentionBackend:
    """The backend serving every layer of a model with these ``layers`` on ``platform``; a
    ``model_dtype`` other than the platform's KV dtype (an int8 cache always) leaves only the
    CONVERTING backends (ValueError with the reason when none accepts)."""
    converted = platform.kv_dtype == INT8_STORAGE or (
        model_dtype is not None and platform.kv_dtype != model_dtype)
    for backend in CONVERTING if converted else BACKENDS:
        if backend.accepts(platform, layers):
            return backend(platform)  # type: ignore[call-arg]
    if converted:
        name = kv_cache_dtype_name(platform.kv_dtype)
        raise ValueError(f"--kv-cache-dtype {name}: {_unconverted(platform, layers)}")
    raise ValueError(f"no attention backend for {platform.device.type} {platform.kv_dtype}")


def _unconverted(platform: Platform, layers: list[LayerAttention]) -> str:
    """Why no CONVERTING backend serves this platform and these layers."""
    if not platform.cpu:
        return f"runs on the CPU only (the native kernels), not {platform.device.type}"
    if any(spec.softcap is not None for spec in layers):
        return "soft-capped attention logits (Gemma 2) have no kernel reading it"
    if platform.native is None:
        return ("needs the native CPU kernels, which are off (no C compiler, or KVCLI_NATIVE=0); "
                "the torch attention routes read caches in the model's dtype only")
    return "no kernel reads it under this model's dtype (use auto: the model's dtype)"
