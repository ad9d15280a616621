"""Memory stays flat as the input grows: 10,000 vs 100,000 lines, peak RSS of a real process.

`kvcli generate` runs as a subprocess with the deterministic fake engine (no
torch, so the numbers are the batch layer's own), reads the input file lazily
and writes results as they finish. Half the lines carry an explicit id (kept as
a 12-byte-slot fingerprint for duplicate detection), half get ``line-<N>``.
A job that held its requests or results would add >200 bytes a line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent

# VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss across exec, so a child of the
# (large) pytest process would report pytest's size and hide the growth being measured.
LAUNCHER = """\
import re, resource, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from batch_fakes import FakeEngine
import kvcli.batch.run

class FlatFakeEngine(FakeEngine):  # the fake's own bookkeeping must not grow either
    def add_request(self, *args, **kwargs):
        super().add_request(*args, **kwargs)
        self.added.clear()

    def _cache(self, ids, salt):
        return 0

kvcli.batch.run.load_engine = lambda cfg: FlatFakeEngine()
from kvcli.cli import main
try:
    main(prog_name="kvcli", standalone_mode=False)
finally:
    status = Path("/proc/self/status")
    hwm = re.search(r"VmHWM:\\s+(\\d+) kB", status.read_text()) if status.exists() else None
    peak = int(hwm[1]) if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print("peak_rss_kib", peak, file=sys.stderr)
"""


def write_input(path: Path, n: int) -> Path:
    with path.open("w") as f:
        for i in range(n):
            line = {"prompt": f"q{i % 97}"}
            if i % 2:
                line["custom_id"] = f"request-{i}"
            f.write(json.dumps(line) + "\n")
    return path


@pytest.mark.slow
def test_peak_rss_does_not_grow_with_the_number_of_lines(tmp_path) -> None:
    launcher = tmp_path / "launch.py"
    launcher.write_text(LAUNCHER.format(tests=str(TESTS_DIR)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = {}
    for n in (10_000, 100_000):
        inp = write_input(tmp_path / f"in{n}.jsonl", n)
        args = [sys.executable, str(launcher), "generate", str(inp), "-o", str(tmp_path / f"{n}.out"),
                "--max-tokens", "1", "--ordered", "-q"]
        procs[n] = subprocess.Popen(args, env=env, stderr=subprocess.PIPE, text=True)
    peak = {}
    for n, proc in procs.items():
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert (tmp_path / f"{n}.out").read_bytes().count(b"\n") == n
        peak[n] = int(err.split("peak_rss_kib")[1]) * 1024
    growth = peak[100_000] - peak[10_000]
    print(f"peak RSS: 10k lines {peak[10_000] / 2**20:.1f} MiB, 100k lines "
          f"{peak[100_000] / 2**20:.1f} MiB, {growth / 90_000:.1f} bytes per extra line")
    assert growth < 40 * 90_000, peak  # ~20 today (45,000 fingerprints); holding results: >200


def test_an_in_process_run_frees_its_engine_without_a_cyclic_collection(tiny_models, tmp_path):
    """The job and its writer referred to each other, so an in-process caller (LLM users,
    kvcli serve, this suite) kept every finished run's engine (weights + KV pool) until the
    next cyclic collection: the suite's in-process runs reached 6.7 GB in one module."""
    import gc
    import weakref

    from click.testing import CliRunner

    import kvcli.batch.run
    from kvcli.cli import main

    batch = tmp_path / "b.jsonl"
    batch.write_text('{"prompt": "Hello"}\n{"prompt": "Bye"}\n')
    engines: list[weakref.ref] = []
    load = kvcli.batch.run.load_engine

    def tracked(cfg):
        engine = load(cfg)
        engines.append(weakref.ref(engine))
        return engine

    gc.collect()
    gc.disable()
    try:
        kvcli.batch.run.load_engine = tracked
        res = CliRunner().invoke(main, ["generate", str(batch), "--model",
                                        str(tiny_models["llama"]), "--max-tokens", "2", "-q"])
        assert res.exit_code == 0, res.stderr
        del res
        assert len(engines) == 1 and engines[0]() is None
    finally:
        kvcli.batch.run.load_engine = load
        gc.enable()


def test_a_run_with_a_disk_cache_ends_its_writer_thread(tiny_models, tmp_path):
    """The disk cache's writer thread (which holds the KV pool) ran until interpreter exit, so
    each in-process run with --kv-cache-dir kept ~0.5 GB and a thread alive."""
    import threading

    from click.testing import CliRunner

    from kvcli.cli import main

    batch = tmp_path / "b.jsonl"
    batch.write_text('{"prompt": "Hello there, a prompt long enough to fill blocks"}\n')
    res = CliRunner().invoke(main, ["generate", str(batch), "--model", str(tiny_models["llama"]),
                                    "--max-tokens", "2", "-q", "--kv-cache-dir",
                                    str(tmp_path / "kv")])
    assert res.exit_code == 0, res.stderr
    assert not [t for t in threading.enumerate() if t.name == "kvcli-kv-writer"]
    assert list((tmp_path / "kv" / "models").glob("*/runs.jsonl"))  # the run was recorded
