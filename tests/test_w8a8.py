"""fast's int8 copy for few-row matmuls on AMX-INT8 (native/w8a8.c, quant/w8a8.py): weights per
output channel, activations per 64 values, tile products; batched decode steps run it."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from test_native_step import _check_rows
from test_precision import BF16_CPU, with_flags
from test_qint_kernels import gguf_weight

from kvcli.engine.kv_disk import weights_form
from kvcli.engine.llm import LLM
from kvcli.model import native
from kvcli.model.precision import resolve_precision
from kvcli.model.quant import apply
from kvcli.model.quant.int_weights import pack
from kvcli.model.quant.w8a8 import W8A8_ROWS, W8Weight
from kvcli.model.quant.weights import Q4_1
from kvcli.model.routes import process_routes
from kvcli.sampling_params import SamplingParams

AMX = native.w8a8_available(native.load())
needs_amx = pytest.mark.skipif(not AMX, reason="needs AMX-INT8 (and the tiles granted)")


def codes(weight: W8Weight) -> torch.Tensor:
    """The [out, in] int8 codes back from the packed tiles (w8a8.c's layout)."""
    out_features, in_features = weight.shape
    steps, groups = -(-in_features // 64), -(-out_features // 16)
    tiles = weight.packed.view(groups, steps, 16, 16, 4)  # group, step, k / 4, channel, k % 4
    plain = tiles.permute(0, 3, 1, 2, 4).reshape(groups * 16, steps * 64)
    return plain[:out_features, :in_features]


@needs_amx
@pytest.mark.parametrize("rows,out_f,in_f", [(1, 16, 64), (3, 40, 100), (17, 49, 130),
                                             (33, 96, 576), (80, 64, 192)])
def test_products_are_the_codes_integer_sums(rows, out_f, in_f):
    """Integer data whose every channel and every 64 activations reach 127: codes are the
    values and scales 1, so the product is the integer one (float32 sums of int32 tiles)."""
    g = torch.Generator().manual_seed(rows * out_f + in_f)
    w = torch.randint(-127, 128, (out_f, in_f), generator=g).float()
    w[:, 0] = 127
    x = torch.randint(-20, 21, (rows, in_f), generator=g).float()
    x[:, ::64] = -127
    bias = torch.randn(out_f, generator=g)
    few = W8Weight.of(w)
    assert torch.equal(few.scales, torch.ones(out_f)) and torch.equal(codes(few), w.to(torch.int8))
    got = few.linear(x.reshape(1, rows, in_f), bias)
    assert got.shape == (1, rows, out_f) and got.dtype == torch.float32
    expect = x.double() @ w.double().T + bias.double()
    torch.testing.assert_close(got[0].double(), expect, rtol=1e-6, atol=1e-4)


@needs_amx
def test_each_channel_is_rounded_to_8_bits():
    torch.manual_seed(0)
    w = torch.randn(37, 150) * torch.logspace(-3, 2, 37)[:, None]
    w[5] = 0.0
    few = W8Weight.of(w)
    c = codes(few).float()
    scale = w.abs().amax(1) / 127
    torch.testing.assert_close(few.scales, scale, rtol=1e-6, atol=0)
    assert (c[5] == 0).all() and few.scales[5] == 0
    assert (c.abs().amax(1)[torch.arange(37) != 5] == 127).all()
    assert ((c * few.scales[:, None] - w).abs() <= few.scales[:, None] * 0.5001).all()
    x = torch.randn(9, 150)
    exact = x @ w.T
    err = (few.linear(x, None) - exact).norm(dim=0) / exact.norm(dim=0).clamp_min(1e-30)
    assert err[torch.arange(37) != 5].max() < 5e-2, err  # 8-bit weights and activations: ~1%


@needs_amx
def test_one_row_runs_the_blocks_few_rows_the_int8_copy_many_the_bf16_copy():
    weight, dense = gguf_weight(Q4_1, 48, 64, seed=3)
    routes = replace(process_routes(), int_matmul=native.qint_variant(native.load()),
                     bf16_prefill_rows=8, w8a8_rows=2)
    values = torch.from_numpy(dense)
    plain, both = pack(weight, routes), pack(weight, routes, wide=values, few=values)
    assert plain.few is None and isinstance(both.few, W8Weight)
    assert both.nbytes == plain.nbytes + 2 * 48 * 64 + both.few.nbytes
    one, few, many = torch.randn(1, 64), torch.randn(7, 64), torch.randn(2, 4, 64)
    assert torch.equal(both.linear(one, None), plain.linear(one, None))
    assert torch.equal(both.linear(few, None), both.few.linear(few, None))
    assert not torch.equal(both.linear(few, None), plain.linear(few, None))
    assert torch.equal(both.linear(many, None), both.wide.linear(many, None))
    off = replace(routes, w8a8_rows=0)
    assert pack(weight, off, few=values).few is None  # the routes say whether it is kept


def test_fast_takes_the_int8_copy_where_the_tiles_run(monkeypatch):
    with_flags(monkeypatch, BF16_CPU)
    monkeypatch.delenv("KVCLI_W8A8", raising=False)
    chosen = resolve_precision("fast", None, "cpu", quantization="gguf-int")
    assert chosen.few_rows == ("int8" if AMX else None)
    assert ("per-channel copy for batched decode" in chosen.label) == AMX
    assert resolve_precision("fast", None, "cpu", quantization="gguf").few_rows is None
    assert resolve_precision("exact", None, "cpu", quantization="gguf-int").few_rows is None
    monkeypatch.setenv("KVCLI_W8A8", "0")
    assert resolve_precision("fast", None, "cpu", quantization="gguf-int").few_rows is None


@needs_amx
def test_fast_engine_decodes_batches_from_the_copy(tiny_models, monkeypatch):
    monkeypatch.delenv("KVCLI_W8A8", raising=False)
    with_flags(monkeypatch, BF16_CPU)
    llm = LLM(str(tiny_models["llama"]), precision="fast", quantization="int8")
    model = llm.engine.model
    assert model.routes.w8a8_rows == W8A8_ROWS
    assert "an int8 copy per channel" in model.routes.describe()["matmul"]
    layer = model.model.layers[0]
    assert layer.self_attn.qkv_proj.weight.few is not None
    assert layer.mlp.down_proj.weight.few is not None
    assert model.model.embed_tokens.weight.few is not None  # the tied output layer
    assert weights_form(llm.engine.config, model).endswith(" with int8 batched decode")
    calls: list[int] = []
    run = W8Weight.linear
    monkeypatch.setattr(W8Weight, "linear",
                        lambda self, x, bias: calls.append(x.shape[0]) or run(self, x, bias))
    prompts = [[(7 * i + j) % 200 + 3 for i in range(9 + j)] for j in range(W8A8_ROWS + 1)]
    out = llm.generate(prompts, SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))
    assert all(len(o.outputs[0].token_ids) == 5 for o in out)
    assert W8A8_ROWS + 1 in calls  # a decode step's logits for every sequence
    assert all(rows >= W8A8_ROWS for rows in calls)  # fewer rows keep the weights' own blocks


@needs_amx
@pytest.mark.parametrize("kv", ["auto", "int8"])
def test_batched_steps_on_the_copy_equal_the_torch_path(tiny_models, monkeypatch, kv):
    monkeypatch.delenv("KVCLI_W8A8", raising=False)
    monkeypatch.setattr(apply, "W8A8_ROWS", 2)  # the three sequences' steps take the copy
    llm = LLM(str(tiny_models["llama"]), precision="fast", quantization="int8",
              kv_cache_dtype=kv, block_size=4, enable_prefix_caching=False)
    assert llm.engine.model.routes.w8a8_rows == 2
    _check_rows(llm)
