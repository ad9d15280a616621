"""DiskKVTier: blocks round-trip between the KV tensor and files, through the NumPy (CPU) and
the torch (other devices) copy paths, for every KV dtype."""

from __future__ import annotations

import pytest
import torch

from kvcli.engine.kv_disk import DiskKVTier
from kvcli.kvstore import ModelFingerprint, WriteBehind, open_model_store

LAYERS, HEADS, DIM, BS, BLOCKS = 2, 2, 4, 4, 8


def tier(tmp_path, kv: torch.Tensor, numpy_path: bool) -> DiskKVTier:
    fp = ModelFingerprint("0" * 64, "Test", str(kv.dtype), "cpu", BS, LAYERS, HEADS, DIM, {})
    store = open_model_store(tmp_path / "kv", fp)
    t = DiskKVTier(store, WriteBehind(store, 1 << 30), kv, BS)
    if not numpy_path:
        t._host = None  # what a CUDA pool gets
    return t


def block(kv: torch.Tensor, i: int) -> torch.Tensor:
    return kv[:, :, i * BS:(i + 1) * BS]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("numpy_path", [True, False], ids=["numpy", "torch"])
def test_blocks_round_trip_bit_for_bit(tmp_path, dtype, numpy_path):
    src = torch.randn(LAYERS, 2, BLOCKS * BS, HEADS, DIM).to(dtype)
    writer_side = tier(tmp_path, src, numpy_path)
    hashes = [bytes([i]) * 32 for i in range(3)]
    writer_side.save([(1, hashes[0]), (3, hashes[1]), (6, hashes[2])])
    writer_side.close()
    assert writer_side.store.stats.written_blocks == 3
    dst = torch.zeros_like(src)
    reader = tier(tmp_path, dst, numpy_path)
    assert reader.load(hashes[1], 0) and reader.load(hashes[2], 7) and reader.load(hashes[0], 4)
    assert not reader.load(bytes([9]) * 32, 2)  # a miss leaves the block alone
    for got, want in ((0, 3), (7, 6), (4, 1)):
        assert torch.equal(block(dst, got).view(torch.uint8), block(src, want).view(torch.uint8))
    assert not block(dst, 2).any()
    reader.close()


def test_blocks_already_on_disk_are_not_copied_again(tmp_path):
    kv = torch.randn(LAYERS, 2, BLOCKS * BS, HEADS, DIM)
    t = tier(tmp_path, kv, True)
    t.save([(0, b"a" * 32)])
    t.writer.flush()
    t.save([(0, b"a" * 32), (1, b"b" * 32)])
    t.close()
    assert t.store.stats.written_blocks == 2 and t.store.stats.dropped_blocks == 0


def test_a_report_during_the_run_does_not_wait_for_the_disk(tmp_path):
    import threading

    kv = torch.randn(LAYERS, 2, BLOCKS * BS, HEADS, DIM)
    t = tier(tmp_path, kv, True)
    gate = threading.Event()
    real_write = t.store.write
    t.store.write = lambda h, p: (gate.wait(), real_write(h, p))[1]  # a stalled disk
    t.save([(0, b"a" * 32), (1, b"b" * 32)])
    assert t.report(0, flush=False)["written_blocks"] == 0  # returned at once
    gate.set()
    assert t.report(0)["written_blocks"] == 2
    t.close()
