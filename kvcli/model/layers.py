"""Building blocks shared by every decoder family: linear, RMSNorm, SwiGLU, embeddings, RoPE.

Parameters are allocated empty and filled by the loader; nothing here trains, so no parameter
requires grad.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from kvcli.checkpoint.config import ModelConfigError, RopeConfig
from kvcli.model.routes import Activation, KernelRoutes, process_routes


class Routed(nn.Module):
    """A module that runs through the model's kernel routes (kvcli/model/routes.py), set once
    for the whole model by :func:`install_routes`."""

    routes: KernelRoutes


def install_routes(model: nn.Module, routes: KernelRoutes) -> None:
    for module in model.modules():
        if isinstance(module, Routed):
            module.routes = routes


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """A matmul outside a model (tests, scripts), through the routes this process's environment
    chooses now; a model's layers call their own ``routes.linear``."""
    return process_routes().linear(x, weight, bias)


@torch.no_grad()
def use_input_major_layout(module: nn.Module, copy: bool = True,
                           weights: torch.dtype = torch.float32) -> None:
    """Re-store every Linear weight as an ``[in, out]`` matrix (seen through a transposed view)
    inside one NumPy-allocated arena, in the order the layers run; the embedding likewise.

    NumPy asks the kernel for transparent huge pages only for large buffers, and torch's
    allocator never does: most per-layer matrices (1-3.5 MB) landed on 4 KB pages and the
    TLB misses of streaming ~540 MB of weights per decode step cost ~25% of its matmul time.
    One arena puts them all on huge pages. The loader calls this before filling the weights
    (``copy=False``), so no second copy of the model ever exists. ``weights=torch.bfloat16``
    (--dtype on a float32 model, precision.py) stores the matrices and the embedding in it
    (a uint16 arena seen as bfloat16: NumPy has no bfloat16); norms and biases stay float32.
    """
    linears = [m for m in module.modules() if isinstance(m, Linear)
               and m.weight.dtype == torch.float32 and m.weight.is_contiguous()]
    arena = _arena(sum(m.weight.numel() for m in linears), weights)
    offset = 0
    for lin in linears:
        out_features, in_features = lin.weight.shape
        view = arena[offset : offset + lin.weight.numel()].view(in_features, out_features)
        if copy:
            view.copy_(lin.weight.t())
        lin.weight = nn.Parameter(view.t(), requires_grad=False)
        offset += view.numel()
    for emb in module.modules():
        if isinstance(emb, Embedding) and emb.weight.dtype == torch.float32:
            buf = _arena(emb.weight.numel(), weights).view(tuple(emb.weight.shape))
            if copy:
                buf.copy_(emb.weight)
            emb.weight = nn.Parameter(buf, requires_grad=False)
            if weights != torch.float32:  # the model computes in float32 whatever it stores
                emb.output_dtype = torch.float32


def _arena(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """``numel`` elements of ``dtype`` in one NumPy allocation (huge pages; see above)."""
    if dtype == torch.float32:
        return torch.from_numpy(np.empty(numel, dtype=np.float32))
    if dtype.itemsize != 2:
        raise ValueError(f"weights in {dtype}: expected float32, bfloat16 or float16")
    return torch.from_numpy(np.empty(numel, dtype=np.uint16)).view(dtype)


def empty_param(
    shape: Sequence[int], dtype: torch.dtype, device: torch.device | str
) -> nn.Parameter:
    return nn.Parameter(torch.empty(tuple(shape), dtype=dtype, device=device), requires_grad=False)


class Linear(Routed):
    """y = x W^T + b, where W may stack several projections that share one input.

    ``output_sizes`` lists the stacked projections (q, k, v or gate, up); the loader copies each
    checkpoint tensor into its rows (``shard_rows``) so the forward pass is one matmul.
    """

    def __init__(
        self,
        in_features: int,
        output_sizes: Sequence[int],
        bias: bool,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        super().__init__()
        self.output_sizes = tuple(output_sizes)
        out_features = sum(self.output_sizes)
        self.weight = empty_param((out_features, in_features), dtype, device)
        self.bias = empty_param((out_features,), dtype, device) if bias else None

    def shard_rows(self, index: int) -> slice:
        start = sum(self.output_sizes[:index])
        return slice(start, start + self.output_sizes[index])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.routes.linear(x, self.weight, self.bias)

    def narrow(self, x: torch.Tensor) -> torch.Tensor:
        """The product left in bfloat16 where ``x``'s rows run fast's bfloat16 copy (no bias:
        the caller adds it into float32 rows, RMSNorm.add_and_norm), else :meth:`forward`."""
        wide = getattr(self.weight, "wide", None)
        if wide is not None and self.bias is None and self.routes.runs_bf16_copy(x):
            return wide.narrow_linear(x)
        return self(x)


class RMSNorm(Routed):
    """Normalises in float32 whatever the model dtype, exactly like transformers' LlamaRMSNorm."""

    def __init__(
        self, size: int, eps: float, dtype: torch.dtype, device: torch.device | str
    ) -> None:
        super().__init__()
        self.eps = eps
        self.weight = empty_param((size,), dtype, device)

    # Set where the norm's only reader is a matmul with fast's bfloat16 prefill copy
    # (quant/apply.py): rows that run the copy get the norm in bfloat16, rounded in its pass.
    feeds_bf16_copy = False

    def add_and_norm(self, residual: torch.Tensor, delta: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """``residual + delta`` and its norm (the same numbers as apart), one pass where the
        norm is float32 and both are too, or where this norm's reader runs fast's bfloat16 copy
        (the norm rounded to bfloat16) and ``delta`` is a bfloat16 product of that copy."""
        narrow = self.feeds_bf16_copy and self.routes.runs_bf16_copy(residual)
        if residual.dtype == torch.float32 and delta.dtype == (
                torch.bfloat16 if narrow else torch.float32):
            return self.routes.add_rms_norm(residual, delta, self.scale(), self.eps)
        hidden = residual + delta
        return hidden, self(hidden)

    def scale(self) -> torch.Tensor:
        """The factor the normalised rows are multiplied by (Gemma's is 1 + weight)."""
        return self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # one fused kernel instead of six ops per norm
            narrow = self.feeds_bf16_copy and self.routes.runs_bf16_copy(x)
            return self.routes.rms_norm(x, self.scale(), self.eps, narrow)
        input_dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        return self.weight * x.to(input_dtype)


class Embedding(nn.Module):
    output_dtype: torch.dtype | None = None  # set where the weight is narrower than the model

    def __init__(self, num: int, dim: int, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.weight = empty_param((num, dim), dtype, device)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = F.embedding(ids, self.weight)
        return rows if self.output_dtype is None else rows.to(self.output_dtype)


_ACTIVATIONS = {
    "silu": F.silu,
    # transformers' GELUTanh (Gemma's "gelu_pytorch_tanh")
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


@dataclass(frozen=True, slots=True)
class GatedActivation:
    """The SwiGLU family's act(gate) * up over a fused [..., 2 * intermediate] projection."""

    act: Activation
    silu: bool  # the native kernel fuses silu-and-mul

    def __call__(self, routes: KernelRoutes, gate_up: torch.Tensor) -> torch.Tensor:
        return routes.act_and_mul(gate_up, self.act, self.silu)


def gated_activation(name: str, config_path: str) -> GatedActivation:
    try:
        act = _ACTIVATIONS[name]
    except KeyError:
        raise ModelConfigError(
            f"{config_path}: field 'hidden_act': {name!r} is not supported (supported: {', '.join(_ACTIVATIONS)})"
        ) from None
    return GatedActivation(act, name == "silu")


def rope_inv_freq(head_dim: int, rope: RopeConfig) -> torch.Tensor:
    """Inverse frequencies as transformers' ROPE_INIT_FUNCTIONS compute them (float32, CPU)."""
    inv_freq = 1.0 / (
        rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    )
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type != "llama3":
        return inv_freq
    # Llama 3.1: keep high frequencies, divide low ones by `factor`, interpolate in between.
    old_context = rope.original_max_position_embeddings
    low_freq_wavelen = old_context / rope.low_freq_factor
    high_freq_wavelen = old_context / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_context / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """cos/sin for every position up to ``max_positions``, computed once (rotate-half layout)."""

    def __init__(
        self,
        head_dim: int,
        rope: RopeConfig,
        max_positions: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        super().__init__()
        inv_freq = rope_inv_freq(head_dim, rope)
        # Same float32 product as transformers (position * inv_freq), so cos/sin agree bit for bit.
        freqs = torch.arange(max_positions, dtype=torch.int64).float()[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos().to(dtype=dtype, device=device), persistent=False)
        self.register_buffer("sin", emb.sin().to(dtype=dtype, device=device), persistent=False)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[T, 1, head_dim] each, broadcasting over heads; looked up once per forward for all layers."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]. Matches transformers' ``x * cos + rotate_half(x) * sin``."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
