"""A tampered `--kv-cache-dir` with real `kvcli generate` processes (issue 28, items 4-8).

Weights rewritten in place with their size and mtime put back, links where the cache keeps
directories, FIFOs and huge sparse files at block paths, and a directory other users may
write: no run serves another model's K/V, writes or deletes outside DIR, hangs or runs out
of memory, and every completed run's outputs equal a run without the cache.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kvcli.kvstore.directory import iter_block_files

pytestmark = pytest.mark.slow

SYSTEM = "Caching the keys and values of a shared prompt prefix saves a great deal of work. "
ARGS = ("--block-size", "4", "--ordered", "--ignore-eos", "--max-tokens", "6", "-q",
        "--overwrite")
TIMEOUT_S = 240  # a run takes a few seconds; a hang is what this bounds


@pytest.fixture(scope="module")
def setup(tiny_models, tmp_path_factory) -> dict:
    """The batch, a private copy of the tiny llama, a filled cache and the cacheless outputs."""
    root = tmp_path_factory.mktemp("tamper")
    batch = root / "in.jsonl"
    batch.write_text("".join(json.dumps({"id": f"q{i}", "prompt": SYSTEM + f"Fox {i} went"}) + "\n"
                             for i in range(4)))
    model = root / "model"
    shutil.copytree(tiny_models["llama"], model)
    env = {**os.environ, "KVCLI_HOME": str(root / "home"), "KVCLI_THREADS": "1"}
    s = {"root": root, "batch": batch, "model": model, "env": env}
    base = run(s, root / "base.jsonl")
    assert base.returncode == 0, base.stderr
    filled = run(s, root / "filled.jsonl", "--kv-cache-dir", str(root / "kv"))
    assert filled.returncode == 0, filled.stderr
    assert outputs(root / "filled.jsonl") == outputs(root / "base.jsonl")
    return {**s, "kv": root / "kv", "base": outputs(root / "base.jsonl")}


def run(s: dict, out: Path, *args: str, model: Path | None = None) -> subprocess.CompletedProcess:
    """`kvcli generate` in its own process; SIGTERM (then SIGKILL) if it outlives TIMEOUT_S."""
    cmd = [sys.executable, "-m", "kvcli", "generate", str(s["batch"]), "-o", str(out),
           "--model", str(model or s["model"]), "--stats", str(out.with_suffix(".stats")),
           *ARGS, *args]
    proc = subprocess.Popen(cmd, env=s["env"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        pytest.fail(f"kvcli generate still running after {TIMEOUT_S} s: {cmd} "
                    f"(exit {proc.returncode} after SIGTERM)")
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def outputs(out: Path) -> list[str]:
    return [json.loads(line)["text"] for line in out.read_text().splitlines()]


def disk_stats(out: Path) -> dict:
    return json.loads(out.with_suffix(".stats").read_text())["disk_cache"]


def copy_cache(setup: dict, tmp_path: Path) -> Path:
    kv = tmp_path / "kv"
    shutil.copytree(setup["kv"], kv, symlinks=True)
    return kv


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


def test_weights_rewritten_in_place_with_the_old_size_and_mtime_never_hit_old_blocks(
        setup, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(setup["model"], model)
    kv = copy_cache(setup, tmp_path)  # filled by these very weights (same bytes, other path)
    first = run(setup, tmp_path / "first.jsonl", "--kv-cache-dir", str(kv), model=model)
    assert first.returncode == 0, first.stderr
    assert disk_stats(tmp_path / "first.jsonl")["hit_tokens"] > 0  # the digest is remembered
    weights = model / "model.safetensors"
    st = weights.stat()
    with open(weights, "r+b") as f:  # halve every float32 weight, same file, same size
        start = 8 + int.from_bytes(f.read(8), "little")
        f.seek(start)
        data = np.frombuffer(f.read(), "<f4") * np.float32(0.5)
        f.seek(start)
        f.write(data.tobytes())
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (weights.stat().st_size, weights.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    cold = run(setup, tmp_path / "cold.jsonl", model=model)
    assert cold.returncode == 0, cold.stderr
    assert outputs(tmp_path / "cold.jsonl") != setup["base"]  # the rewrite changed the model
    warm = run(setup, tmp_path / "warm.jsonl", "--kv-cache-dir", str(kv), model=model)
    assert warm.returncode == 0, warm.stderr
    assert outputs(tmp_path / "warm.jsonl") == outputs(tmp_path / "cold.jsonl")
    assert disk_stats(tmp_path / "warm.jsonl")["hit_tokens"] == 0


def _link_in_place(path: Path, outside: Path) -> None:
    """Move the directory ``path`` to ``outside`` and leave a link to it in its place."""
    shutil.move(path, outside)
    path.symlink_to(outside, target_is_directory=True)


@pytest.mark.parametrize("where", ["tmp", "model", "shard"])
def test_a_link_inside_the_cache_is_refused_and_nothing_outside_is_touched(setup, tmp_path,
                                                                            where):
    kv = copy_cache(setup, tmp_path)
    outside = tmp_path / "outside"
    [model_dir] = (kv / "models").iterdir()
    if where == "tmp":
        outside.mkdir()
        (outside / "old-notes.txt").write_text("mine")
        os.utime(outside / "old-notes.txt", (1, 1))  # older than any temp file kvcli keeps
        shutil.rmtree(kv / "tmp")
        (kv / "tmp").symlink_to(outside, target_is_directory=True)
        link = kv / "tmp"
    else:
        link = model_dir if where == "model" else sorted(p for p in model_dir.iterdir()
                                                         if p.is_dir())[0]
        _link_in_place(link, outside)
        for f in sorted(outside.rglob("*"))[::2]:  # blocks the run would write again
            if f.is_file() and f.name != "model.json":
                f.unlink()
    before = tree(outside)
    res = run(setup, tmp_path / "out.jsonl", "--kv-cache-dir", str(kv))
    assert res.returncode == 2, res.stderr
    assert f"{link}: a symbolic link inside the KV cache" in res.stderr
    prune = subprocess.run([sys.executable, "-m", "kvcli", "cache", "prune", str(kv),
                            "--max-bytes", "1"], env=setup["env"], capture_output=True,
                           text=True, timeout=TIMEOUT_S)
    assert prune.returncode == 1 and "symbolic link" in prune.stderr
    assert tree(outside) == before


@pytest.mark.parametrize("what", ["fifo", "sparse"])
def test_fifos_and_huge_sparse_files_at_block_paths_are_damaged_blocks(setup, tmp_path, what):
    """A FIFO used to block open() forever (SIGTERM ignored); a 64 GiB sparse file was read
    whole (MemoryError). Both are now refused before a byte is read, and recomputed."""
    kv = copy_cache(setup, tmp_path)
    for f in iter_block_files(kv):
        f.path.unlink()
        if what == "fifo":
            os.mkfifo(f.path, 0o600)
        else:
            with open(f.path, "wb") as sparse:
                sparse.truncate(64 << 30)
    res = run(setup, tmp_path / "out.jsonl", "--kv-cache-dir", str(kv))
    assert res.returncode == 0, res.stderr
    assert outputs(tmp_path / "out.jsonl") == setup["base"]
    assert "ignoring a damaged KV cache block" in res.stderr
    stats = disk_stats(tmp_path / "out.jsonl")
    assert stats["corrupt_blocks"] > 0 and stats["hit_tokens"] == 0


def test_a_fifo_as_the_marker_is_refused_at_once(setup, tmp_path):
    kv = copy_cache(setup, tmp_path)
    marker = kv / "kvcli-kv-cache.json"
    marker.unlink()
    os.mkfifo(marker, 0o600)
    res = run(setup, tmp_path / "out.jsonl", "--kv-cache-dir", str(kv))
    assert res.returncode == 2 and "not a regular file (a FIFO)" in res.stderr


@pytest.mark.parametrize("where", ["root", "model"])
def test_a_cache_every_user_may_write_is_refused_unless_insecure(setup, tmp_path, where):
    kv = copy_cache(setup, tmp_path)
    [model_dir] = (kv / "models").iterdir()
    writable = kv if where == "root" else model_dir
    writable.chmod(0o777)
    res = run(setup, tmp_path / "out.jsonl", "--kv-cache-dir", str(kv))
    assert res.returncode == 2
    assert f"{writable} is writable by every user (mode 0777)" in res.stderr
    assert "--kv-cache-dir-insecure" in res.stderr
    ok = run(setup, tmp_path / "out.jsonl", "--kv-cache-dir", str(kv), "--kv-cache-dir-insecure")
    assert ok.returncode == 0, ok.stderr
    assert outputs(tmp_path / "out.jsonl") == setup["base"]
    assert disk_stats(tmp_path / "out.jsonl")["hit_tokens"] > 0


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_a_cache_owned_by_another_user_is_refused(setup, tmp_path):
    kv = copy_cache(setup, tmp_path)
    os.chown(kv, 65534, 65534)
    res = run(setup, tmp_path / "out.jsonl", "--kv-cache-dir", str(kv))
    assert res.returncode == 2
    assert f"{kv} is owned by another user (uid 65534" in res.stderr
