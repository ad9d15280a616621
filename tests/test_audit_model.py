"""--model: the model's own tokenizer and chat template, exactly as `kvcli generate` encodes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_audit_support import TOOLS, chat, run, system, user, write_jsonl

from kvcli.audit import predict_cached_tokens
from kvcli.hashing import hash_token_blocks

STORIES = Path(__file__).resolve().parents[2] / "shared" / "models" / "stories260K"
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if tools %}<|tools|>{{ tools | tojson }}{% endif %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    if not (STORIES / "tokenizer.json").is_file():
        pytest.skip("shared/models/stories260K is not available")
    directory = tmp_path / "stories-chat"
    directory.mkdir()
    for file in STORIES.iterdir():
        (directory / file.name).symlink_to(file)
    (directory / "chat_template.jinja").write_text(TEMPLATE)
    return directory


def test_model_tokenizer_and_template_predict_generate(tmp_path: Path, model_dir: Path) -> None:
    from kvcli.tokenizer import Tokenizer

    rows = [
        {"prompt": "Once upon a time there was a little girl named Lily."},
        {"prompt": "Once upon a time there was a little boy named Tim."},
        chat([system("You tell short stories."), user("Tell me about a cat.")], TOOLS),
        chat([system("You tell short stories."), user("Tell me about a dog.")], TOOLS),
    ]
    path = write_jsonl(tmp_path / "r.jsonl", rows)
    result = run([str(path), "--model", str(model_dir), "--block-size", "4", "--format", "json", "--show-blocks"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    tok = Tokenizer.from_dir(model_dir)
    expected = [tok.encode(r["prompt"], add_special_tokens=True) for r in rows[:2]]
    expected += [
        tok.encode(tok.apply_chat_template(r["messages"], tools=r["tools"], add_generation_prompt=True), add_special_tokens=False)
        for r in rows[2:]
    ]
    assert expected[0][0] == tok.bos_token_id and expected[2][0] != tok.bos_token_id
    for prompt, ids in zip(doc["prompts"], expected, strict=True):
        assert prompt["tokens"] == len(ids)
        assert [b["hash"] for b in prompt["blocks"]] == [h.hex()[:8] for h in hash_token_blocks(ids, 4)]
    assert [p["cached_tokens"] for p in doc["prompts"]] == predict_cached_tokens(expected, 4)
    assert doc["prompts"][3]["first_divergence"]["against"] == 2
    char = doc["prompts"][1]["first_divergence"]["char"]  # where "boy" parts from "girl"
    shared = "Once upon a time there was a little "
    assert len(shared) - 1 <= char <= len(shared)


def test_a_model_without_chat_template_rejects_chat_cleanly(tmp_path: Path) -> None:
    if not (STORIES / "tokenizer.json").is_file():
        pytest.skip("shared/models/stories260K is not available")
    path = write_jsonl(tmp_path / "r.jsonl", [{"prompt": "Once upon a time"}, chat([user("hi")])])
    result = run([str(path), "--model", str(STORIES), "--format", "json"])
    assert result.exit_code == 0
    (problem,) = json.loads(result.stdout)["input_problems"]
    assert problem["where"].endswith(":2") and "no chat template" in problem["message"]


def test_a_missing_model_is_a_usage_error(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "r.jsonl", [{"prompt": "x"}])
    result = run([str(path), "--model", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "--model" in result.stderr


def test_a_gguf_model_is_converted_as_generate_converts_it(tiny_models, kvcli_home, tmp_path):
    """`kvcli audit --model FILE.gguf` reads the tokenizer as generate runs the model: from the
    GGUF itself under the default --quantization auto (no conversion), from the float32
    conversion under --quantization none (converted on first use: the command passes the torch
    step in; kvcli.audit never imports it). Both tokenize alike."""
    from click.testing import CliRunner

    from kvcli.cli import main
    from kvcli.model.gguf_convert import resolve_model
    from kvcli.tokenizer import Tokenizer

    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "hello there, hello again"}])
    gguf = str(tiny_models.gguf("llama"))
    args = ["audit", str(prompts), "--model", gguf, "--format", "json"]
    auto = CliRunner().invoke(main, args)
    assert auto.exit_code in (0, 1), auto.output
    assert not (kvcli_home / "models").exists() and (kvcli_home / "gguf").is_dir()
    result = CliRunner().invoke(main, [*args, "--quantization", "none"])
    assert result.exit_code in (0, 1), result.output
    [converted] = (kvcli_home / "models").iterdir()
    assert resolve_model(gguf) == converted  # the same conversion generate would run from
    tokens = json.loads(result.stdout)["summary"]["tokens"]
    assert json.loads(auto.stdout)["summary"]["tokens"] == tokens
    assert tokens == len(Tokenizer.from_dir(converted).encode("hello there, hello again"))
