"""``--quantization gguf-int`` on a k-quant GGUF (a Q4_K_M file's mix: Q4_K matrices, Q6_K v,
down projections and tied embedding / output layer, Q5_K in one layer's gate and up), through
the model: every integer matmul of a greedy run equals the gguf (float) model's matmul of the
same q8_0-rounded input to 1e-5, greedy tokens equal the gguf model's on q8_0-rounded inputs
(quant_runs.py), q/k/v of two types run part by part, and the embedding's rows come from its
Q6_K bytes.

k-quant rows hold whole 256-weight superblocks, wider than the tiny fixtures (64), so this model
is the tiny llama at width 256; gguf's Python package cannot quantize k-quants, so its matrices
are random blocks (k_quant_blocks.py) with small scales, shaped a little (_centered) so that
greedy tokens vary: the comparison is between two modes of the same file, not with the float
checkpoint.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from k_quant_blocks import random_k_quant_blocks
from quant_runs import check_gguf_int_is_gguf_on_q8_0
from tiny_models import make_tiny_gguf

from kvcli.model import native
from kvcli.model.gguf_convert import resolve_model
from kvcli.model.quant.int_weights import IntWeight
from kvcli.model.quant.load import load_quantized
from kvcli.model.quant.weights import Q4_K, Q5_K, Q6_K, StackedWeight

lib = native.load()
pytestmark = pytest.mark.skipif(lib is None or not lib.kvcli_qint_variants(),
                                reason="no C compiler or not x86: no integer kernels")
WIDTH = 256


def _kind_for(name: str) -> int:
    if name.startswith("token_embd") or name.endswith(("attn_v.weight", "ffn_down.weight")):
        return Q6_K
    return Q5_K if name.startswith("blk.1.ffn_") else Q4_K


def _wide_llama(tiny_llama: Path, path: Path) -> Path:
    """The tiny llama (tokenizer, template) with hidden and FFN width 256, random weights."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    shutil.copytree(tiny_llama, path)
    config = json.loads((path / "config.json").read_text())
    config.update(hidden_size=WIDTH, intermediate_size=WIDTH, head_dim=WIDTH // 4)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(LlamaConfig(**config)).save_pretrained(path)
    return path


def _centered(blocks: np.ndarray, kind: int) -> np.ndarray:
    """Random blocks made a little more like a trained model's (wholly random ones lean one way
    and the model answers one token): Q6_K's int8 scales +-100 (rows of like norms), Q4_K's /
    Q5_K's weights centred on 0: each sub-block's min m equal to its scale sc (the 12 scale
    bytes: bytes 4-7 = 0-3, and equal nibbles in 8-11), dmin = d * the mid code (7.5; 15.5)."""
    if kind == Q6_K:
        b = blocks.reshape(*blocks.shape[:-1], -1, 210)
        b[..., 192:208] = np.where(b[..., 192:208] & 128, 256 - 100, 100)
        return blocks
    b = blocks.reshape(*blocks.shape[:-1], -1, 144 if kind == Q4_K else 176)
    b[..., 8:12] = b[..., 4:8]
    b[..., 12:16] = (b[..., 12:16] & 15) * 17
    d = b[..., 0:2].copy().view(np.float16).astype(np.float32)
    b[..., 2:4] = (d * (7.5 if kind == Q4_K else 15.5)).astype(np.float16).view(np.uint8)
    return blocks


@pytest.fixture(scope="module")
def k_quant_gguf(tiny_models, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("kquant")
    real_add = gguf.GGUFWriter.add_tensor
    seeds = iter(range(1000))

    def add_tensor(self, name, array, *args, **kwargs):
        if array.ndim == 2 and array.dtype == np.float32:
            kind, d = _kind_for(name), 0.0001 if name.startswith("token_embd") else 0.0004
            blocks = _centered(random_k_quant_blocks(kind, *array.shape, seed=next(seeds),
                                                     scale=(d, d * 1.1)), kind)
            return real_add(self, name, blocks, raw_dtype=gguf.GGMLQuantizationType(kind))
        return real_add(self, name, array, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf.GGUFWriter, "add_tensor", add_tensor)
        return make_tiny_gguf(_wide_llama(tiny_models["llama"], tmp / "wide"), tmp / "kq.gguf")


def test_gguf_int_runs_k_quants_as_gguf_on_q8_0_activations(k_quant_gguf, kvcli_home,
                                                             monkeypatch):
    model_dir = resolve_model(str(k_quant_gguf), quantization="gguf-int")
    model = load_quantized(model_dir, "gguf-int")
    weights = [m.weight for m in model.modules() if type(m).__name__ in ("Linear",
                                                                          "QuantEmbedding")]
    parts = [p for w in weights for p in (w.parts if isinstance(w, StackedWeight) else [w])]
    assert all(isinstance(p, IntWeight) for p in parts)
    assert {p.kind for p in parts} == {Q4_K, Q5_K, Q6_K}
    assert any(isinstance(w, StackedWeight) for w in weights)  # q, k Q4_K beside v Q6_K
    embedding = model.model.embed_tokens.weight
    assert embedding.kind == Q6_K and embedding.source is not None  # rows from its GGUF bytes
    gguf_embedding = load_quantized(model_dir, "gguf").model.embed_tokens.weight
    ids = torch.tensor([3, 0, 200])
    assert torch.equal(embedding.dequantize(ids), gguf_embedding.dequantize(ids))
    check_gguf_int_is_gguf_on_q8_0(model, model_dir, monkeypatch)
