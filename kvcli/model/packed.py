"""bfloat16/float16 matmul weights pre-packed once in oneDNN's blocked layout (--dtype on CPU).

oneDNN's AMX/AVX512_BF16 GEMM reads its weights in a blocked layout; given a plain ``[out, in]``
matrix it re-lays it out on every call, which is most of a decode step's matmul time (the
weights stream once per step). :func:`pack_narrow_weights` does that once at load: each Linear's
weight becomes a :class:`PackedWeight` (the plain matrix is freed), and a tied output layer
gets a packed copy of the embedding (the embedding itself stays plain for the lookup).
Measured on a Xeon with AMX-BF16, one thread, CPU time of SmolLM2-135M's 121 matmuls of one
step (docs/BENCHMARKS.md 2026-12-02): 1 row 33 ms packed vs 47 plain vs 57 float32; 32 rows
50-53 vs 57 vs 119; 1,024 rows equal within noise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from kvcli.model.layers import Linear

ROWS_HINT = 32  # the row count oneDNN chooses the blocked layout for (1 and 1,024 within 10%)


@dataclass(eq=False)
class PackedWeight:
    """An ``[out, in]`` weight in oneDNN's blocked layout; computes in float32 out."""

    packed: torch.Tensor  # an opaque mkldnn tensor
    shape: tuple[int, int]
    dtype: torch.dtype  # bfloat16 or float16: what x is rounded to

    device = torch.device("cpu")

    @classmethod
    def of(cls, weight: torch.Tensor) -> PackedWeight:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), ROWS_HINT)
        return cls(packed, (int(weight.shape[0]), int(weight.shape[1])), weight.dtype)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None, routes: object = None
               ) -> torch.Tensor:
        """``x @ W^T (+ bias)`` in float32 for a float32 ``x`` ``[..., in]`` (routes.py's
        contract for weights that are not tensors; the routes are not needed here)."""
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.shape[1]).to(self.dtype)
        y = torch.ops.mkldnn._linear_pointwise(x2, self.packed, None, "none", [], "").float()
        if bias is not None:
            y += bias
        return y.reshape(*lead, self.shape[0])

    def dense(self) -> torch.Tensor:
        """The plain ``[out, in]`` matrix (tests, inspection)."""
        return self.packed.to_dense()


def can_pack(dtype: torch.dtype) -> bool:
    """Whether torch's oneDNN packs ``dtype`` weights on this CPU."""
    return (dtype in (torch.bfloat16, torch.float16) and torch.backends.mkldnn.is_available()
            and (dtype != torch.bfloat16 or torch.ops.mkldnn._is_mkldnn_bf16_supported()))


@torch.no_grad()
def pack_narrow_weights(model: nn.Module) -> None:
    """Every bfloat16/float16 Linear weight of a loaded CPU ``model`` to a PackedWeight, and a
    packed output layer for a tied embedding (``model.logits_weight``)."""
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, Linear) and isinstance(weight, torch.Tensor) and can_pack(weight.dtype):
            del module.weight  # the plain matrix is freed with its Parameter
            module.weight = PackedWeight.of(weight)
    embed = model.model.embed_tokens.weight
    if getattr(model, "lm_head", None) is None and can_pack(embed.dtype):
        model.logits_weight = PackedWeight.of(embed)
