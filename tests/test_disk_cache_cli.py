"""`kvcli generate --kv-cache-dir`: reuse across runs and processes, and every fault a disk
can have (damaged, truncated, read-only, full, shared) leaves the results unchanged."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvcli.cli import main
from kvcli.kvstore.directory import iter_block_files
from kvcli.kvstore.format import HEADER_SIZE

SYSTEM = "Caching the keys and values of a shared prompt prefix saves a great deal of work. "


@pytest.fixture(scope="module")
def batch(tmp_path_factory) -> Path:
    lines = [{"id": f"q{i}", "prompt": SYSTEM + f"The fox number {i} went", "max_tokens": 6,
              **({"temperature": 0.8, "n": 2} if i % 2 else {})} for i in range(6)]
    path = tmp_path_factory.mktemp("batch") / "in.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def generate(batch: Path, model: Path, out: Path, *args: str, code: int = 0) -> dict:
    stats = out.with_suffix(".stats.json")
    res = CliRunner().invoke(main, ["generate", str(batch), "-o", str(out), "--model", str(model),
                                    "--block-size", "4", "--ordered", "--ignore-eos", "-q",
                                    "--overwrite", "--stats", str(stats), *args],
                             catch_exceptions=False)
    assert res.exit_code == code, res.output + res.stderr
    return json.loads(stats.read_text()) if code == 0 else {"stderr": res.stderr}


def completions(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "usage"} for r in rows]


def usages(out: Path) -> list[dict]:
    return [json.loads(line)["usage"] for line in out.read_text().splitlines()]


@pytest.fixture
def base(batch, tiny_models, tmp_path) -> list[dict]:
    out = tmp_path / "base.jsonl"
    generate(batch, tiny_models["llama"], out)
    assert all("kvcli_disk_cached_tokens" not in u for u in usages(out))
    return completions(out)


def test_the_second_run_loads_the_first_runs_prefixes(batch, tiny_models, kvcli_home, tmp_path,
                                                      base, monkeypatch):
    kv = tmp_path / "kv"
    out = tmp_path / "out.jsonl"
    cold = generate(batch, tiny_models["llama"], out, "--kv-cache-dir", str(kv))
    assert completions(out) == base
    assert cold["disk_cache"]["written_blocks"] > 0 and cold["disk_cache"]["hit_tokens"] == 0
    monkeypatch.setenv("KVCLI_KV_CACHE_DIR", str(kv))  # the environment names the same DIR
    warm = generate(batch, tiny_models["llama"], out)
    assert completions(out) == base
    first = usages(out)[0]
    assert first["kvcli_disk_cached_tokens"] == first["cached_tokens"] > 0
    assert warm["disk_cache"]["hit_tokens"] >= first["cached_tokens"]
    assert warm["prefill_tokens_computed"] < cold["prefill_tokens_computed"]
    assert warm["disk_cache"]["bytes_read"] > 0


def test_a_directory_that_is_not_a_cache_is_refused_before_loading(batch, tiny_models, tmp_path):
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"\xff\xd8")
    res = generate(batch, tiny_models["llama"], tmp_path / "o.jsonl", "--kv-cache-dir",
                   str(tmp_path / "photos"), code=2)
    assert "not a kvcli KV cache" in res["stderr"]
    assert os.listdir(tmp_path / "photos") == ["cat.jpg"]


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_damaged_blocks_are_recomputed_with_one_warning(batch, tiny_models, kvcli_home, tmp_path,
                                                        base, caplog, damage):
    kv = tmp_path / "kv"
    out = tmp_path / "out.jsonl"
    generate(batch, tiny_models["llama"], out, "--kv-cache-dir", str(kv))
    for f in iter_block_files(kv):
        data = bytearray(f.path.read_bytes())
        if damage == "flip":
            data[HEADER_SIZE + 3] ^= 0x40
        else:
            data = data[: len(data) // 2]
        f.path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="kvcli.kvstore"):
        stats = generate(batch, tiny_models["llama"], out, "--kv-cache-dir", str(kv))
    assert completions(out) == base
    assert stats["disk_cache"]["corrupt_blocks"] > 0 and stats["disk_cache"]["hit_tokens"] == 0
    assert len([r for r in caplog.records if "damaged" in r.message]) == 1


def _mount(args: list[str]) -> bool:
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


def _read_only(kv: Path) -> None:
    """A really read-only DIR: a read-only bind mount when we may mount (root ignores modes)."""
    if os.geteuid() != 0:
        for d in [kv, *kv.rglob("*")]:
            if d.is_dir():
                d.chmod(0o500)
        return
    if not (_mount(["--bind", str(kv), str(kv)])
            and _mount(["-o", "remount,ro,bind", str(kv)])):
        pytest.skip("running as root without permission to mount a read-only file system")


def test_a_read_only_directory_still_serves_hits_and_stops_writing(batch, tiny_models, kvcli_home,
                                                                 tmp_path, base, caplog):
    kv = tmp_path / "kv"
    out = tmp_path / "out.jsonl"
    generate(batch, tiny_models["llama"], out, "--kv-cache-dir", str(kv))
    for f in iter_block_files(kv):  # keep only the shared prefix: the run must write the rest
        if f.last_use != min(x.last_use for x in iter_block_files(kv)):
            f.path.unlink()
    _read_only(kv)
    try:
        with caplog.at_level(logging.WARNING, logger="kvcli.kvstore"):
            stats = generate(batch, tiny_models["llama"], out, "--kv-cache-dir", str(kv))
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(kv)], check=False)
    assert completions(out) == base
    disk = stats["disk_cache"]
    assert disk["hit_tokens"] > 0 and disk["written_blocks"] == 0 and disk["write_error"]
    assert len([r for r in caplog.records if "cannot write" in r.message]) == 1


def test_a_full_disk_stops_writing_and_the_run_completes(batch, tiny_models, kvcli_home, tmp_path,
                                                         base, caplog):
    kv = tmp_path / "kv"
    kv.mkdir()
    # mode=0700: a tmpfs is 1777 by default, a DIR every user may write (refused).
    if not _mount(["-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(kv)]):
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        with caplog.at_level(logging.WARNING, logger="kvcli.kvstore"):
            stats = generate(batch, tiny_models["llama"], tmp_path / "out.jsonl",
                             "--kv-cache-dir", str(kv))
    finally:
        subprocess.run(["umount", str(kv)], check=False)
    assert completions(tmp_path / "out.jsonl") == base
    assert "No space left" in stats["disk_cache"]["write_error"]
    assert stats["disk_cache"]["written_blocks"] > 0  # until the disk was full
    assert len([r for r in caplog.records if "cannot write" in r.message]) == 1


def test_two_processes_share_one_directory(batch, tiny_models, kvcli_home, tmp_path, base):
    kv = tmp_path / "kv"
    cmd = [sys.executable, "-m", "kvcli", "generate", str(batch), "--model",
           str(tiny_models["llama"]), "--block-size", "4", "--ordered", "--ignore-eos", "-q",
           "--kv-cache-dir", str(kv), "-o"]
    procs = [subprocess.Popen([*cmd, str(tmp_path / f"p{i}.jsonl")], stderr=subprocess.PIPE,
                              env={**os.environ, "KVCLI_THREADS": "1"}) for i in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()
        assert b"damaged" not in err and b"cannot write" not in err
    for i in range(2):
        assert completions(tmp_path / f"p{i}.jsonl") == base
    assert not os.listdir(kv / "tmp")  # every write was published or cleaned up
    stats = generate(batch, tiny_models["llama"], tmp_path / "third.jsonl", "--kv-cache-dir",
                     str(kv))
    assert completions(tmp_path / "third.jsonl") == base
    assert stats["disk_cache"]["corrupt_blocks"] == 0 and stats["disk_cache"]["hit_tokens"] > 0


def test_the_bound_holds_across_runs(batch, tiny_models, kvcli_home, tmp_path, base):
    kv = tmp_path / "kv"
    out = tmp_path / "out.jsonl"
    generate(batch, tiny_models["llama"], out, "--kv-cache-dir", str(kv))
    total = sum(f.size for f in iter_block_files(kv))
    bound = total // 3
    stats = generate(batch, tiny_models["llama"], out, "--kv-cache-dir", str(kv),
                     "--kv-cache-dir-max-bytes", str(bound), "--block-size", "8")
    assert completions(out)  # another block size: another fingerprint, every block is new
    assert sum(f.size for f in iter_block_files(kv)) <= bound
    assert stats["disk_cache"]["evicted_blocks"] > 0


def test_the_summary_shows_disk_hits_and_bytes():
    from kvcli.batch.summary import RunCounters, build_summary, format_summary

    disk = {"hit_tokens": 208, "hit_blocks": 13, "bytes_read": 9_600_000, "load_gb_s": 1.5,
            "corrupt_blocks": 1, "written_blocks": 40, "bytes_written": 29_500_000,
            "write_error": "No space left on device"}
    text = format_summary(build_summary(RunCounters(), {"disk_cache": disk}, "completed", 0),
                          "out.jsonl")
    assert ("disk cache    208 cached tokens from disk (13 blocks, 9.6 MB read at 1.50 GB/s, "
            "1 damaged ignored), 40 blocks written (29.5 MB); writing stopped: No space left "
            "on device") in text
