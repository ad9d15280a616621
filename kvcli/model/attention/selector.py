"""The one place an attention backend is chosen: from the platform (device, KV dtype, the CPU's
compiled kernels) and the model's layers, once per model.

``BACKENDS`` lists the routes by priority; the first that accepts wins. A new kernel or KV-cache
dtype is one backend file (the contract: kvcli/model/attention/common.py AttentionBackend) plus
one line here.
"""

from __future__ import annotations

from kvcli.model.attention.common import AttentionBackend, LayerAttention
from kvcli.model.attention.cuda import TorchDeviceBackend
from kvcli.model.attention.native_cpu import NativeCPUBackend
from kvcli.model.attention.native_int8 import INT8_STORAGE, NativeInt8Backend, int8_unavailable
from kvcli.model.attention.softcap import SoftcapBackend
from kvcli.model.attention.torch_sdpa import TorchSDPABackend
from kvcli.model.platform import Platform

BACKENDS: tuple[type[AttentionBackend], ...] = (
    NativeInt8Backend,  # the int8 KV cache (--kv-cache-dtype int8): only its kernels read it
    SoftcapBackend,  # capped logits (Gemma 2): no fused kernel caps them
    NativeCPUBackend,  # CPU float32 with the compiled kernels
    TorchSDPABackend,  # CPU otherwise (another dtype, no compiler, KVCLI_NATIVE=0)
    TorchDeviceBackend,  # CUDA and other torch devices
)


def select_attention_backend(platform: Platform, layers: list[LayerAttention]) -> AttentionBackend:
    """The backend serving every layer of a model with these ``layers`` on ``platform``."""
    if platform.kv_dtype == INT8_STORAGE and (why := int8_unavailable(platform, layers)):
        raise ValueError(f"--kv-cache-dtype int8: {why}")
    for backend in BACKENDS:
        if backend.accepts(platform, layers):
            return backend(platform)  # type: ignore[call-arg]
    raise ValueError(f"no attention backend for {platform.device.type} {platform.kv_dtype}")
