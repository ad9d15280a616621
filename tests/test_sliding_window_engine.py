"""Sliding-window block freeing end to end: greedy output still equals transformers', and a long
generation's KV memory stays bounded by the window.

Every run holds pool block 0 (the id of ``NULL_BLOCK``, the placeholder of a released block) and
fills its K/V with NaN: a path that read a placeholder would turn the output into NaN (V is read
even where a mask zeroes the weight), so equal output proves placeholders are never read.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from fidelity import HFReference, compare
from test_families import SETTINGS, SHARED, SteppedReference, make_llm, make_prompts

from kvcli.engine.llm import LLM
from kvcli.engine.sliding_window import NULL_BLOCK
from kvcli.sampling_params import SamplingParams

MAX_NEW = 12


def windowed(tiny_models, family: str, root: Path, **config) -> Path:
    """A copy of a tiny fixture with config.json fields changed (same weights)."""
    path = root / f"{family}-{abs(hash(json.dumps(config, sort_keys=True)))}"
    if not path.exists():
        shutil.copytree(tiny_models[family], path)
        raw = json.loads((path / "config.json").read_text())
        raw.update(config)
        (path / "config.json").write_text(json.dumps(raw))
    return path


QWEN2_ALL_SLIDING = ["sliding_attention"] * 2  # both layers of the fixture

#: Families where every layer has a window shorter than the prompts plus their outputs.
WINDOWED = {
    "mistral": dict(sliding_window=20),
    "qwen2": dict(use_sliding_window=True, sliding_window=20, layer_types=QWEN2_ALL_SLIDING),
    "phi3": {},  # its fixture: window 25 on every layer
}


@pytest.fixture(scope="module")
def model_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("windowed")


def poison_placeholder_block(llm: LLM) -> None:
    engine = llm.engine
    [held] = engine.kv_manager.block_pool.get_new_blocks(1)  # never freed: nothing writes it
    assert held.block_id == NULL_BLOCK.block_id
    engine.runner.kv_cache[:, :, : engine.config.block_size] = float("nan")


@pytest.fixture(scope="module", params=list(WINDOWED))
def family(request, tiny_models, model_root):
    name = request.param
    model_dir = windowed(tiny_models, name, model_root, **WINDOWED[name])
    reference = SteppedReference if name == "phi3" else HFReference  # see test_families
    return name, model_dir, reference(model_dir, MAX_NEW)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_greedy_equals_transformers_while_freeing(family, setting, monkeypatch):
    name, model_dir, ref = family
    llm = make_llm(model_dir, setting, monkeypatch)
    window = llm.engine.kv_manager.window
    assert window is not None and window.window == (25 if name == "phi3" else 20)
    poison_placeholder_block(llm)
    prompts = make_prompts(llm.engine.vocab_size)
    outs = llm.generate([list(p) for p in prompts], SamplingParams(max_tokens=MAX_NEW,
                                                                   ignore_eos=True))
    ties = sum(compare(ref, p, o.outputs[0].token_ids) for p, o in zip(prompts, outs, strict=True))
    assert ties <= 1, f"{ties} ties in {len(prompts)} prompts"
    assert window.num_released > 0  # the test did free blocks mid-run
    stats = llm.engine.stats()
    if setting == "caching-16":
        assert outs[2].num_cached_tokens == SHARED  # a hit longer than the window
    if setting.startswith("no-caching"):
        assert stats["cached_tokens"] == 0
    assert (stats["preemptions"] > 0) is setting.startswith("preemption")


@pytest.mark.parametrize("caching", [True, False])
def test_long_generation_memory_is_bounded_by_the_window(tiny_models, model_root, caching):
    """400 tokens, window 32, block 16, two samples (n=2) sharing the prompt's blocks."""
    window, block_size, max_new = 32, 16, 400
    model_dir = windowed(tiny_models, "mistral", model_root, sliding_window=window)
    llm = LLM(str(model_dir), block_size=block_size, num_blocks=64,
              enable_prefix_caching=caching)
    poison_placeholder_block(llm)
    prompt = make_prompts(llm.engine.vocab_size)[4][:20]
    [out] = llm.generate([prompt], SamplingParams(n=2, max_tokens=max_new, ignore_eos=True))
    ref = HFReference(model_dir, max_new)
    for sample in out.outputs:
        assert compare(ref, prompt, sample.token_ids) == 0
    bound = math.ceil(window / block_size) + 2
    kv = llm.engine.kv_manager
    print(f"\npeak blocks per sequence {kv.peak_request_blocks} (bound {bound}, "
          f"{math.ceil((len(prompt) + max_new) / block_size)} without freeing); pool peak "
          f"{kv.stats.peak_blocks_in_use} incl. the held block")
    assert kv.peak_request_blocks <= bound
    assert kv.stats.peak_blocks_in_use <= 2 * bound + 1  # + the poisoned block this test holds
    assert kv.window is not None and kv.window.num_released >= 2 * (max_new // block_size - 3)


@pytest.mark.parametrize("name, config, expected", [
    ("mistral", {}, None),  # the fixture has no window
    ("mistral", dict(sliding_window=32), 32),
    ("phi3", {}, 25),
    ("mixtral", {}, 20),
    ("qwen2", dict(use_sliding_window=True, sliding_window=20, layer_types=QWEN2_ALL_SLIDING),
     20),
    ("qwen2-moe", {}, None),  # only its first layer is windowed
    ("gemma2", {}, None),  # local and global layers: the global ones need every block
    ("gemma3", {}, None),
])
def test_common_window_frees_only_when_every_layer_is_windowed(tiny_models, model_root, name,
                                                               config, expected):
    from kvcli.model.loader import load_model

    model_dir = windowed(tiny_models, name, model_root, **config) if config else tiny_models[name]
    assert load_model(model_dir).common_sliding_window == expected
