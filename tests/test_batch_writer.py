"""The result writer (whole-line writes, streaming vs ordered), resume scanning, size parsing."""

from __future__ import annotations

import os

import pytest

from kvcli.batch.resume import result_key, scan_output
from kvcli.batch.sizes import parse_size
from kvcli.batch.writer import FdSink, ResultWriter, open_sink


class ListSink:
    name = "list"

    def __init__(self) -> None:
        self.lines: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.lines.append(data)

    def close(self) -> None:
        pass


def test_streaming_writes_in_completion_order() -> None:
    sink = ListSink()
    w = ResultWriter(sink)
    seqs = [w.reserve() for _ in range(3)]
    for s in (2, 0, 1):
        w.submit(seqs[s], b"%d\n" % s)
    assert sink.lines == [b"2\n", b"0\n", b"1\n"] and w.outstanding == 0 and w.written == 3


def test_ordered_writes_each_line_once_everything_before_it_is_out() -> None:
    sink = ListSink()
    w = ResultWriter(sink, ordered=True)
    seqs = [w.reserve() for _ in range(4)]
    w.submit(seqs[2], b"2\n")
    w.submit(seqs[1], b"1\n")
    assert sink.lines == [] and w.held == 2 and w.outstanding == 4
    w.submit(seqs[0], b"0\n")
    assert sink.lines == [b"0\n", b"1\n", b"2\n"] and w.outstanding == 1 and w.held == 0
    w.submit(seqs[3], b"3\n")
    assert sink.lines[-1] == b"3\n" and w.outstanding == 0


def test_fd_sink_completes_partial_writes(monkeypatch) -> None:
    r, wfd = os.pipe()
    real_write = os.write
    calls = []

    def short_write(fd: int, data: bytes) -> int:  # the kernel may take part of a line
        calls.append(len(data))
        return real_write(fd, bytes(data[:3]))

    monkeypatch.setattr(os, "write", short_write)
    FdSink(wfd, "pipe").write(b'{"id": 1}\n')
    monkeypatch.undo()
    os.close(wfd)
    assert os.read(r, 100) == b'{"id": 1}\n' and calls[0] == 10  # the first try is the whole line
    os.close(r)


def test_open_sink_truncates_or_appends(tmp_path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_bytes(b"old\n")
    sink = open_sink(str(path), append=True)
    sink.write(b"new\n")
    sink.close()
    assert path.read_bytes() == b"old\nnew\n"
    sink = open_sink(str(path))
    sink.write(b"only\n")
    sink.close()
    assert path.read_bytes() == b"only\n"


def test_result_key() -> None:
    assert result_key(b'{"id": "batch_req_x", "custom_id": "c1", "response": null}') == "c1"
    assert result_key(b'{"id": "q1", "text": "a"}') == "q1"
    assert result_key(b'{"text": "a"}') is None
    assert result_key(b"[1]") is None and result_key(b"{trunc") is None


def test_scan_output_truncates_partial_last_line(tmp_path) -> None:
    path = tmp_path / "out.jsonl"
    good = b'{"id": "a", "text": "x"}\n{"custom_id": "b", "response": null}\nnot json\n'
    path.write_bytes(good + b'{"id": "c", "te')
    state = scan_output(str(path))
    assert state.done == {"a", "b"} and state.results == 2 and state.unreadable == [3]
    assert state.truncated_bytes == len(b'{"id": "c", "te')
    assert path.read_bytes() == good


def test_scan_output_valid_json_without_newline_is_partial(tmp_path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_bytes(b'{"id": "a"}\n{"id": "b"}')  # killed just before the newline
    assert scan_output(str(path)).done == {"a"}
    assert path.read_bytes() == b'{"id": "a"}\n'


def test_scan_missing_output_is_empty(tmp_path) -> None:
    state = scan_output(str(tmp_path / "none.jsonl"))
    assert state.done == set() and not (tmp_path / "none.jsonl").exists()


@pytest.mark.parametrize("text, value", [
    ("2GiB", 2 << 30), ("512MiB", 512 << 20), ("1.5GB", 1_500_000_000), ("2G", 2 << 30),
    ("1000000", 1_000_000), ("64 kb", 64_000), ("1k", 1024), ("3TiB", 3 << 40),
])
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "GiB", "2XB", "-1GiB", "0", "1.2.3G"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(text)


def test_seen_ids_finds_every_kind_of_duplicate() -> None:
    from kvcli.batch.records import LineId
    from kvcli.batch.seen import SeenIds

    seen = SeenIds()
    assert seen.add(LineId(1, "a", "id")) is None
    assert seen.add(LineId(2, "line-2")) is None
    assert seen.add(LineId(3, "a", "custom_id")) == 1
    assert seen.add(LineId(4, "line-2", "id")) == 2  # explicit id spelling an earlier auto id
    assert seen.add(LineId(5, "line-9", "id")) is None
    assert seen.add(LineId(9, "line-9")) == 5  # auto id that an earlier explicit id took
    assert seen.add(LineId(10_000, "line-10000")) is None
    assert seen.add(LineId(10_001, "line-10000", "id")) == 10_000
    assert seen.add(LineId(10_002, "line-99999999999999", "id")) is None


def test_count_lines_never_reads_a_pipe(tmp_path) -> None:
    from kvcli.batch.source import count_lines

    path = tmp_path / "in.jsonl"
    path.write_text('{"prompt": "a"}\n\n{"prompt": "b"}\n')
    assert count_lines(str(path)) == 2 and count_lines("-") is None
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert count_lines(str(fifo)) is None  # opening it would block (and eat the input)
