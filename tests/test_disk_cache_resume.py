"""kill -9 in the middle of a run, then --resume with the same DIR: the prefixes the killed
run computed are loaded from disk, and the joined output equals an uninterrupted run's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from kvcli.kvstore.directory import iter_block_files

SYSTEM = "Caching the keys and values of a shared prompt prefix saves a great deal of work. "


def test_resume_after_kill_loads_what_the_killed_run_computed(tiny_models, kvcli_home, tmp_path):
    lines = [{"id": f"r{i}", "prompt": SYSTEM + f"The fox number {i} went", "max_tokens": 30}
             for i in range(60)]
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(x) + "\n" for x in lines))
    kv, out = tmp_path / "kv", tmp_path / "out.jsonl"
    cmd = [sys.executable, "-m", "kvcli", "generate", str(inp), "--model",
           str(tiny_models["llama"]), "--block-size", "4", "--ignore-eos", "-q", "--ordered",
           "--max-num-seqs", "1", "--kv-cache-dir", str(kv), "-o", str(out)]
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (out.exists() and out.read_text().count("\n") >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended too soon"
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    done = out.read_text().count("\n")
    assert 2 <= done < 60 and len(list(iter_block_files(kv))) > 0
    stats = tmp_path / "stats.json"
    subprocess.run([*cmd, "--resume", "--stats", str(stats)], check=True)
    summary = json.loads(stats.read_text())
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    resumed = [r for r in rows if r["id"] not in {f"r{i}" for i in range(done)}]
    # The shared system prompt was computed before the kill: the resumed run's first request
    # (which a fresh process would compute whole) loads all of its hits from disk.
    first = resumed[0]["usage"]
    assert first["kvcli_disk_cached_tokens"] == first["cached_tokens"] > 0
    assert summary["disk_cache"]["hit_tokens"] > 0 and summary["skipped"] == done
    clean = tmp_path / "clean.jsonl"
    subprocess.run([*cmd[:-4], "-o", str(clean)], check=True)
    assert sorted((r["id"], r["text"]) for r in rows) == \
        sorted((r["id"], r["text"]) for r in map(json.loads, clean.read_text().splitlines()))
