"""The torch-free disk store: format, checksum, atomic publish, refusal, eviction, write-behind."""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import threading
from pathlib import Path

import pytest

from kvcli.kvstore import NotAKVCacheError, WriteBehind, open_model_store
from kvcli.kvstore.directory import iter_block_files, open_cache_dir, prune, total_bytes
from kvcli.kvstore.fingerprint import ModelFingerprint, file_digest, weights_digest
from kvcli.kvstore.format import HEADER_SIZE, MARKER_NAME

FP = ModelFingerprint("ab" * 32, "LlamaForCausalLM", "float32", "cpu", 16, 2, 4, 16,
                      {"rope_type": "default", "theta": 10000.0})


def block(i: int, size: int = 1024) -> tuple[bytes, memoryview]:
    return bytes([i]) * 32, memoryview(bytes([i % 251]) * size)


def test_a_block_round_trips_in_private_files(tmp_path):
    store = open_model_store(tmp_path / "kv", FP)
    h, payload = block(1)
    assert store.read(h) is None  # a miss
    assert store.write(h, payload) == HEADER_SIZE + len(payload)
    assert store.write(h, payload) == 0  # already there: not rewritten
    assert bytes(store.read(h)) == bytes(payload)
    assert store.stats.hit_blocks == 1 and store.stats.bytes_read == HEADER_SIZE + 1024
    path = store.path(h)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for d in (tmp_path / "kv", store.dir, path.parent):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert not list((tmp_path / "kv" / "tmp").iterdir())  # the temp file was renamed


def test_another_fingerprint_never_hits(tmp_path):
    a = open_model_store(tmp_path, FP)
    other = ModelFingerprint(**{**FP.describe(), "dtype": "bfloat16"})
    assert other.digest() != FP.digest()
    b = open_model_store(tmp_path, other)
    h, payload = block(2)
    a.write(h, payload)
    assert b.read(h) is None
    # Even a file copied under the other model's name is refused by its header.
    b.path(h).parent.mkdir(parents=True)
    b.path(h).write_bytes(a.path(h).read_bytes())
    assert b.read(h) is None and b.stats.corrupt_blocks == 1


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "extend"])
def test_damaged_blocks_are_ignored_with_one_warning(tmp_path, caplog, damage):
    store = open_model_store(tmp_path, FP)
    hashes = []
    for i in range(3):
        h, payload = block(i + 10)
        store.write(h, payload)
        hashes.append(h)
        data = bytearray(store.path(h).read_bytes())
        if damage == "flip":
            data[HEADER_SIZE + 500] ^= 1
        elif damage == "truncate":
            data = data[:-7]
        elif damage == "empty":
            data = bytearray()
        else:
            data += b"x"
        store.path(h).write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="kvcli.kvstore"):
        assert all(store.read(h) is None for h in hashes)
    assert len([r for r in caplog.records if "damaged" in r.message]) == 1
    assert store.stats.corrupt_blocks == 3 and store.stats.hit_blocks == 0
    assert not any(store.path(h).exists() for h in hashes)  # removed: rewritten next time


def test_a_directory_that_is_not_a_cache_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(NotAKVCacheError, match="not a kvcli KV cache"):
        open_model_store(tmp_path, FP)
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]  # nothing written
    with pytest.raises(NotAKVCacheError, match="not a directory"):
        open_cache_dir(tmp_path / "notes.txt")
    (tmp_path / "v9").mkdir()
    (tmp_path / "v9" / MARKER_NAME).write_text('{"format": "kvcli-kv-cache", "version": 9}')
    with pytest.raises(NotAKVCacheError, match="version 9"):
        open_cache_dir(tmp_path / "v9")
    (tmp_path / "empty").mkdir()
    assert (open_cache_dir(tmp_path / "empty") / MARKER_NAME).exists()


def test_a_world_readable_cache_is_warned_about(tmp_path, caplog):
    root = open_cache_dir(tmp_path / "kv")
    root.chmod(0o755)
    with caplog.at_level(logging.WARNING, logger="kvcli.kvstore"):
        open_model_store(root, FP)
    assert "readable by other users" in caplog.text


def test_prune_evicts_least_recently_used_first(tmp_path):
    store = open_model_store(tmp_path, FP)
    hashes = []
    for i in range(10):
        h, payload = block(i + 40)
        store.write(h, payload)
        os.utime(store.path(h), (1000 + i, 1000 + i))
        hashes.append(h)
    store.read(hashes[0])  # a hit makes the oldest block the most recently used
    size = HEADER_SIZE + 1024
    result = prune(tmp_path, max_bytes=5 * size, fraction=0.8)
    assert result.removed_files == 6 and result.kept_bytes == 4 * size == total_bytes(tmp_path)
    kept = {f.path.name for f in iter_block_files(tmp_path)}
    assert kept == {h.hex() for h in [hashes[0], *hashes[7:]]}
    assert prune(tmp_path, max_bytes=5 * size).removed_files == 0  # under the bound: no-op


def test_write_behind_publishes_and_keeps_the_bound(tmp_path):
    store = open_model_store(tmp_path, FP)
    size = HEADER_SIZE + 1024
    writer = WriteBehind(store, max_bytes=6 * size)
    try:
        for i in range(20):
            assert writer.offer(*block(i + 60))
        writer.flush()
    finally:
        writer.close()
    assert store.stats.written_blocks == 20
    assert total_bytes(tmp_path) <= 6 * size and store.stats.evicted_blocks >= 14
    assert store.read(block(79)[0]) is not None  # the newest survive


def test_write_behind_drops_instead_of_queueing_without_bound(tmp_path):
    store = open_model_store(tmp_path, FP)
    gate = threading.Event()
    real_write = store.write
    store.write = lambda h, p: (gate.wait(), real_write(h, p))[1]  # a slow disk
    writer = WriteBehind(store, max_bytes=1 << 30, max_pending_bytes=3 * 1024)
    try:
        accepted = [writer.offer(*block(i + 90)) for i in range(6)]
        gate.set()
        writer.flush()
    finally:
        writer.close()
    assert accepted == [True] * 3 + [False] * 3
    assert store.stats.dropped_blocks == 3 and store.stats.written_blocks == 3


def test_a_write_error_stops_writing_with_one_warning(tmp_path, caplog, monkeypatch):
    store = open_model_store(tmp_path, FP)
    calls = []

    def full(*args):
        calls.append(args)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("kvcli.kvstore.store.write_private", full)
    writer = WriteBehind(store, max_bytes=1 << 30)
    with caplog.at_level(logging.WARNING, logger="kvcli.kvstore"):
        for i in range(5):
            writer.offer(*block(i + 120))
        writer.flush()
        writer.close()
    assert len(calls) == 1 and writer.stopped
    assert store.stats.write_error == "No space left on device"
    assert store.stats.dropped_blocks == 5
    assert len([r for r in caplog.records if "cannot write" in r.message]) == 1
    assert not writer.offer(*block(200))


def test_weights_digest_covers_config_and_weights_and_is_remembered(tmp_path, monkeypatch):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"a": 1}')
    (model / "model.safetensors").write_bytes(b"w" * 100)
    (model / "tokenizer.json").write_text("{}")
    memo = tmp_path / "memo"
    first = weights_digest(model, memo)
    (model / "tokenizer.json").write_text('{"x": 2}')
    assert weights_digest(model, memo) == first  # the tokenizer does not change K/V
    (model / "config.json").write_text('{"a": 2}')
    assert weights_digest(model, memo) != first
    # Remembered: the unchanged file is not read whole again.
    weights = model / "model.safetensors"
    digest = file_digest(weights, memo)
    with monkeypatch.context() as m:
        m.setattr(hashlib, "file_digest", lambda *a: pytest.fail("hashed again"))
        assert file_digest(weights, memo) == digest
    # A same-size rewrite that puts the old mtime back is hashed again (issue 28, item 4).
    old = weights.stat().st_mtime_ns
    weights.write_bytes(b"v" * 100)
    os.utime(weights, ns=(old, old))
    assert file_digest(weights, memo) == file_digest(weights, None) != digest
    with pytest.raises(ValueError, match="no weight files"):
        weights_digest(tmp_path / "memo", None)


def test_every_keyed_setting_changes_the_fingerprint():
    base = FP.describe()
    changes = {"weights_sha256": "cd" * 32, "architecture": "Qwen2ForCausalLM",
               "dtype": "float16", "device_type": "cuda", "block_size": 32, "num_layers": 3,
               "num_kv_heads": 2, "head_dim": 8, "rope": {"rope_type": "default", "theta": 1e6},
               "quantization": "int8", "kv_format_version": 2}
    digests = {ModelFingerprint(**{**base, k: v}).digest() for k, v in changes.items()}
    assert len(digests | {FP.digest()}) == len(changes) + 1
    assert ModelFingerprint(**{**base, "label": "other name"}).digest() == FP.digest()


def test_iter_block_files_reports_sizes_per_model(tmp_path):
    store = open_model_store(tmp_path, FP)
    store.write(*block(3))
    files = list(iter_block_files(Path(tmp_path)))
    assert [(f.fingerprint, f.size) for f in files] == [(FP.digest().hex(), HEADER_SIZE + 1024)]
