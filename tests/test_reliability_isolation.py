"""Isolation and safety: tenants' caches stay apart, model files cannot run code.

* ``cache_salt`` is the multi-tenant switch: requests with different salts never
  share a KV block (checked on the engine's block tables at every step and on its
  hit counters), the same salt shares; `kvcli audit` predicts the same hits.
* Weights load from safetensors by default; pickle checkpoints need
  ``--allow-pickle`` and even then never run code; a config asking for remote code
  is refused; nothing in kvcli sets ``trust_remote_code``.
"""

from __future__ import annotations

import ast
import itertools
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvcli.cli import main
from kvcli.engine.llm_engine import EngineConfig, LLMEngine
from kvcli.sampling_params import SamplingParams

KVCLI = Path(__file__).resolve().parents[1] / "kvcli"
PROMPT = list(range(10, 60))  # 50 tokens: 3 full blocks of 16 (+2)


@pytest.fixture(scope="module")
def model(tiny_models) -> Path:
    return tiny_models["llama"]


def run_tenants(engine: LLMEngine, tenants: dict[str, str | None],
                first_blocks: dict[str, list[int]]) -> dict[str, object]:
    """Run one request per tenant (same prompt), checking block tables after every step.

    ``first_blocks`` gets each request's first three block ids (its full prompt blocks).
    """
    for rid, salt in tenants.items():
        engine.add_request(rid, PROMPT, SamplingParams(max_tokens=4), cache_salt=salt)
    outputs = {}
    while engine.has_unfinished():
        for out in engine.step():
            outputs[out.request_id] = out
        live = {rid: engine.kv_manager.get_block_ids(rid) for rid in tenants if rid not in outputs}
        for (a, blocks_a), (b, blocks_b) in itertools.combinations(live.items(), 2):
            if tenants[a] != tenants[b]:
                assert not set(blocks_a) & set(blocks_b), f"{a} and {b} share KV blocks"
        for rid, blocks in live.items():
            first_blocks.setdefault(rid, blocks[:3])
    return outputs


def test_cache_salt_separates_tenants_and_the_same_salt_shares(model) -> None:
    engine = LLMEngine.from_config(EngineConfig(model=str(model)))
    blocks: dict[str, list[int]] = {}
    first = run_tenants(engine, {"alice-1": "alice", "bob-1": "bob", "alice-2": "alice",
                                 "anon-1": None}, blocks)
    assert {r: o.num_cached_tokens for r, o in first.items()} == \
        {"alice-1": 0, "bob-1": 0, "alice-2": 48, "anon-1": 0}
    assert engine.kv_manager.stats.hits == 48  # alice-2's three blocks, nothing else
    assert blocks["alice-2"] == blocks["alice-1"]
    # Later requests find their own tenant's cached (freed) blocks, and only those.
    second = run_tenants(engine, {"bob-2": "bob", "eve-1": "eve", "anon-2": None}, blocks)
    assert {r: o.num_cached_tokens for r, o in second.items()} == \
        {"bob-2": 48, "eve-1": 0, "anon-2": 48}
    assert engine.kv_manager.stats.hits == 3 * 48
    assert blocks["bob-2"] == blocks["bob-1"] and blocks["anon-2"] == blocks["anon-1"]
    assert not set(blocks["eve-1"]) & {b for r in ("alice-1", "bob-1", "anon-1") for b in blocks[r]}
    texts = {o.outputs[0].text for o in [*first.values(), *second.values()]}
    assert len(texts) == 1  # the salt changes what is shared, never the result


def test_cache_salt_from_input_lines_and_the_audit_agrees(model, tmp_path) -> None:
    system = {"role": "system", "content": "The quick brown fox jumps over the lazy dog. " * 4}
    rows = [{"id": f"r{i}", "messages": [system, {"role": "user", "content": f"Question {i}?"}],
             "max_tokens": 2, **({"cache_salt": salt} if salt else {})}
            for i, salt in enumerate(["alice", "bob", "alice", None, None, "bob"])]
    rows.append({"custom_id": "r6", "method": "POST", "url": "/v1/chat/completions",
                 "body": {"messages": [system, {"role": "user", "content": "Question 6?"}],
                          "cache_salt": "bob", "max_tokens": 2}})
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = CliRunner().invoke(main, ["generate", str(inp), "--model", str(model), "--ordered",
                                    "--max-num-seqs", "1"], catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    out = [json.loads(line) for line in res.stdout.splitlines()]
    cached = [r["usage"]["cached_tokens"] for r in out[:6]]
    cached.append(out[6]["response"]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"])
    shared = cached[2]
    assert shared >= 32 and cached == [0, 0, shared, 0, shared, shared, shared]
    audit = CliRunner().invoke(main, ["audit", str(inp), "--model", str(model), "--format",
                                      "json", "--fail-on", "never"], catch_exceptions=False)
    assert audit.exit_code == 0, audit.stderr
    assert [p["cached_tokens"] for p in json.loads(audit.stdout)["prompts"]] == cached


# ------------------------------------------------------------------ weights
class PlantsAFile:
    """Unpickling this creates a file: proof that loading ran code from the checkpoint."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def copy_model(src: Path, dst: Path, pickle_payload: Path | None = None,
               keep_safetensors: bool = True) -> Path:
    import torch
    from safetensors.torch import load_file

    shutil.copytree(src, dst)
    state = load_file(dst / "model.safetensors")
    if pickle_payload is not None:
        state["lm_head.extra"] = PlantsAFile(pickle_payload)
    torch.save(state, dst / "pytorch_model.bin")
    if not keep_safetensors:
        (dst / "model.safetensors").unlink()
    return dst


def generate(model: Path, tmp_path: Path, *extra: str):
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"id": "a", "prompt": "The fox walked to the river", "max_tokens": 6}\n')
    return CliRunner().invoke(main, ["generate", str(inp), "--model", str(model), *extra],
                              catch_exceptions=False)


def test_pickle_weights_need_allow_pickle_and_load_like_safetensors(model, tmp_path) -> None:
    pickled = copy_model(model, tmp_path / "pickled", keep_safetensors=False)
    refused = generate(pickled, tmp_path)
    assert refused.exit_code == 2 and refused.stdout == ""
    assert "only PyTorch pickle weights (pytorch_model.bin)" in refused.stderr
    assert "--allow-pickle" in refused.stderr
    allowed = generate(pickled, tmp_path, "--allow-pickle")
    assert allowed.exit_code == 0, allowed.stderr
    assert allowed.stdout == generate(model, tmp_path).stdout


def test_a_pickle_that_runs_code_is_refused_even_with_allow_pickle(model, tmp_path) -> None:
    planted = tmp_path / "planted"
    evil = copy_model(model, tmp_path / "evil", pickle_payload=planted, keep_safetensors=False)
    res = generate(evil, tmp_path, "--allow-pickle")
    assert res.exit_code == 2 and res.stdout == ""
    assert "a pickle checkpoint holds more than tensors" in res.stderr
    assert "(it calls io.open); kvcli loads pickle weights with torch.load(weights_only=True)" \
        in res.stderr
    assert not planted.exists()
    # Next to safetensors, the pickle is never opened (default, and with --allow-pickle).
    both = copy_model(model, tmp_path / "both", pickle_payload=planted)
    for extra in ((), ("--allow-pickle",)):
        res = generate(both, tmp_path, *extra)
        assert res.exit_code == 0, res.stderr
        assert not planted.exists()


def test_config_asking_for_remote_code_is_refused(model, tmp_path) -> None:
    remote = tmp_path / "remote"
    shutil.copytree(model, remote)
    config = json.loads((remote / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    (remote / "config.json").write_text(json.dumps(config))
    (remote / "modeling_evil.py").write_text("raise SystemExit('remote code ran')\n")
    res = generate(remote, tmp_path)
    assert res.exit_code == 2 and res.stdout == ""
    assert "field auto_map asks for the model's own Python code (trust_remote_code)" in res.stderr
    assert "kvcli never runs remote code" in res.stderr


def test_no_code_path_enables_remote_code_or_unsafe_unpickling() -> None:
    """Every call in kvcli/: trust_remote_code is never true, torch.load is weights_only=True."""
    problems = []
    for path in sorted(KVCLI.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            keywords = {k.arg: k.value for k in node.keywords}
            where = f"{path.relative_to(KVCLI.parent)}:{node.lineno}"
            remote = keywords.get("trust_remote_code")
            if remote is not None and not (isinstance(remote, ast.Constant) and remote.value is False):
                problems.append(f"{where}: trust_remote_code={ast.unparse(remote)}")
            name = ast.unparse(node.func)
            if name.endswith(("torch.load", "pickle.load", "pickle.loads")):
                safe = keywords.get("weights_only")
                if not (isinstance(safe, ast.Constant) and safe.value is True):
                    problems.append(f"{where}: {name} without weights_only=True")
    assert problems == []
