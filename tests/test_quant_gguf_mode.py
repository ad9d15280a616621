"""``--quantization gguf`` runs a GGUF never converted: config and tokenizer come from the file
(kvcli/checkpoint/gguf_meta.py, derived once into $KVCLI_HOME/gguf), the weights are the file's
own tensors. It must give what the converted path gives, bit for bit, without converting."""

from __future__ import annotations

import json
import shutil
import threading
import time
import weakref
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from quant_runs import greedy
from test_quant_model import quant_gguf  # noqa: F401 - the tiny quantized GGUF fixture

from kvcli.checkpoint import gguf_meta
from kvcli.checkpoint.convert import ModelResolveError
from kvcli.cli import main
from kvcli.kvstore.fingerprint import weights_digest
from kvcli.model.gguf_convert import resolve_model
from kvcli.model.kv_pool import _populate, zeroed_cpu_tensor
from kvcli.model.quant.load import load_quantized

COMPANIONS = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "chat_template.jinja")


def _conversions(home: Path) -> list[str]:
    models = home / "models"
    return sorted(p.name for p in models.iterdir()) if models.is_dir() else []


@pytest.fixture(scope="module")
def derived(quant_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """quant_gguf's gguf-mode directory, derived once (a child process: ~6 s) in a home of its
    own; a test that needs one to start from copies it into its home (_seed)."""
    home = tmp_path_factory.mktemp("derived-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVCLI_HOME", str(home))
        return resolve_model(str(quant_gguf), quiet=True, quantization="gguf")


def _seed(derived: Path, home: Path) -> Path:
    """``home`` as if it had derived ``derived`` itself (the directory's name is the GGUF's key,
    the same in every home)."""
    dest = home / "gguf" / derived.name
    shutil.copytree(derived, dest, symlinks=True)
    return dest


def test_gguf_mode_directory_equals_the_conversion(quant_gguf, derived, kvcli_home):  # noqa: F811
    home = derived.parent.parent  # the fixture's, where only this derivation ran
    assert derived.parent == home / "gguf" and _conversions(home) == []
    meta_dir = _seed(derived, kvcli_home)
    assert resolve_model(str(quant_gguf), quiet=True, quantization="gguf") == meta_dir
    assert gguf_meta.linked_gguf(meta_dir) == quant_gguf.resolve()
    converted = resolve_model(str(quant_gguf), quiet=True)  # the float32 conversion
    for name in COMPANIONS:
        assert (meta_dir / name).read_bytes() == (converted / name).read_bytes(), name
    prompt = list(range(5, 45))
    want, want_logits = greedy(load_quantized(converted, "gguf"), prompt, 4)
    got, got_logits = greedy(load_quantized(meta_dir, "gguf"), prompt, 4)
    assert got == want
    assert all(torch.equal(a, b) for a, b in zip(got_logits, want_logits, strict=True))
    # A disk KV cache keys gguf-mode blocks by the GGUF's bytes (model.gguf links to it).
    assert weights_digest(meta_dir, None) != weights_digest(converted, None)


# The family (tied or untied output layer) changes the weights, not the files derived from a
# GGUF nor how they are keyed, found, redone or reported: the tests of that derivation run one.
_ONE_FAMILY = pytest.mark.parametrize("quant_gguf", ["llama"], indirect=True)


@_ONE_FAMILY
def test_gguf_mode_derives_once_and_redoes_an_unfinished_directory(quant_gguf, derived,  # noqa: F811
                                                                   kvcli_home, monkeypatch):
    first = _seed(derived, kvcli_home)  # derived once (the fixture's resolve_model)
    real = gguf_meta._derive

    def refuse(*args):
        raise AssertionError("derived again")

    monkeypatch.setattr(gguf_meta, "_derive", refuse)
    assert resolve_model(str(quant_gguf), quiet=True, quantization="gguf") == first
    (first / gguf_meta._DONE).unlink()  # as if killed before its last write
    calls = []
    monkeypatch.setattr(gguf_meta, "_derive", lambda *a: calls.append(a) or real(*a))
    assert resolve_model(str(quant_gguf), quiet=True, quantization="gguf") == first
    assert len(calls) == 1 and gguf_meta.linked_gguf(first) is not None


@_ONE_FAMILY
def test_a_copy_of_the_gguf_reuses_its_metadata_by_checksum(quant_gguf, derived,  # noqa: F811
                                                             kvcli_home, monkeypatch, tmp_path):
    first = _seed(derived, kvcli_home)
    copy = tmp_path / "elsewhere" / "copy.gguf"
    copy.parent.mkdir()
    shutil.copyfile(quant_gguf, copy)
    real, calls = gguf_meta._derive, []
    monkeypatch.setattr(gguf_meta, "_derive", lambda *a: calls.append(a) or real(*a))
    second = resolve_model(str(copy), quiet=True, quantization="gguf")
    assert calls == []  # not derived again
    assert second != first and gguf_meta.linked_gguf(second) == copy.resolve()
    for name in COMPANIONS:
        assert (second / name).read_bytes() == (first / name).read_bytes(), name
    changed = bytearray(copy.read_bytes())
    changed[-1] ^= 0xFF  # other bytes: not the same model
    copy.write_bytes(bytes(changed))
    third = resolve_model(str(copy), quiet=True, quantization="gguf")
    assert len(calls) == 1 and third.parent == kvcli_home / "gguf"


def _run(tmp_path: Path, name: str, *args: str) -> list[list[int]]:
    batch = tmp_path / "in.jsonl"
    batch.write_text("".join(json.dumps({"prompt": p, "max_tokens": 6}) + "\n"
                             for p in ("Once upon a time", "The capital of")))
    out = tmp_path / name
    res = CliRunner().invoke(main, ["generate", str(batch), "-o", str(out), "-q", "--ordered",
                                    "--token-ids", *args], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return [json.loads(line)["token_ids"] for line in out.read_text().splitlines()]


@_ONE_FAMILY
@pytest.mark.fresh_derive
def test_deriving_runs_in_a_child_whose_errors_are_the_callers(quant_gguf, kvcli_home,  # noqa: F811
                                                               tmp_path, monkeypatch, capsys):
    """The config and tokenizer come from a child process (transformers' parse stays out of
    the job's heap); what it cannot read is a ModelResolveError naming the file."""
    out = tmp_path / "out"
    out.mkdir()
    gguf_meta._derive(quant_gguf, out, require_chatml=False)
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00 truncated")
    with pytest.raises(ModelResolveError, match="bad.gguf: reading its config and tokenizer"):
        gguf_meta._derive(bad, tmp_path, require_chatml=False)

    def refuse(*args, **kwargs):
        raise ModelResolveError("x.gguf: the GGUF has no ChatML chat template")

    monkeypatch.setattr(gguf_meta, "_write_metadata", refuse)  # the child's side of a refusal
    assert gguf_meta._main("x.gguf", str(out), "chatml") == gguf_meta._REFUSED
    assert capsys.readouterr().out.strip() == "x.gguf: the GGUF has no ChatML chat template"


def test_cli_gguf_mode_runs_without_a_conversion(quant_gguf, kvcli_home, tmp_path):  # noqa: F811
    quant = _run(tmp_path, "q.jsonl", "--model", str(quant_gguf), "--quantization", "gguf")
    assert _conversions(kvcli_home) == []
    assert quant == _run(tmp_path, "a.jsonl", "--model", str(quant_gguf))  # auto: gguf again
    assert _conversions(kvcli_home) == []
    assert quant == _run(tmp_path, "f.jsonl", "--model", str(quant_gguf),
                         "--quantization", "none")  # converts now
    assert len(_conversions(kvcli_home)) == 1


def test_kv_pool_is_zero_and_prefaulting_keeps_what_was_written():
    """The CPU KV pool (kvcli/model/kv_pool.py) is lazily zeroed memory; faulting its pages in
    while the engine already writes blocks must not change a byte."""
    pool = zeroed_cpu_tensor((4, 1 << 18), torch.float32, prefault=False)  # 4 MiB
    assert pool.is_contiguous() and not pool.any()
    pool[1, 7] = 3.5
    size = pool.numel() * 4
    _populate(weakref.ref(pool), pool.data_ptr(), size, first=size)
    assert pool[1, 7] == 3.5 and int((pool != 0).sum()) == 1


def _resident(address: int, size: int) -> int:
    """Bytes of [address, address + size) in memory (mincore; page-aligned address)."""
    import ctypes
    import mmap

    pages = -(-size // mmap.PAGESIZE)
    vec = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    assert libc.mincore(address, size, vec) == 0
    return sum(v & 1 for v in vec) * mmap.PAGESIZE


def _until(condition, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds  # a liveness bound, not a timing: it passes at once
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_kv_pool_pages_come_in_ahead_of_the_writes_not_all_at_once():
    """A one-line job touches a few blocks: the pool's regions (layer x K/V) are faulted in
    from their starts, and further only once the engine has written into the second half of
    what is in, so its memory follows its use (the default pool was 1 GiB of RSS at once)."""
    shape = (2, 2, 4096, 1, 64)  # 4 regions of 4,096 slots of 256 bytes: 1 MiB each
    pool = zeroed_cpu_tensor(shape, torch.float32, prefault=False)
    base, region, first = pool.data_ptr(), 1 << 20, 64 << 10
    worker = threading.Thread(target=_populate, args=(weakref.ref(pool), base, 4 * region, 4,
                                                      256, first))
    worker.start()
    in_all = lambda n: all(_resident(base + r * region, region) >= n for r in range(4))  # noqa: E731
    assert _until(lambda: in_all(first))
    for block in range(8):  # 16-slot blocks from the first: slots 0-127, the first half
        pool[0, 0, block * 16] = 1.0
    time.sleep(0.1)  # none in the second half yet: nothing more comes in
    assert _resident(base, region) == first
    pool[0, 0, 8 * 16] = 1.0  # block 8: slot 128 = 32 KiB, the second half
    assert _until(lambda: in_all(2 * first))
    for block in range(9, 4096 // 16):  # the engine goes on filling the pool
        pool[0, 0, block * 16] = 1.0
    worker.join(30)
    assert not worker.is_alive() and in_all(region)
    assert int((pool != 0).sum()) == 64 * 256 and bool((pool[0, 0, ::16] == 1.0).all())


def test_kv_pool_regions_off_page_boundaries_are_faulted_in_too():
    """Regions of 1,000 slots of 256 bytes start mid-page; each is faulted in all the same."""
    pool = zeroed_cpu_tensor((2, 2, 1000, 1, 64), torch.float32, prefault=False)
    size = pool.numel() * 4
    _populate(weakref.ref(pool), pool.data_ptr(), size, 4, 256, first=size)
    assert _resident(pool.data_ptr(), size) >= size and not pool.any()


def test_a_dropped_pool_is_freed_while_its_prefault_runs():
    """The prefault thread must not keep a dropped engine's pool (fully faulted in) alive: the
    test suite's in-process engines piled up gigabytes that way."""
    pool = zeroed_cpu_tensor((64, 1 << 20), torch.float32)  # 256 MiB: its prefault takes a while
    alive = weakref.ref(pool)
    del pool
    assert alive() is None
