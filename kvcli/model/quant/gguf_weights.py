"""The tensors of a llama-architecture GGUF, in their own types, under kvcli's parameter names.

``gguf_file.read_gguf`` memory-maps the file; every quantized tensor is a ``[out, row bytes]``
uint8 view of it, so nothing is de-quantized at load. Names follow llama.cpp's
(``blk.N.attn_q.weight``); the q/k rows, which llama.cpp's converter reorders for its RoPE
layout, are put back in Hugging Face order (a permutation of whole rows, so it works on packed
rows as well as on floats).
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from kvcli.model.quant import QuantError
from kvcli.model.quant.gguf_file import GGUFTensor, read_gguf
from kvcli.model.quant.weights import NATIVE_TYPES, QuantWeight

# llama.cpp name within a block -> transformers' module path within a layer
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}  # fmt: skip
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
              "output": "lm_head"}
_FLOAT_TYPES = {0: np.float32, 1: np.float16}  # F32, F16: used as they are (as float32)


def hf_name(gguf_name: str) -> str:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``."""
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _BLOCK_NAMES:
        return f"model.layers.{parts[1]}.{_BLOCK_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _TOP_NAMES:
        return f"{_TOP_NAMES[parts[0]]}.{parts[1]}"
    raise QuantError(f"GGUF tensor {gguf_name!r} has no place in a llama model")


def _unpermute_rows(rows: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's q/k reordering (``reshape(n_head, 2, r/n_head/2).swapaxes``)."""
    n = rows.shape[0]
    return rows.reshape(n_head, n // n_head // 2, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(
        rows.shape)


def _meta_int(meta: dict[str, object], key: str, path: Path) -> int:
    value = meta.get(key)
    if not isinstance(value, int):
        raise QuantError(f"{path}: GGUF metadata {key!r} is missing")
    return value


@dataclass(slots=True)
class GGUFWeights:
    """A GGUF's tensors under transformers' names; iterate for (name, float32 tensor or
    QuantWeight)."""

    path: Path
    meta: dict[str, object]
    tensors: list[GGUFTensor]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor | QuantWeight]]:
        heads = {"attn_q": _meta_int(self.meta, "llama.attention.head_count", self.path),
                 "attn_k": _meta_int(self.meta, "llama.attention.head_count_kv", self.path)}
        for tensor in self.tensors:
            yield hf_name(tensor.name), self._value(tensor, heads)

    def _value(self, tensor: GGUFTensor, heads: dict[str, int]) -> torch.Tensor | QuantWeight:
        data = tensor.data
        part = tensor.name.split(".")[2] if tensor.name.startswith("blk.") else ""
        if part in heads:
            data = _unpermute_rows(data, heads[part])
        if tensor.kind in _FLOAT_TYPES:
            shape = tuple(reversed(tensor.shape))
            return torch.from_numpy(np.asarray(data, dtype=np.float32).reshape(shape))
        if tensor.kind in NATIVE_TYPES:
            out_features, in_features = tensor.shape[1], tensor.shape[0]
            return QuantWeight(tensor.kind, torch.from_numpy(np.asarray(data)),
                               (out_features, in_features))
        raise QuantError(f"{self.path}: tensor {tensor.name!r} has GGML type {tensor.kind}, "
                         "which --quantization gguf cannot run")

    def release_pages(self) -> None:
        """Drop the file's pages from this process's memory (they stay in the page cache, and
        whatever is read again faults back in): after loading, the q/k/v and gate/up tensors
        live on only as their stacked copies, whose sources would otherwise count twice
        (~43 MB of the default model's peak)."""
        mapping = getattr(self.tensors[0].data, "_mmap", None) if self.tensors else None
        if mapping is not None and hasattr(mmap, "MADV_DONTNEED"):
            mapping.madvise(mmap.MADV_DONTNEED)  # never written (copy-on-write): nothing lost


def gguf_weights(path: Path) -> GGUFWeights:
    """The tensors of the llama-architecture GGUF at ``path``, memory-mapped."""
    meta, tensors = read_gguf(path)
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise QuantError(f"{path}: --quantization gguf runs llama-architecture GGUFs; this one is "
                         f"{arch!r} (run it without --quantization, converted to float32)")
    return GGUFWeights(Path(path), meta, tensors)
