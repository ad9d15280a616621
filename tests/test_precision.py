"""--dtype and --precision (kvcli/model/precision.py): bfloat16 matmul weights with float32
activations where the CPU computes bfloat16 natively, refused where it would be emulated;
exact stays float32; fast takes what the one chooser says."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from kvcli.cli import main
from kvcli.engine.kv_disk import weights_form
from kvcli.engine.llm import LLM
from kvcli.model import large_gemm, native, precision
from kvcli.model.packed import PackedWeight
from kvcli.model.precision import PrecisionError, fast_choice, resolve_precision
from kvcli.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
PROMPTS = [[1, 5, 9, 14, 3], [2, 8, 8, 30, 41, 7, 19], [4, 4, 12]]
BF16_CPU = {"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
OLD_CPU = {"avx2", "fma", "f16c", "avx512f"}  # an older Xeon / Zen 3: no native bf16 or fp16


def with_flags(monkeypatch: pytest.MonkeyPatch, flags: set[str]) -> None:
    monkeypatch.setattr(large_gemm, "cpuinfo", lambda: ("GenuineIntel", set(flags)))


def native_bf16() -> bool:
    flags = precision.cpu_flags()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def test_bfloat16_is_refused_with_the_reason_on_a_cpu_without_it(tiny_models, monkeypatch):
    with_flags(monkeypatch, OLD_CPU)
    for dtype in ("bfloat16", "float16"):
        with pytest.raises(PrecisionError, match=f"no native {dtype}.*emulated.*refused"):
            LLM(str(tiny_models["llama"]), dtype=dtype)
    src = tiny_models["llama"].parent / "refuse.jsonl"
    src.write_text('{"prompt": "hi", "max_tokens": 2}\n')
    res = CliRunner().invoke(main, ["generate", str(src), "--model", str(tiny_models["llama"]),
                                    "--dtype", "bfloat16", "-o", "-"])
    assert res.exit_code == 2 and "avx512_bf16 or amx_bf16 not in" in res.output
    assert resolve_precision("exact", "float32", "cuda", None).weights == "float32"
    assert resolve_precision("exact", "bfloat16", "cuda", None).weights == "bfloat16"  # GPU


def test_fast_takes_the_choosers_answer(monkeypatch):
    with_flags(monkeypatch, BF16_CPU)
    assert fast_choice("cpu").weights == "bfloat16"
    assert resolve_precision("fast", None, "cpu") == fast_choice("cpu")
    with_flags(monkeypatch, OLD_CPU)
    assert fast_choice("cpu").weights == "float32" and "no native bfloat16" in fast_choice("cpu").reason
    assert resolve_precision("exact", None, "cpu").weights == "float32"
    with pytest.raises(PrecisionError, match="--precision: expected"):
        resolve_precision("turbo", None, "cpu")


@pytest.mark.skipif(not native.qint_available(native.load()), reason="no integer kernels here")
def test_fast_without_native_bf16_runs_int8_on_the_integer_kernels(tiny_models, monkeypatch):
    """Issue 33: on a CPU without native bfloat16 (Zen 3, older Xeons) fast falls back to the
    integer kernels, for --quantization auto only: none keeps float weights, as does --dtype."""
    with_flags(monkeypatch, OLD_CPU)
    chosen = resolve_precision("fast", None, "cpu", may_quantize=True)
    assert (chosen.weights, chosen.quantization) == ("float32", "int8"), chosen
    assert "integer kernels" in chosen.reason
    assert resolve_precision("fast", None, "cpu").quantization is None  # --quantization none
    assert resolve_precision("fast", "float32", "cpu").quantization is None  # --dtype float32
    llm = LLM(str(tiny_models["llama"]), precision="fast")
    assert llm.engine.config.quantization == "int8"
    label = llm.engine.runner.backend.describe()["precision"]
    assert label.startswith("fast: int8 weights, int8 activations per 32 values"), label
    plain = LLM(str(tiny_models["llama"]), precision="fast", quantization="none")
    assert plain.engine.config.quantization is None
    with_flags(monkeypatch, BF16_CPU)  # AMX too: int8 measured faster than oneDNN's bf16
    assert resolve_precision("fast", None, "cpu", may_quantize=True).quantization == "int8"


def test_fast_takes_int8_over_bfloat16(monkeypatch):
    """AVX512_BF16 without AMX (AMD Zen 4): int8 on the integer kernels (half bf16's bytes,
    VNNI's twice the multiply-adds per instruction) where fast may quantize, else the native
    bf16 kernel; with AMX-BF16 int8 too where it may quantize (measured faster on a Xeon),
    else bfloat16 on oneDNN's tiles."""
    with_flags(monkeypatch, {"avx512f", "avx512_bf16", "avx512_vnni"})
    integer = native.qint_available(native.load())
    chosen = resolve_precision("fast", None, "cpu", may_quantize=True)
    assert (chosen.weights, chosen.quantization) == (("float32", "int8") if integer
                                                     else ("bfloat16", None)), chosen
    assert resolve_precision("fast", None, "cpu").weights == "bfloat16"  # --quantization none
    assert "vdpbf16ps" in resolve_precision("fast", None, "cpu").reason
    with_flags(monkeypatch, BF16_CPU)
    chosen = resolve_precision("fast", None, "cpu", may_quantize=True)
    assert (chosen.weights, chosen.quantization) == (("float32", "int8") if integer
                                                     else ("bfloat16", None)), chosen
    assert "AMX-BF16" in resolve_precision("fast", None, "cpu").reason  # --quantization none


def test_fast_under_quantization_none_names_it_as_the_reason(monkeypatch):
    """An AVX2-only CPU (Zen 3) with the integer kernels: fast keeps float32 only because
    --quantization none forbids int8 weights, and says so (not "no integer kernels")."""
    with_flags(monkeypatch, {"avx2", "fma", "f16c"})
    chosen = resolve_precision("fast", None, "cpu")
    assert chosen.weights == "float32"
    integer = native.qint_available(native.load())
    assert ("--quantization none keeps float weights" in chosen.reason) == integer, chosen.reason
    assert ("no integer kernels" in chosen.reason) != integer


def test_explicit_dtype_overrides_the_preset_and_auto_takes_the_checkpoints(monkeypatch):
    with_flags(monkeypatch, BF16_CPU | {"avx512_fp16"})
    custom = resolve_precision("exact", "bfloat16", "cpu")
    assert (custom.preset, custom.weights) == ("custom", "bfloat16") and not custom.exact
    assert "over --precision exact's float32" in custom.reason
    assert resolve_precision("fast", "bfloat16", "cpu").preset == "fast"  # the same choice
    assert resolve_precision("exact", "auto", "cpu", "bfloat16").weights == "bfloat16"
    # float16 is native here (AVX512_FP16) but not fast without AMX-FP16: auto keeps float32
    assert resolve_precision("exact", "auto", "cpu", "float16").weights == "float32"
    assert resolve_precision("exact", "float16", "cpu").weights == "float16"
    assert resolve_precision("exact", "auto", "cpu", None).preset == "exact"


def test_exact_is_unchanged_float32(tiny_models):
    default = LLM(str(tiny_models["llama"]))
    exact = LLM(str(tiny_models["llama"]), precision="exact", dtype="float32")
    texts = [[o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]
             for llm in (default, exact)]
    assert texts[0] == texts[1]
    backend = exact.engine.runner.backend
    assert backend.precision.preset == "exact" and backend.platform.weights == torch.float32
    assert backend.describe()["precision"].startswith("exact: float32 weights")
    assert all(p.dtype == torch.float32 for p in exact.engine.model.parameters())


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_narrow_weights_with_float32_activations_agree_with_float32(tiny_models, name):
    needs = {"bfloat16": ("avx512_bf16", "amx_bf16"), "float16": ("avx512_fp16", "amx_fp16")}
    if not set(needs[name]) & precision.cpu_flags():
        pytest.skip(f"this CPU has no native {name}")
    dtype = getattr(torch, name)
    f32 = LLM(str(tiny_models["llama"]))
    bf16 = LLM(str(tiny_models["llama"]), dtype=name)
    model = bf16.engine.model
    linear = model.model.layers[0].self_attn.qkv_proj
    assert linear.weight.dtype == dtype and model.model.embed_tokens.weight.dtype == dtype
    assert model.model.norm.weight.dtype == torch.float32
    assert bf16.engine.runner.kv_cache.dtype == torch.float32  # the KV cache stays float32
    assert f"{name} weights" in bf16.engine.runner.backend.describe()["matmul"]
    # The weights are the checkpoint's rounded to bfloat16 (packed once for oneDNN), no other.
    ref = f32.engine.model.model.layers[0].self_attn.qkv_proj.weight
    assert isinstance(linear.weight, PackedWeight)
    assert torch.equal(linear.weight.dense(), ref.to(dtype))
    assert torch.equal(model.logits_weight.dense(), model.model.embed_tokens.weight)  # tied
    ids = torch.tensor(PROMPTS[1])
    h32 = f32.engine.model.model.embed_tokens(ids) @ ref.t()
    h16 = model.routes.linear(model.model.embed_tokens(ids), linear.weight)
    assert h16.dtype == torch.float32
    assert (h16 - h32).abs().max() <= 0.02 * h32.abs().max()  # bfloat16's 8-bit mantissa
    assert (h16 - h32).abs().max() > 0  # rounded: not float32 under another name
    outs = [[o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)] for llm in (f32, bf16)]
    same = sum(a == b for x, y in zip(*outs, strict=True) for a, b in zip(x, y, strict=True))
    assert same >= 0.5 * len(PROMPTS) * GREEDY.max_tokens  # mostly; no exactness is claimed


@pytest.mark.skipif(not native_bf16(), reason="this CPU has no native bfloat16")
def test_fast_runs_bfloat16_here_and_keys_the_disk_cache_apart(tiny_models):
    fast = LLM(str(tiny_models["llama"]), precision="fast", quantization="none")  # float weights
    backend = fast.engine.runner.backend
    assert backend.precision == fast_choice("cpu") and backend.platform.weights == torch.bfloat16
    assert backend.describe()["precision"].startswith("fast: bfloat16 weights")
    assert weights_form(fast.engine.config, fast.engine.model) == "bfloat16 weights"
    exact = LLM(str(tiny_models["llama"]))
    assert weights_form(exact.engine.config, exact.engine.model) is None


def test_fast_keeps_quantized_weights_their_own_format(tiny_models, monkeypatch):
    with_flags(monkeypatch, BF16_CPU)
    chosen = resolve_precision("fast", None, "cpu", quantization="int8")
    assert (chosen.weights, chosen.quantization, chosen.exact) == ("float32", "int8", False)
    llm = LLM(str(tiny_models["llama"]), precision="fast", quantization="int8")
    label = llm.engine.runner.backend.describe()["precision"]
    acts = ("int8 activations per 32 values" if native.qint_available(native.load())
            else "float32 activations")
    assert label.startswith(f"fast: int8 weights, {acts}"), label
    assert not resolve_precision("exact", None, "cpu", quantization="gguf").exact


@pytest.mark.skipif(not native_bf16(), reason="this CPU has no native bfloat16")
def test_bench_rows_carry_precision_and_bf16_agreement(tiny_models):
    import json

    res = CliRunner().invoke(main, ["bench", "--workload", "distinct", "--model",
                                    str(tiny_models["llama"]), "--compare", "kvcli-bf16",
                                    "--num-prompts", "3", "--max-tokens", "4", "--scale", "0.1",
                                    "--threads", "1", "--no-warmup", "--json"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    ref, bf16 = json.loads(res.stdout)["systems"]
    assert (ref["weights"], ref["exact"]) == ("float32", True)
    assert ref["precision"] == "float32 weights, float32 KV (exact)"
    assert (bf16["name"], bf16["weights"], bf16["exact"]) == ("kvcli-bf16", "bfloat16", False)
    assert bf16["precision"] == "bfloat16 weights, float32 KV (custom)"
    assert bf16["agreement"]["identical_share"] == pytest.approx(bf16["outputs_matching"] / 3,
                                                                 abs=1e-4)
    assert "bfloat16 weights" in bf16["details"]["backend"]["matmul"]


def test_the_engine_options_choices_are_the_precision_modules():
    from kvcli.engine import config

    assert config.DTYPE_CHOICES == precision.DTYPE_CHOICES
    assert config.PRECISIONS == precision.PRECISIONS
    assert (config.EngineConfig().precision, config.EngineConfig().dtype) == ("exact", None)


@pytest.mark.skipif(native.load() is None, reason="no native kernels: no int8 KV reader")
def test_fast_takes_the_int8_kv_cache_unless_one_is_asked_for(tiny_models):
    """Issue 33 item 3: fast's KV cache is int8 where the native kernels read it (measured
    faster on every bench workload); an explicit --kv-cache-dtype wins, and exact keeps the
    model's float32 cache."""
    assert fast_choice("cpu").kv_cache == "int8" and fast_choice("cuda").kv_cache is None
    assert resolve_precision("exact", None, "cpu").kv_cache is None
    fast = LLM(str(tiny_models["llama"]), precision="fast", quantization="none")
    assert fast.engine.config.kv_cache_dtype == "int8"
    assert fast.engine.model.platform.kv_dtype == torch.uint8  # int8 rows
    assert "int8 KV cache" in fast.engine.runner.backend.describe()["precision"]
    asked = LLM(str(tiny_models["llama"]), precision="fast", quantization="none",
                kv_cache_dtype="float32")
    assert asked.engine.model.platform.kv_dtype == torch.float32
    exact = LLM(str(tiny_models["llama"]))
    assert (exact.engine.config.kv_cache_dtype, exact.engine.model.platform.kv_dtype) == (
        "auto", torch.float32)
    outs = [o.outputs[0].token_ids for o in fast.generate(PROMPTS, GREEDY)]
    assert all(len(o) == GREEDY.max_tokens for o in outs)
