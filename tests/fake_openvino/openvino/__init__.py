"""openvino.Tensor for tests/fake_openvino: holds the token ids of one [1, n] int64 array."""

from __future__ import annotations

from typing import Any


class Tensor:
    def __init__(self, array: Any) -> None:
        if str(array.dtype) != "int64" or array.ndim != 2 or array.shape[0] != 1:
            raise TypeError(f"fake openvino: want int64 ids of shape [1, n], got "
                            f"{array.dtype} {array.shape}")
        self.ids = [int(t) for t in array[0]]


class Type:
    """openvino.Type as get_property returns it: its str() is not the short name."""

    def __init__(self, name: str, long_name: str) -> None:
        self.name, self.long_name = name, long_name

    def get_type_name(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"<Type: '{self.long_name}'>"


class Core:
    """The CPU plugin's precision defaults, as OpenVINO 2026.4 reports them on AVX512_BF16."""

    DEFAULTS = {"INFERENCE_PRECISION_HINT": Type("bf16", "bfloat16"),
                "KV_CACHE_PRECISION": Type("u8", "uint8_t"),
                "DYNAMIC_QUANTIZATION_GROUP_SIZE": 32}

    def get_property(self, device: str, key: str) -> Any:
        return self.DEFAULTS[key]
