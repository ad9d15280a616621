"""Compressed inputs and outputs (issue 28, item 14): gzip, bzip2, xz (and zstd with zstandard)
read by their first bytes, from files and stdin, by generate and audit alike; -o *.gz etc.
written compressed; the combinations that cannot work (--resume of a compressed output, zstd
without zstandard, a cut stream) are one clear error with exit status 2."""

from __future__ import annotations

import bz2
import gzip
import importlib.util
import json
import lzma
import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvcli.cli import main
from kvcli.compression import CompressionError, open_read, sniff

HAS_ZSTD = importlib.util.find_spec("zstandard") is not None


def _zstd(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor().compress(data)


COMPRESS = {"gz": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress}
DECOMPRESS = {"gz": gzip.decompress, "bz2": bz2.decompress, "xz": lzma.decompress}
if HAS_ZSTD:
    import zstandard

    COMPRESS["zst"] = _zstd
    DECOMPRESS["zst"] = lambda b: zstandard.ZstdDecompressor().stream_reader(b).read()
LINES = [{"id": f"r{i}", "prompt": f"The fox number {i} walked to the river and", "max_tokens": 4}
         for i in range(12)]


@pytest.fixture
def plain(tmp_path: Path) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in LINES))
    return path


def kvcli(*args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvcli", *args], capture_output=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
                          **kw)


def generate(model: Path, *args: str, stdin: bytes | None = None) -> bytes:
    res = CliRunner().invoke(main, ["generate", *args, "--model", str(model), "-q", "--ordered"],
                             input=stdin, catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    return res.stdout_bytes


@pytest.mark.parametrize("ext", sorted(COMPRESS))
def test_compressed_input_gives_the_plain_results(tiny_models, plain, tmp_path, ext) -> None:
    model = tiny_models["llama"]
    want = generate(model, str(plain))
    packed = COMPRESS[ext](plain.read_bytes())
    named = tmp_path / f"in.jsonl.{ext}"
    named.write_bytes(packed)
    unnamed = tmp_path / "also.jsonl"  # by its bytes, not its name
    unnamed.write_bytes(packed)
    assert generate(model, str(named)) == want
    assert generate(model, str(unnamed)) == want
    assert generate(model, "-", stdin=packed) == want
    assert generate(model, str(named), "--input-order", "prefix") == want  # offsets: a copy
    assert generate(model, str(named), str(unnamed)).count(b"\n") == 2 * len(LINES)


@pytest.mark.parametrize("ext", sorted(COMPRESS))
def test_compressed_output_decompresses_to_the_plain_results(tiny_models, plain, tmp_path,
                                                             ext) -> None:
    model = tiny_models["llama"]
    out = tmp_path / f"out.jsonl.{ext}"
    generate(model, str(plain), "-o", str(out))
    assert DECOMPRESS[ext](out.read_bytes()) == generate(model, str(plain))
    assert sniff(out.read_bytes()[:6]) is not None


@pytest.mark.parametrize("ext", sorted(COMPRESS))
def test_audit_reads_compressed_files_stdin_and_directories(plain, tmp_path, ext) -> None:
    def audit(*args: str, stdin: bytes | None = None) -> bytes:
        res = CliRunner().invoke(main, ["audit", *args], input=stdin, catch_exceptions=False)
        assert res.exit_code == 0 and not res.stderr, res.stderr
        return res.stdout_bytes

    want = audit(str(plain))
    packed = COMPRESS[ext](plain.read_bytes())
    folder = tmp_path / "dir"
    folder.mkdir()
    (folder / f"in.jsonl.{ext}").write_bytes(packed)
    assert audit(str(folder / f"in.jsonl.{ext}")) == want
    assert audit("-", stdin=packed) == want
    assert audit(str(folder)) == want


def test_a_cut_stream_is_one_clear_error(tiny_models, plain, tmp_path) -> None:
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(plain.read_bytes())[:-12])  # the trailer and some data gone
    res = kvcli("generate", str(cut), "--model", str(tiny_models["llama"]), "-q")
    err = res.stderr.decode()
    assert res.returncode == 2 and "Traceback" not in err, err
    assert f"cannot read {cut}: the gzip data is cut short" in err
    audit = kvcli("audit", str(cut))
    assert "the gzip data is cut short" in audit.stderr.decode()
    assert "invalid UTF-8" not in audit.stderr.decode()


def test_resume_of_a_compressed_output_is_refused(tiny_models, plain, tmp_path) -> None:
    out = tmp_path / "out.jsonl.gz"
    res = kvcli("generate", str(plain), "--model", str(tiny_models["llama"]), "-o", str(out),
                "--resume")
    assert res.returncode == 2
    assert res.stderr.decode().startswith(
        f"kvcli generate: --resume cannot continue a compressed output (-o {out})")
    assert f"write plain -o {tmp_path / 'out.jsonl'} (resumable)" in res.stderr.decode()
    assert not out.exists() or out.stat().st_size == 0


def test_zstd_without_zstandard_says_so(tiny_models, plain, tmp_path, monkeypatch) -> None:
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "zstandard.py").write_text("raise ImportError('blocked for the test')\n")
    packed = tmp_path / "in.jsonl.zst"
    packed.write_bytes(b"\x28\xb5\x2f\xfd" + b"\0" * 16)  # a zstd frame's magic
    env = {"PYTHONPATH": f"{blocker}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    res = kvcli("generate", str(packed), "--model", str(tiny_models["llama"]), env=env)
    assert res.returncode == 2
    assert "this looks like zstd; install zstandard" in res.stderr.decode()
    out = kvcli("generate", str(plain), "--model", str(tiny_models["llama"]), "-o",
                str(tmp_path / "o.jsonl.zst"), env=env)
    assert out.returncode == 2 and "-o *.zst needs zstandard" in out.stderr.decode()
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(CompressionError, match="this looks like zstd"):
        open_read(str(packed))


def _gzip_lines(data: bytes) -> list[bytes]:
    """The whole lines a (possibly unfinished) gzip stream holds so far."""
    text = zlib.decompressobj(31).decompress(data)
    return text.split(b"\n")[:-1]


def test_sigint_finishes_a_gzip_output_whole(tiny_models, tmp_path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl.gz"
    inp.write_text("".join(json.dumps({"id": f"r{i}", "prompt": f"Fox {i} ran", "max_tokens": 64})
                           + "\n" for i in range(200)))
    proc = subprocess.Popen([sys.executable, "-m", "kvcli", "generate", str(inp), "-o", str(out),
                             "--model", str(tiny_models["llama"]), "--ignore-eos",
                             "--max-num-seqs", "2"], stderr=subprocess.PIPE,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    end = time.monotonic() + 300
    while not (out.exists() and len(_gzip_lines(out.read_bytes())) >= 3):  # flushed per line
        assert proc.poll() is None and time.monotonic() < end, proc.stderr.read()
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    rows = gzip.decompress(out.read_bytes()).splitlines()  # a finished stream: no EOFError
    assert 3 <= len(rows) < 200 and all("text" in json.loads(r) for r in rows)


def test_resume_with_a_compressed_input(tiny_models, plain, tmp_path) -> None:
    """--resume reads only the (plain) output; ids and line numbers are the decompressed
    input's, so a run cut after 5 results finishes to the uninterrupted file."""
    model = tiny_models["llama"]
    packed = tmp_path / "in.jsonl.xz"
    packed.write_bytes(lzma.compress(plain.read_bytes()))
    out = tmp_path / "out.jsonl"
    full = generate(model, str(packed), "-o", str(out))
    assert full == b""
    whole = out.read_bytes()
    out.write_bytes(b"".join(whole.splitlines(keepends=True)[:5]) + b'{"id": "r5", "te')
    generate(model, str(packed), "-o", str(out), "--resume")
    assert out.read_bytes() == whole
