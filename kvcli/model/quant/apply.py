"""Put quantized weights into a built kvcli model: ``int8`` quantizes a loaded float32 model's
matrices; ``gguf`` fills an empty model from a GGUF file's tensors in their own types.

Every Linear's weight becomes a :class:`QuantWeight` (``KernelRoutes.linear`` runs it), and the
token embedding a :class:`QuantEmbedding`, whose rows are de-quantized per look-up and which
is also the tied output layer. Norms stay float32, and so do activations and the KV cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from kvcli.model import native
from kvcli.model.decoder import DecoderLayer, GatedMLP
from kvcli.model.layers import Embedding, Linear, install_routes
from kvcli.model.loader import _destination  # the loader's own name mapping (fused q/k/v, gate/up)
from kvcli.model.packed import SwiGLU
from kvcli.model.quant import QuantError
from kvcli.model.quant.gguf_weights import gguf_weights
from kvcli.model.quant.int_weights import BF16_PREFILL_ROWS, I8_PREFILL_ROWS, IntWeight, pack
from kvcli.model.quant.w8a8 import W8A8_ROWS
from kvcli.model.quant.weights import QuantWeight, StackedWeight, quantize_int8
from kvcli.model.routes import KernelRoutes


class QuantEmbedding(nn.Module):
    """An embedding table kept quantized; ``weight`` doubles as a tied output layer's weight."""

    def __init__(self, weight: QuantWeight) -> None:
        super().__init__()
        self.weight = weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight.dequantize(ids).reshape(*ids.shape, self.weight.shape[1])


def _set_linear_weight(linear: Linear, weight: QuantWeight | StackedWeight | IntWeight) -> None:
    del linear.weight  # drop the float Parameter: the float32 matrix is freed with it
    linear.weight = weight


def _finish(model: nn.Module) -> nn.Module:
    # The quantized weights take the model's kernel routes (kvcli/model/routes.py).
    routes = getattr(model, "routes", None)
    for module in model.modules():
        weight = getattr(module, "weight", None)
        for part in weight.parts if isinstance(weight, StackedWeight) else [weight]:
            if isinstance(part, QuantWeight | IntWeight):
                part.routes = routes
    # The fused one-row NumPy decoder (decode-1 steps) is rebuilt on the quantized weights: it
    # sees them through NumpyView, so its matmuls run the quantized kernel.
    if hasattr(model, "enable_fast_decode"):
        model.enable_fast_decode()
    return model


@torch.no_grad()
def quantize_int8_model(model: nn.Module, prefill: str | None = None,
                        few_rows: str | None = None) -> nn.Module:
    """Every Linear (and the embedding, tied output layer included) to per-channel int8;
    ``prefill``, ``few_rows``: see :func:`_pack_model`."""
    integer = native.qint_available(model.routes.native)
    for module in list(model.modules()):
        if isinstance(module, Linear) and isinstance(module.weight, torch.Tensor):
            if integer and (prefill or few_rows) and _takes_copy(model, module):  # its values
                module.prefill_source = module.weight.detach().to(torch.bfloat16)
            _set_linear_weight(module, quantize_int8(module.weight))
    inner = getattr(model, "model", None)  # transformers' layout: model.model.embed_tokens
    embed = getattr(inner, "embed_tokens", None)
    if isinstance(embed, Embedding):
        inner.embed_tokens = QuantEmbedding(quantize_int8(embed.weight))
    if integer:  # else float32 activations (qgemm.c, torch)
        _pack_model(model, prefill, few_rows)
    return _finish(model)


def _stack(parts: list[QuantWeight]) -> QuantWeight | StackedWeight:
    """q/k/v (or gate/up) as one weight: rows concatenated where they share a type (one
    matmul: this copies their packed bytes once), else one matmul per part."""
    if len({p.kind for p in parts}) > 1:
        return StackedWeight(parts)
    out_features = sum(p.shape[0] for p in parts)
    data = torch.cat([p.data for p in parts]) if len(parts) > 1 else parts[0].data
    return QuantWeight(parts[0].kind, data, (out_features, parts[0].shape[1]))


def _pack_model(model: nn.Module, prefill: str | None = None, few_rows: str | None = None,
                release: Callable[[], None] | None = None) -> None:
    """gguf-int and int8: every quantized matrix repacked for the integer kernels, whose variant
    the model's routes then name (chosen here, once, from the CPU's flags). ``release``, called
    after each matrix: drops the source pages its repacking read (a GGUF's), so the file's
    pages and the repacked copies never count in full together. ``prefill``
    "bfloat16" (fast on AMX-BF16, precision.py): each Linear's matrix also keeps a bfloat16
    copy that its matmuls of ``BF16_PREFILL_ROWS`` rows or more run (:func:`_takes_copy`);
    ``few_rows`` "int8" (fast on AMX-INT8): an int8 copy per channel that its matmuls of
    ``W8A8_ROWS`` rows up to that run (quant/w8a8.py). ``prefill`` "int8" (fast on a GGUF
    where AVX512-VNNI runs without AMX): an int8 copy per channel of each Linear's blocks, run
    by its matmuls of ``I8_PREFILL_ROWS`` rows or more."""
    lib = model.routes.native
    if lib is None:
        raise QuantError("--quantization gguf-int needs the native kernels (a C compiler, "
                         "KVCLI_NATIVE not 0, CPU float32)")
    try:
        routes = replace(model.routes, int_matmul=native.qint_variant(lib),
                         bf16_prefill_rows=BF16_PREFILL_ROWS if prefill == "bfloat16" else 0,
                         i8_prefill_rows=I8_PREFILL_ROWS if prefill == "int8" else 0,
                         w8a8_rows=W8A8_ROWS if few_rows == "int8" else 0,
                         own_pool=prefill != "bfloat16" and _all_quantized(model))
    except ValueError as err:
        raise QuantError(f"--quantization gguf-int: {err}") from None
    model.routes = routes
    install_routes(model, routes)
    fused = _fuse_mlps(model, keep=routes.w8a8_rows > 0) if routes.bf16_prefill_rows else set()
    for module in model.modules():
        weight = getattr(module, "weight", None)
        copies = _takes_copy(model, module)
        wide = routes.prefill_copy and copies and id(module) not in fused
        few = routes.w8a8_rows > 0 and (copies or _output_layer(model, module))
        if isinstance(weight, StackedWeight):
            weight.parts = [_pack_part(p, routes, wide, few) for p in weight.parts]
        elif isinstance(weight, QuantWeight):
            values = _float_values(module) if wide or few else None
            packed = pack(weight, routes, keep_source=isinstance(module, QuantEmbedding),
                          wide=values if wide else None, few=values if few else None)
            if isinstance(module, QuantEmbedding):
                module.weight = packed
            else:
                _set_linear_weight(module, packed)
        if release is not None and isinstance(weight, QuantWeight | StackedWeight):
            release()
    if routes.bf16_prefill_rows:
        _narrow_norms(model)


def _all_quantized(model: nn.Module) -> bool:
    """Whether every Linear holds quantized weights, which packing makes integer-kernel ones (or
    refuses): then no matmul of the model runs torch's (routes.own_pool)."""
    return all(isinstance(m.weight, QuantWeight | StackedWeight)
               for m in model.modules() if isinstance(m, Linear))


def _pack_part(part: QuantWeight, routes: KernelRoutes, wide: bool, few: bool) -> IntWeight:
    """One part of a StackedWeight packed, its values de-quantized once for its copies."""
    values = part.dequantize() if wide or few else None
    return pack(part, routes, wide=values if wide else None, few=values if few else None)


def _has_copy(module: nn.Module) -> bool:
    """Whether a Linear's (or a fused MLP's) many-row matmuls run fast's bfloat16 copy."""
    if getattr(module, "wide", None) is not None:  # GatedMLP with a packed.SwiGLU
        return True
    weight = getattr(module, "weight", None)
    parts = weight.parts if isinstance(weight, StackedWeight) else [weight]
    return all(isinstance(p, IntWeight) and p.wide is not None for p in parts)


def _narrow_norms(model: nn.Module) -> None:
    """A pre-norm layer's two norms are read by one matmul each: where that matmul has a
    bfloat16 copy, the norm hands its many rows over in bfloat16 (layers.RMSNorm), rounded in
    its own pass instead of a conversion of the float32 rows before oneDNN."""
    for layer in model.modules():
        if not (isinstance(layer, DecoderLayer) and layer.pre_norm_only):
            continue
        readers = (layer.self_attn.qkv_proj, getattr(layer, layer.mlp_name))
        for norm, reader in zip((layer.attn_in, layer.mlp_in), readers, strict=True):
            if norm is not None and _has_copy(reader):
                norm.feeds_bf16_copy = True


def _takes_copy(model: nn.Module, module: nn.Module) -> bool:
    """Whether ``module`` keeps fast's bfloat16 prefill copy: every Linear but the output layer
    (an untied lm_head, like the embedding that is a tied one), whose matmuls have the sampled
    rows only: a copy of its 49,152 x 576 would cost 57 MB for a few rows a step."""
    return isinstance(module, Linear) and module is not getattr(model, "lm_head", None)


def _output_layer(model: nn.Module, module: nn.Module) -> bool:
    """Whether ``module`` computes the logits: an untied lm_head, or the embedding tied to it.
    Its calls of a batched decode step's sampled rows take fast's int8 copy: the integer kernels
    on a Q8_0 table fold 1,536 blocks a row (4.4 ms of a 32-row step on a Xeon with AMX)."""
    head = getattr(model, "lm_head", None)
    if head is None:
        return isinstance(module, QuantEmbedding)
    return module is head


def _float_values(linear: nn.Module, keep: bool = False) -> torch.Tensor:
    """A quantized Linear's float values for its copies: the float checkpoint's, kept by
    quantize_int8_model (then dropped unless ``keep``), else its quantized values de-quantized
    (a GGUF's)."""
    kept = (linear.__dict__.get if keep else linear.__dict__.pop)("prefill_source", None)
    return linear.weight.dequantize() if kept is None else kept


def _fuse_mlps(model: nn.Module, keep: bool) -> set[int]:
    """fast's bfloat16 prefill: each SwiGLU MLP (no biases) gets one packed.SwiGLU for its many
    rows, and its two Linears no copy of their own; returns those Linears' ids. ``keep``: their
    kept float values stay for the int8 copy that _pack_model makes next (else dropped here)."""
    fused: set[int] = set()
    for mlp in model.modules():
        if not (isinstance(mlp, GatedMLP) and mlp.act_and_mul.silu
                and mlp.gate_up_proj.bias is None and mlp.down_proj.bias is None):
            continue
        mlp.wide = SwiGLU.of(_float_values(mlp.gate_up_proj, keep),
                             _float_values(mlp.down_proj, keep))
        fused |= {id(mlp.gate_up_proj), id(mlp.down_proj)}
    return fused


@torch.no_grad()
def load_gguf_model(model: nn.Module, path: Path, integer: bool = False,
                    prefill: str | None = None, few_rows: str | None = None) -> nn.Module:
    """Fill an empty model (``loader.build_model``) from the GGUF at ``path``; ``integer``:
    repacked for the integer-activation kernels (``--quantization gguf-int``), ``prefill``,
    ``few_rows``: see :func:`_pack_model`."""
    params = dict(model.named_parameters())
    pending: dict[str, dict[int, QuantWeight]] = {}
    loaded: set[str] = set()
    weights = gguf_weights(path)
    for name, value in weights:
        target, shard = _destination(model, name)
        if isinstance(value, QuantWeight):
            module = model.get_submodule(target.rsplit(".", 1)[0])
            if isinstance(module, Embedding):
                model.model.embed_tokens = QuantEmbedding(value)
            else:
                pending.setdefault(target, {})[shard or 0] = value
        elif target in params:  # F32/F16 tensors: into their rows of a fused q/k/v, gate/up
            dest = params[target]
            if shard is not None:
                dest = dest[model.get_submodule(target.rsplit(".", 1)[0]).shard_rows(shard)]
            dest.copy_(value.reshape(dest.shape))
        else:
            raise QuantError(f"{path}: tensor for {name} has no float parameter in the model")
        loaded.add(target)
    for target, parts in pending.items():
        module = model.get_submodule(target.rsplit(".", 1)[0])
        if len(parts) != len(module.output_sizes):
            raise QuantError(f"{path}: {target} lacks some of its {len(module.output_sizes)} parts")
        _set_linear_weight(module, _stack([parts[i] for i in sorted(parts)]))
    missing = sorted(set(params) - loaded)
    if missing:
        raise QuantError(f"{path}: no tensor for {', '.join(missing[:5])}")
    weights.release_pages()  # the stacked q/k/v and gate/up read theirs: copies now
    if integer:
        _pack_model(model, prefill, few_rows, release=weights.release_pages)
    model = _finish(model)
    weights.release_pages()
    return model
