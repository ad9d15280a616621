"""The torch-free store against a tampered cache directory (issue 28, items 4-9): weights'
version keys, links, FIFOs, huge files, bad inventory records, dead writers' temp files."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvcli.cli import main
from kvcli.kvstore import NotAKVCacheError, WriteBehind, open_model_store
from kvcli.kvstore.directory import open_cache_dir
from kvcli.kvstore.fingerprint import SAMPLE_PAGE, ModelFingerprint, version_key
from kvcli.kvstore.format import HEADER_SIZE
from kvcli.kvstore.store import RUNS_LOG

FP = ModelFingerprint("ab" * 32, "LlamaForCausalLM", "float32", "cpu", 16, 2, 4, 16,
                      {"rope_type": "default", "theta": 10000.0})
PAYLOAD = 1024


def filled(tmp_path: Path, n: int = 3) -> tuple[Path, list[bytes]]:
    """A cache with ``n`` blocks of one model and one run record."""
    store = open_model_store(tmp_path / "kv", FP)
    hashes = [bytes([i]) * 32 for i in range(n)]
    for h in hashes:
        store.write(h, memoryview(bytes([7]) * PAYLOAD))
    store.stats.hit_blocks = 2
    store.record_run()
    return tmp_path / "kv", hashes


class Blocked(Exception):  # not an OSError, so no `except OSError` swallows it
    pass


@contextlib.contextmanager
def within(seconds: int):
    """Fail instead of hanging: SIGALRM interrupts a blocked open() (Python retries it only
    after running the handler, which raises)."""
    def expire(*_):
        raise Blocked(f"still blocked after {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def cache_cli(*args: str, code: int = 0):
    res = CliRunner().invoke(main, ["cache", *args], catch_exceptions=False)
    assert res.exit_code == code, res.output + res.stderr
    return res


def test_the_weights_version_key_sees_rewrites_a_stat_cannot(tmp_path):
    """Same stat (as on a file system whose ctime does not move): the sampled pages still
    change the key for a rewrite of the head, the tail or a page in between."""
    path = tmp_path / "w.safetensors"
    data = bytearray(os.urandom(40 * SAMPLE_PAGE))
    path.write_bytes(data)
    st = path.stat()

    def key() -> str:
        with open(path, "rb") as f:
            return version_key(path, st, f)

    first = key()
    assert key() == first
    for offset in (0, len(data) - 1, len(data) // 9 * 4):
        data[offset] ^= 1
        path.write_bytes(data)
        assert key() != first
        data[offset] ^= 1
    path.write_bytes(data)
    assert key() == first


def test_a_block_file_of_the_wrong_size_is_never_read(tmp_path):
    kv, hashes = filled(tmp_path)
    store = open_model_store(kv, FP)
    assert store.read(hashes[0], PAYLOAD) is not None
    for h in hashes:
        with open(store.path(h), "r+b") as f:
            f.truncate(64 << 30)  # sparse: no disk space, 64 GiB to a reader
    store._read_into = lambda *a: pytest.fail("a block of the wrong size was read")
    assert store.read(hashes[0], PAYLOAD) is None  # the size the model's blocks have
    assert store.read(hashes[1]) is None  # no size given: still bounded
    assert store.stats.corrupt_blocks == 2 and not store.path(hashes[0]).exists()


@pytest.mark.parametrize("kind", ["fifo", "link", "dir"])
def test_a_fifo_link_or_directory_at_a_block_path_is_a_damaged_block(tmp_path, kind):
    kv, hashes = filled(tmp_path)
    store = open_model_store(kv, FP)
    path = store.path(hashes[0])
    target = tmp_path / "target"
    target.write_bytes(path.read_bytes())  # a valid block, outside the cache
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link":
        path.symlink_to(target)
    else:
        path.mkdir()
    with within(20):  # returns at once: never blocks on a FIFO
        assert store.read(hashes[0], PAYLOAD) is None
    assert store.stats.corrupt_blocks == 1
    assert target.read_bytes()[HEADER_SIZE:] == bytes([7]) * PAYLOAD
    assert kind == "dir" or not os.path.lexists(path)  # removed: rewritten next time


@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_the_run_log_is_never_written_through_a_link_or_blocks_on_a_fifo(tmp_path, kind):
    kv, _ = filled(tmp_path)
    store = open_model_store(kv, FP)
    log = store.dir / RUNS_LOG
    log.unlink()
    target = tmp_path / "victim.txt"
    target.write_text("mine")
    if kind == "fifo":
        os.mkfifo(log)
    else:
        log.symlink_to(target)
    store.stats.written_blocks = 1
    with within(20):
        store.record_run()  # returns: the counts are only informative
    assert target.read_text() == "mine"


@pytest.mark.parametrize("where", ["tmp", "models", "model", "shard"])
def test_a_cache_holding_a_link_where_a_directory_belongs_is_refused(tmp_path, where):
    kv, hashes = filled(tmp_path)
    store = open_model_store(kv, FP)
    path = {"tmp": kv / "tmp", "models": kv / "models", "model": store.dir,
            "shard": store.path(hashes[0]).parent}[where]
    os.rename(path, tmp_path / "elsewhere")
    path.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(NotAKVCacheError, match="a symbolic link inside the KV cache"):
        open_model_store(kv, FP)
    res = cache_cli("clear", str(kv), code=1)
    assert f"{path}: a symbolic link" in res.output
    assert any((tmp_path / "elsewhere").rglob("*")) or where == "tmp"  # nothing deleted


def test_a_world_writable_cache_is_refused_unless_insecure(tmp_path):
    kv, hashes = filled(tmp_path)
    kv.chmod(0o777)
    with pytest.raises(NotAKVCacheError, match="writable by every user.*--kv-cache-dir-insecure"):
        open_model_store(kv, FP)
    assert open_model_store(kv, FP, insecure=True).read(hashes[0], PAYLOAD) is not None


def test_a_fifo_as_the_marker_is_refused_at_once(tmp_path):
    kv, _ = filled(tmp_path)
    (kv / "kvcli-kv-cache.json").unlink()
    os.mkfifo(kv / "kvcli-kv-cache.json")
    res = subprocess.run([sys.executable, "-m", "kvcli", "cache", "stats", str(kv)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and "not a regular file (a FIFO)" in res.stderr


def test_stats_and_ls_skip_bad_records_with_a_message_naming_them(tmp_path):
    kv, _ = filled(tmp_path)
    [model_dir] = (kv / "models").iterdir()
    with open(model_dir / RUNS_LOG, "a") as f:
        f.write('[1, 2]\n{"hit_blocks": "many"}\n{"hit_blocks": 3, "written_blocks": 1}\n'
                '{"hit_blo')  # a line torn by a crash
    (model_dir / "model.json").write_text("[1, 2]")
    stats = cache_cli("stats", str(kv), "--json")
    assert json.loads(stats.stdout) == {"dir": str(kv), "models": 1, "blocks": 3,
                                        "bytes": 3 * (HEADER_SIZE + PAYLOAD), "runs": 2,
                                        "hit_blocks": 5, "written_blocks": 4}
    assert f"{model_dir / RUNS_LOG}: line 2 and 2 more skipped (not a run record)" in stats.stderr
    assert f"{model_dir / 'model.json'}: unreadable" in stats.stderr
    listing = cache_cli("ls", str(kv))
    assert "?  ? block ? on ?  3 blocks" in listing.stdout and "skipped" in listing.stderr
    (model_dir / "model.json").write_text("{not json")
    assert "unreadable" in cache_cli("ls", str(kv), "--json").stderr


def _temp_file_of_a_killed_writer(kv: Path) -> Path:
    """A real writer process that created its temp file and was killed by SIGKILL."""
    code = ("import os, sys, time; p = sys.argv[1] + f'/{\"ab\" * 32}.{os.getpid()}.7'; "
            "os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)); print(p, "
            "flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(kv / "tmp")],
                            stdout=subprocess.PIPE, text=True)
    path = Path(proc.stdout.readline().strip())
    proc.kill()
    proc.wait()
    proc.stdout.close()
    return path


def test_temp_files_of_killed_writers_are_removed_after_a_minute(tmp_path):
    kv, _ = filled(tmp_path)
    dead_old = _temp_file_of_a_killed_writer(kv)
    dead_new = dead_old.with_name(dead_old.name.replace(".7", ".8"))
    alive_old = kv / "tmp" / f"{'cd' * 32}.{os.getpid()}.9"
    unnamed_old = kv / "tmp" / "leftover"
    for p in (dead_new, alive_old, unnamed_old):
        p.touch()
    two_minutes_ago = time.time() - 120
    for p in (dead_old, alive_old, unnamed_old):
        os.utime(p, (two_minutes_ago, two_minutes_ago))
    cache_cli("prune", str(kv), "--max-bytes", "1GiB")
    left = {p.name for p in (kv / "tmp").iterdir()}
    assert left == {dead_new.name, alive_old.name, unnamed_old.name}
    # The write-behind thread of every run cleans up too.
    os.utime(dead_new, (two_minutes_ago, two_minutes_ago))
    writer = WriteBehind(open_model_store(kv, FP), max_bytes=1 << 30)
    writer.close()
    assert {p.name for p in (kv / "tmp").iterdir()} == {alive_old.name, unnamed_old.name}


def test_the_layout_check_accepts_a_cache_reached_through_a_link(tmp_path):
    """DIR itself may be a link the user made (~/.cache -> /data): only links inside refused."""
    kv, hashes = filled(tmp_path)
    (tmp_path / "via").symlink_to(kv, target_is_directory=True)
    assert open_cache_dir(tmp_path / "via") == tmp_path / "via"
    assert open_model_store(tmp_path / "via", FP).read(hashes[0], PAYLOAD) is not None
