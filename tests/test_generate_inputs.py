"""`kvcli generate A.jsonl B.jsonl ...`: several INPUT files read as one input (issue 16)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvcli.cli import main

SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "prompts"


def _run(*args: str) -> tuple[int, list[dict], str]:
    res = CliRunner().invoke(main, ["generate", *args, "--max-tokens", "1", "--ordered"])
    return res.exit_code, [json.loads(line) for line in res.stdout.splitlines()], res.stderr


# What a line's input problems depend on: the default model's tokenizer, chat template,
# context length, dtype and KV cache geometry (layers, KV heads, head size: what a long prompt
# needs of the cache). Its weights decide only the one token generated, which no one checks.
_TWIN_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
               "generation_config.json")
_TWIN_SIZES = {"hidden_size": 72, "intermediate_size": 72}  # 9 heads divide 72


@pytest.fixture(scope="module")
def default_model_twin(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model with narrow random matrices: its 34 long sample prompts prefill in
    seconds instead of 30 s, with everything an input problem depends on kept (see above)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    twin = tmp_path_factory.mktemp("default-twin")
    for name in _TWIN_FILES:
        shutil.copy(default_model_dir / name, twin / name)
    config = AutoConfig.from_pretrained(default_model_dir)
    config.update(_TWIN_SIZES)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(twin)
    return twin


@pytest.mark.slow  # the default model's tokenizer: the samples' prompts outgrow the tiny models'
def test_every_sample_file_runs_with_no_input_problem(default_model_twin):
    """`kvcli generate samples/prompts/*.jsonl`, as issue 16 asks: every line runs."""
    files = sorted(str(p) for p in SAMPLES.glob("*.jsonl"))
    code, rows, err = _run(*files, "--model", str(default_model_twin))
    expected = sum(1 for f in files for line in Path(f).read_text().splitlines() if line.strip())
    assert code == 0, err
    assert len(rows) == expected and not any(r.get("error") for r in rows)


def test_messages_name_each_file_and_ids_count_across_them(tiny_models, tmp_path):
    a, b, out = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "out.jsonl"
    a.write_text('{"prompt": "The fox"}\n\n{"prompt": "ran"}\n')
    b.write_text('{"prompt": "Once"}\n{"prompt": ""}\n')
    model = ["--model", str(tiny_models["llama"])]
    code, rows, err = _run(str(a), str(b), *model, "-o", str(out))
    assert code == 1
    assert f"{b}:2: prompt: expected a non-empty string" in err  # b's own line, not line 5
    done = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in done] == ["line-1", "line-3", "line-4", "line-5"]
    again = CliRunner().invoke(main, ["generate", str(a), str(b), *model, "-o", str(out),
                                      "--resume", "--max-tokens", "1"])
    assert "resuming: 4 requests already in" in again.stderr
    assert len(out.read_text().splitlines()) == 4  # nothing ran twice


def test_stdin_does_not_mix_with_files(tmp_path):
    a = tmp_path / "a.jsonl"
    a.write_text('{"prompt": "x"}\n')
    res = CliRunner().invoke(main, ["generate", str(a), "-"])
    assert res.exit_code == 2 and "- (stdin) cannot be combined" in res.stderr
    res = CliRunner().invoke(main, ["generate", str(a), str(tmp_path / "missing.jsonl")])
    assert res.exit_code == 2 and "missing.jsonl" in res.stderr
