"""fast's bfloat16 prefill on integer-kernel weights (precision._fast_prefill, quant/int_weights.py):
on a CPU with AMX-BF16 each quantized Linear keeps a bfloat16 copy of its own values, which its
matmuls of BF16_PREFILL_ROWS rows or more run through oneDNN; fewer rows stay integer."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from test_precision import BF16_CPU, with_flags
from test_qint_kernels import gguf_weight

from kvcli.engine.kv_disk import weights_form
from kvcli.engine.llm import LLM
from kvcli.model import native
from kvcli.model.decoder import GatedMLP
from kvcli.model.packed import PackedWeight, SwiGLU
from kvcli.model.precision import PrecisionError, resolve_precision
from kvcli.model.quant.int_weights import BF16_PREFILL_ROWS, IntWeight, pack
from kvcli.model.quant.weights import Q4_1
from kvcli.model.routes import KernelRoutes, process_routes
from kvcli.sampling_params import SamplingParams

ZEN4 = {"avx512f", "avx512_bf16", "avx512_vnni"}  # native bf16, no AMX
INTEGER = native.qint_available(native.load())
ONEDNN_BF16 = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
needs_both = pytest.mark.skipif(not (INTEGER and ONEDNN_BF16),
                                reason="needs the integer kernels and oneDNN's bfloat16")


def test_fast_takes_bf16_prefill_on_amx_only(monkeypatch):
    monkeypatch.delenv("KVCLI_FAST_PREFILL", raising=False)
    with_flags(monkeypatch, BF16_CPU)
    for mode in ("gguf-int", "int8"):
        chosen = resolve_precision("fast", None, "cpu", quantization=mode)
        assert chosen.prefill == ("bfloat16" if INTEGER else None), chosen
    assert resolve_precision("fast", None, "cpu", quantization="gguf").prefill is None  # f32 math
    assert resolve_precision("exact", None, "cpu", quantization="gguf-int").prefill is None
    if INTEGER:
        assert "bfloat16 prefill matmuls" in resolve_precision(
            "fast", None, "cpu", quantization="gguf-int").label
        assert resolve_precision("fast", None, "cpu", may_quantize=True).prefill == "bfloat16"
    with_flags(monkeypatch, ZEN4)  # AVX512-VNNI without AMX: a GGUF's int8 copy per channel
    assert resolve_precision("fast", None, "cpu", quantization="gguf-int").prefill == "int8"
    assert resolve_precision("fast", None, "cpu", quantization="int8").prefill is None  # int8
    with_flags(monkeypatch, {"avx2", "fma"})  # unmeasured there: the blocks at every row count
    assert resolve_precision("fast", None, "cpu", quantization="gguf-int").prefill is None


def test_kvcli_fast_prefill_overrides_and_is_checked(monkeypatch):
    with_flags(monkeypatch, BF16_CPU)
    monkeypatch.setenv("KVCLI_FAST_PREFILL", "blocks")
    assert resolve_precision("fast", None, "cpu", quantization="gguf-int").prefill is None
    monkeypatch.setenv("KVCLI_FAST_PREFILL", "int8")
    assert resolve_precision("fast", None, "cpu", quantization="gguf-int").prefill == "int8"
    monkeypatch.setenv("KVCLI_FAST_PREFILL", "bfloat16")
    with_flags(monkeypatch, ZEN4)
    assert resolve_precision("fast", None, "cpu", quantization="gguf-int").prefill == (
        "bfloat16" if INTEGER else None)
    with_flags(monkeypatch, {"avx2", "fma"})
    with pytest.raises(PrecisionError, match="no native bfloat16"):
        resolve_precision("fast", None, "cpu", quantization="gguf-int")
    monkeypatch.setenv("KVCLI_FAST_PREFILL", "fp8")
    with pytest.raises(PrecisionError, match="KVCLI_FAST_PREFILL='fp8'"):
        resolve_precision("fast", None, "cpu", quantization="gguf-int")


def packed_with_copy(**rows: int) -> tuple[np.ndarray, KernelRoutes, IntWeight, IntWeight]:
    """A 48 x 64 Q4_1 matrix's values, routes whose copy runs from ``rows`` (a KernelRoutes
    field), and the matrix packed without and with that copy."""
    weight, dense = gguf_weight(Q4_1, 48, 64, seed=3)
    routes = replace(process_routes(), int_matmul=native.qint_variant(native.load()), **rows)
    return dense, routes, pack(weight, routes), pack(weight, routes, wide=torch.from_numpy(dense))


@needs_both
def test_many_rows_run_the_bf16_copy_and_few_the_integers():
    dense, _, plain, wide = packed_with_copy(bf16_prefill_rows=8)
    assert plain.wide is None and isinstance(wide.wide, PackedWeight)
    assert wide.nbytes == plain.nbytes + 2 * 48 * 64
    few, many = torch.randn(7, 64), torch.randn(2, 4, 64)  # 8 rows in a [2, 4] batch
    assert torch.equal(wide.linear(few, None), plain.linear(few, None))
    got = wide.linear(many, None)
    rounded = torch.from_numpy(dense).bfloat16().float()
    expect = (many.bfloat16().float() @ rounded.T).bfloat16().float()  # oneDNN's bf16 out
    assert got.shape == (2, 4, 48)
    torch.testing.assert_close(got, expect, rtol=2e-2, atol=2e-2)
    assert not torch.equal(got, plain.linear(many, None))
    bias = torch.randn(48)
    torch.testing.assert_close(wide.linear(many, bias), got + bias, rtol=0, atol=1e-6)


@needs_both
def test_fast_engine_prefills_from_the_copy_and_keys_its_cache_apart(tiny_models, monkeypatch):
    monkeypatch.delenv("KVCLI_FAST_PREFILL", raising=False)
    with_flags(monkeypatch, BF16_CPU)
    llm = LLM(str(tiny_models["llama"]), precision="fast", quantization="int8")
    assert llm.engine.model.routes.bf16_prefill_rows == BF16_PREFILL_ROWS
    assert "bfloat16 prefill matmuls" in llm.engine.runner.backend.describe()["precision"]
    few = " with int8 batched decode" if native.w8a8_available(native.load()) else ""
    tiles = [m.wide.tiles for m in llm.engine.model.modules() if isinstance(m, GatedMLP)]
    assert tiles and len(set(tiles)) == 1  # one route for every MLP
    front = " (MLP front on AMX-BF16 tiles)" if tiles[0] else ""  # another sum order: its own key
    assert weights_form(llm.engine.config, llm.engine.model) == (
        f"int8 with bfloat16 prefill{front}{few}")
    calls: list[int] = []  # the copy's matmuls (the q/k/v and output projections leave their
    run = PackedWeight.narrow_linear  # products narrow, decoder.py; the MLP is a SwiGLU)
    monkeypatch.setattr(PackedWeight, "narrow_linear",
                        lambda self, x: calls.append(x.numel()) or run(self, x))
    prompt = [(7 * i) % 200 + 3 for i in range(BF16_PREFILL_ROWS + 9)]
    out = llm.generate([prompt], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 4 and calls  # the long prefill took the copy
    monkeypatch.setenv("KVCLI_FAST_PREFILL", "blocks")
    plain = LLM(str(tiny_models["llama"]), precision="fast", quantization="int8")
    assert plain.engine.model.routes.bf16_prefill_rows == 0
    assert weights_form(plain.engine.config, plain.engine.model) == f"int8{few}"


@needs_both
def test_swiglu_is_the_mlp_in_bfloat16():
    torch.manual_seed(0)
    gate_up, down = torch.randn(96, 64) / 8, torch.randn(64, 48) / 7
    mlp, x = SwiGLU.of(gate_up, down), torch.randn(3, 30, 64)
    g, u = (x @ gate_up.bfloat16().float().T).chunk(2, dim=-1)
    expect = (torch.nn.functional.silu(g) * u) @ down.bfloat16().float().T
    got = mlp(x)
    assert got.shape == (3, 30, 64) and got.dtype == torch.float32
    torch.testing.assert_close(got, expect, rtol=3e-2, atol=3e-2)


@pytest.mark.skipif(not (ONEDNN_BF16 and native.swiglu_amx_available(native.load())),
                    reason="no AMX-BF16 here (or the OS did not grant the tiles)")
@pytest.mark.parametrize("rows", [1, 37, 160])  # under a tile, a tile pair and a part, whole
def test_swiglu_tiles_equal_onednns_mlp_to_its_rounding(monkeypatch, rows):
    """swiglu_amx.c's gate, up and SiLU give oneDNN's MLP up to the order of the float32 sums
    (channels past a 16-channel group and rows past a tile included), and run here."""
    torch.manual_seed(rows)
    gate_up, down = torch.randn(2 * 72, 96) / 8, torch.randn(96, 72) / 7
    x = torch.randn(rows, 96)
    tiled = SwiGLU.of(gate_up, down)
    monkeypatch.setenv("KVCLI_SWIGLU_AMX", "0")
    plain = SwiGLU.of(gate_up, down)
    assert tiled.tiles and not plain.tiles
    got, want = tiled(x, narrow=True), plain(x, narrow=True)
    assert got.dtype == want.dtype == torch.bfloat16
    # the intermediate's bfloat16 roundings differ by an ulp here and there: ~1% of the scale
    scale = float(want.float().abs().max())
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=1e-2 * scale)
    g, u = (x.bfloat16().float() @ gate_up.bfloat16().float().T).chunk(2, dim=-1)
    front = (torch.nn.functional.silu(g) * u).bfloat16()
    torch.testing.assert_close(tiled._front(x.bfloat16()).float(), front.float(), rtol=1e-2,
                               atol=1e-3)


@needs_both
@pytest.mark.parametrize("family", ["llama", "mistral"])  # tied, untied output layer
@pytest.mark.parametrize("w8a8", ["1", "0"])  # with and without fast's int8 decode copy
def test_fast_mlps_run_fused_from_the_copy(tiny_models, monkeypatch, family, w8a8):
    monkeypatch.delenv("KVCLI_FAST_PREFILL", raising=False)
    monkeypatch.setenv("KVCLI_W8A8", w8a8)
    with_flags(monkeypatch, BF16_CPU)
    model = LLM(str(tiny_models[family]), precision="fast", quantization="int8").engine.model
    mlps = [m for m in model.modules() if isinstance(m, GatedMLP)]
    assert mlps and all(isinstance(m.wide, SwiGLU) for m in mlps)
    assert all(m.gate_up_proj.weight.wide is None for m in mlps)  # one copy, the MLP's
    assert not any(hasattr(m, "prefill_source") for m in model.modules())  # dropped once used
    head = model.lm_head or model.model.embed_tokens  # the output layer: sampled rows, no copy
    assert head.weight.wide is None
    assert model.model.layers[0].self_attn.qkv_proj.weight.wide is not None
    mlp, hidden = mlps[0], mlps[0].down_proj.weight.shape[0]
    many, few = torch.randn(BF16_PREFILL_ROWS, hidden), torch.randn(3, hidden)
    float_model = LLM(str(tiny_models[family])).engine.model  # the float32 weights int8 came from
    exact = next(m for m in float_model.modules() if isinstance(m, GatedMLP))(many)
    integer = mlp.down_proj(mlp.act_and_mul(mlp.routes, mlp.gate_up_proj(many)))
    errors = [((got - exact).norm() / exact.norm()).item() for got in (mlp(many), integer)]
    assert max(errors) < 3e-2, errors  # int8 weights, then bf16 or int8 activations
    assert torch.equal(mlp(few), mlp.down_proj(mlp.act_and_mul(mlp.routes,
                                                                mlp.gate_up_proj(few))))


def test_rms_norm_in_bfloat16_rounds_as_torch():
    """The norm's bf16 pass equals its float32 result rounded by torch, bit for bit (ties to
    even, large and tiny magnitudes; a NaN row stays NaN)."""
    lib = native.load()
    if lib is None:
        pytest.skip("needs the native kernels")
    torch.manual_seed(0)
    x = torch.randn(97, 576) * torch.logspace(-6, 6, 97)[:, None]
    x[5, 7] = float("nan")
    weight = torch.randn(576)
    wide = native.rms_norm(lib, x, weight, 1e-5)
    narrow = native.rms_norm(lib, x, weight, 1e-5, narrow=True)
    rounded = wide.to(torch.bfloat16)
    assert narrow.dtype == torch.bfloat16 and torch.equal(narrow.isnan(), rounded.isnan())
    numbers = ~rounded.isnan()  # a NaN stays a NaN (torch writes its own NaN pattern)
    assert torch.equal(narrow.view(torch.int16)[numbers], rounded.view(torch.int16)[numbers])


@needs_both
def test_norms_read_by_a_copy_hand_over_bfloat16(tiny_models, monkeypatch):
    """A pre-norm layer's two norms feed matmuls with a copy: many rows leave them in bf16 (what
    the copy would round them to), few rows in float32; the layer's output is unchanged."""
    monkeypatch.delenv("KVCLI_FAST_PREFILL", raising=False)
    with_flags(monkeypatch, BF16_CPU)
    model = LLM(str(tiny_models["llama"]), precision="fast", quantization="int8").engine.model
    layer = model.model.layers[0]
    assert layer.attn_in.feeds_bf16_copy and layer.mlp_in.feeds_bf16_copy
    assert not model.model.norm.feeds_bf16_copy  # read by the output layer, which has no copy
    hidden = layer.mlp_in.weight.shape[0]
    many, few = torch.randn(BF16_PREFILL_ROWS, hidden), torch.randn(3, hidden)
    assert layer.mlp_in(many).dtype == torch.bfloat16 and layer.mlp_in(few).dtype == torch.float32
    for norm in (layer.attn_in, layer.mlp_in):  # what the copy would have rounded, bit for bit
        norm.feeds_bf16_copy = False
        wide = norm(many).to(torch.bfloat16)
        norm.feeds_bf16_copy = True
        assert torch.equal(norm(many).view(torch.int16), wide.view(torch.int16))
    mlp = layer.mlp
    layer.mlp_in.feeds_bf16_copy = False
    wide = mlp(layer.mlp_in(many))
    layer.mlp_in.feeds_bf16_copy = True
    assert torch.equal(mlp(layer.mlp_in(many)), wide)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_residual_add_and_norm_in_one_pass_equal_apart(dtype):
    """A product added into float32 rows and the sum's norm, in one pass, give the (widen-then-)
    add and the norm's numbers bit for bit: a bfloat16 product (fast's copy's) with the norm
    rounded to bfloat16, a float32 one (a pre-norm layer's residual adds) in float32."""
    routes = process_routes()
    if routes.native is None:
        pytest.skip("needs the native kernels")
    torch.manual_seed(0)
    x = torch.randn(83, 576) * 3
    delta = torch.randn(83, 576).to(dtype)
    weight = torch.randn(576)
    total, normed = routes.add_rms_norm(x, delta, weight, 1e-5)
    assert torch.equal(total, x + delta.float())
    narrow = dtype == torch.bfloat16
    expect = native.rms_norm(routes.native, x + delta.float(), weight, 1e-5, narrow=narrow)
    assert normed.dtype == dtype and torch.equal(normed.view(torch.int16),
                                                 expect.view(torch.int16))


@needs_both
def test_fast_layers_keep_products_narrow_with_the_same_outputs(tiny_models, monkeypatch):
    """fast's pre-norm layers leave the attention's and the MLP's bf16 products unwidened on
    the copy's rows (DecoderLayer._narrow): outputs and logprobs equal the widening path's."""
    from kvcli.model.decoder import DecoderLayer

    monkeypatch.delenv("KVCLI_FAST_PREFILL", raising=False)
    with_flags(monkeypatch, BF16_CPU)
    llm = LLM(str(tiny_models["llama"]), precision="fast", quantization="int8",
              enable_prefix_caching=False)  # each run computes every prompt's rows again
    prompts = [[(7 * i + j) % 200 + 3 for i in range(BF16_PREFILL_ROWS + 20 * j)] for j in range(3)]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=2)

    def run():
        return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in llm.generate(prompts, params)]

    taken: list[int] = []
    narrow = DecoderLayer._narrow
    monkeypatch.setattr(DecoderLayer, "_narrow", lambda self, h, *a: taken.append(1) or narrow(
        self, h, *a))
    got = run()
    assert taken  # the long prefills took the narrow path

    def widened(self, hidden, x, cos_sin, kv_layer, meta):
        hidden = hidden + self.self_attn(x, cos_sin, kv_layer, meta)
        return hidden + getattr(self, self.mlp_name)(self.mlp_in(hidden)), None

    monkeypatch.setattr(DecoderLayer, "_narrow", widened)
    assert run() == got
