"""`kvcli audit --model M --kv-cache-dir DIR` predicts the hits of a `generate` run on DIR,
counting blocks an earlier run left on disk, and never writes to DIR (issue 19)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from click.testing import CliRunner

from kvcli.cli import main

SYSTEM = ("You are a helpful assistant for the quick brown fox library. Answer briefly. "
          "The capital of France is Paris and the capital of Italy is Rome. ") * 3


def _batch(path: Path, questions: list[str]) -> Path:
    rows = [{"id": f"q{i}", "messages": [{"role": "system", "content": SYSTEM},
                                         {"role": "user", "content": q}]}
            for i, q in enumerate(questions)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _listing(root: Path) -> list[tuple[str, int, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns)
                  for p in root.rglob("*"))


def test_audit_counts_blocks_on_disk_as_generate_does(tiny_models, kvcli_home, tmp_path):
    model, kv = str(tiny_models["llama"]), tmp_path / "kv"
    runner = CliRunner()
    first = _batch(tmp_path / "day1.jsonl", ["Where does the fox live?"])
    gen1 = runner.invoke(main, ["generate", str(first), "--model", model, "--max-tokens", "2",
                                "--kv-cache-dir", str(kv), "--quiet"])
    assert gen1.exit_code == 0, gen1.output
    second = _batch(tmp_path / "day2.jsonl", ["What is 12 plus 345?", "Name the capital of Germany."])
    before = _listing(kv)
    audit = runner.invoke(main, ["audit", str(second), "--model", model, "--kv-cache-dir", str(kv),
                                 "--format", "json", "--fail-on", "never"])
    assert audit.exit_code == 0, audit.output
    assert _listing(kv) == before  # the audit only looks
    predicted = [p["cached_tokens"] for p in json.loads(audit.stdout)["prompts"]]
    plain = runner.invoke(main, ["audit", str(second), "--model", model, "--format", "json",
                                 "--fail-on", "never"])
    without_disk = [p["cached_tokens"] for p in json.loads(plain.stdout)["prompts"]]
    gen2 = runner.invoke(main, ["generate", str(second), "--model", model, "--max-tokens", "2",
                                "--kv-cache-dir", str(kv), "--quiet", "--ordered"])
    assert gen2.exit_code == 0, gen2.output
    actual = [json.loads(line)["usage"]["cached_tokens"] for line in gen2.stdout.splitlines()]
    assert actual == predicted
    assert predicted[0] > 0 == without_disk[0]  # the first prompt hits only what day 1 left


def test_kv_cache_dir_needs_model_and_a_kvcli_cache(tiny_models, tmp_path):
    batch = _batch(tmp_path / "b.jsonl", ["hi"])
    res = CliRunner().invoke(main, ["audit", str(batch), "--kv-cache-dir", str(tmp_path)])
    assert res.exit_code == 2 and "--kv-cache-dir: give --model too" in res.stderr
    other = tmp_path / "not-a-cache"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    res = CliRunner().invoke(main, ["audit", str(batch), "--model", str(tiny_models["llama"]),
                                    "--kv-cache-dir", str(other)])
    assert res.exit_code == 2 and "not a kvcli KV cache" in res.stderr
    assert os.listdir(other) == ["notes.txt"]


def test_the_disk_prediction_never_imports_torch(tiny_models, kvcli_home, tmp_path):
    from test_audit_tokenizers import _imported_modules

    from kvcli.kvstore.directory import open_cache_dir

    kv = open_cache_dir(tmp_path / "kv")  # an empty kvcli cache
    batch = _batch(tmp_path / "b.jsonl", ["Where does the fox live?"])
    args = [str(batch), "--model", str(tiny_models["llama"]), "--kv-cache-dir", str(kv),
            "--format", "json", "--fail-on", "never"]
    code = ("import sys; from kvcli.cli import main\n"
            f"sys.argv = ['kvcli', 'audit', *{args!r}]\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n")
    modules = _imported_modules(code)
    assert {"kvcli.audit.disk", "kvcli.kvstore.fingerprint"} <= modules
    assert not {m for m in modules if m.split(".")[0] in ("torch", "transformers")}
