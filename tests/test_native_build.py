"""The native kernels' build: keyed by every input, compiled in parallel, started early.

A fake compiler (a shell script that writes its output file and logs its call) stands in for
cc, so these tests compile nothing and run in milliseconds.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from kvcli.model.native import build

NATIVE_DIR = Path(build.__file__).parent


@pytest.fixture(autouse=True)
def _fresh_build_state(monkeypatch):
    """Each test starts as a new process would: no build started, no library collected."""
    monkeypatch.setattr(build, "_started", {})
    monkeypatch.setattr(build, "_collected", set())
    monkeypatch.delenv("KVCLI_KERNELS_DIR", raising=False)  # the kernels under each test's home


def _fake_cc(tmp_path: Path, fail_on: str = "") -> Path:
    """A 'compiler' that logs each call and creates the file after -o (fails on `fail_on`)."""
    script = tmp_path / "fake-cc"
    log = tmp_path / "cc.log"
    script.write_text(f"""#!/bin/sh
echo "$@" >> {log}
case "$*" in *--version*) echo fake-cc 1.0; exit 0;; esac
case "$*" in *{fail_on or '@never@'}*) echo broken >&2; exit 1;; esac
while [ $# -gt 0 ]; do if [ "$1" = -o ]; then echo obj > "$2"; fi; shift; done
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def _calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "cc.log"
    return [c for c in log.read_text().splitlines() if "--version" not in c] if log.exists() else []


def test_every_c_file_and_header_is_in_the_key():
    """A kernel file added to the directory but not to SOURCES/HEADERS would be left out of
    the cache key: a changed header would then load a stale build."""
    on_disk = {p.name for p in NATIVE_DIR.iterdir() if p.suffix in (".c", ".h")}
    assert on_disk == {p.name for p in (*build.SOURCES, *build.HEADERS)}


def test_the_key_changes_with_each_source_flag_and_compiler(tmp_path, monkeypatch):
    cc = _fake_cc(tmp_path)
    copies = []
    for src in (*build.SOURCES, *build.HEADERS):
        copy = tmp_path / src.name
        shutil.copy(src, copy)
        copies.append(copy)
    monkeypatch.setattr(build, "SOURCES", tuple(copies[: len(build.SOURCES)]))
    monkeypatch.setattr(build, "HEADERS", tuple(copies[len(build.SOURCES):]))
    flags = build.isa_flags("native")
    base = build.build_key(str(cc), flags)
    assert build.build_key(str(cc), flags) == base  # deterministic
    assert build.build_key(str(cc), (*flags, "-DX")) != base
    for copy in (copies[0], copies[-1]):  # a source, a header
        original = copy.read_text()
        copy.write_text(original + "\n/* changed */\n")
        assert build.build_key(str(cc), flags) != base
        copy.write_text(original)
    cc.write_text(cc.read_text().replace("fake-cc 1.0", "fake-cc 2.0"))
    assert build.build_key(str(cc), flags) != base


def test_one_object_per_source_then_one_link_and_reuse(tmp_path, monkeypatch):
    monkeypatch.setenv("KVCLI_HOME", str(tmp_path / "home"))
    cc = _fake_cc(tmp_path)
    target = build.build(str(cc), build.isa_flags("native"))
    calls = _calls(tmp_path)
    compiled = [c for c in calls if " -c " in f" {c} "]
    assert len(compiled) == len(build.SOURCES) and len(calls) == len(build.SOURCES) + 1
    assert target.is_file() and target.parent == tmp_path / "home" / "kernels"
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no temp files left
    assert build.build(str(cc), build.isa_flags("native")) == target
    assert len(_calls(tmp_path)) == len(calls)  # cached: nothing compiled again


def test_a_failed_compile_raises_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("KVCLI_HOME", str(tmp_path / "home"))
    cc = _fake_cc(tmp_path, fail_on="qint.c")
    with pytest.raises(subprocess.CalledProcessError):
        build.build(str(cc), build.isa_flags("native"))
    assert list((tmp_path / "home" / "kernels").iterdir()) == []


def test_a_started_build_is_collected_not_repeated(tmp_path, monkeypatch):
    monkeypatch.setenv("KVCLI_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CC", str(_fake_cc(tmp_path)))
    build.start("native")
    build.start("native")  # the same inputs: no second build
    path = build.library_path("native")
    assert path is not None and path.is_file()
    assert len(_calls(tmp_path)) == len(build.SOURCES) + 1
    monkeypatch.setenv("KVCLI_HOME", str(tmp_path / "other"))
    build.start("native")  # other inputs: its own build, not the first one's result
    assert build.library_path("native").parent == tmp_path / "other" / "kernels"


def test_no_build_is_started_once_this_process_has_the_library(tmp_path, monkeypatch):
    """The process keeps the library it loaded (load_variant), so an engine under another
    KVCLI_HOME (as every test's) must not start a build that nobody would collect."""
    monkeypatch.setenv("KVCLI_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CC", str(_fake_cc(tmp_path)))
    assert build.library_path("native") is not None
    built = len(_calls(tmp_path))
    monkeypatch.setenv("KVCLI_HOME", str(tmp_path / "other"))
    build.start("native")
    assert build._started == {} and len(_calls(tmp_path)) == built


def test_a_started_build_honours_native_off_and_reports_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("KVCLI_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KVCLI_NATIVE", "0")
    build.start("native")
    assert build.library_path("native") is None
    monkeypatch.delenv("KVCLI_NATIVE")
    monkeypatch.setenv("CC", str(_fake_cc(tmp_path, fail_on="gemm.c")))
    build.start("native")
    with pytest.raises(subprocess.CalledProcessError):
        build.library_path("native")


def test_a_dead_builds_temp_dir_is_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("KVCLI_HOME", str(tmp_path / "home"))
    kernels = tmp_path / "home" / "kernels"
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = kernels / f".tmp-{dead.pid}-build-x"
    stale.mkdir(parents=True)
    (stale / "qgemm.o").write_text("")
    live = kernels / f".tmp-{os.getpid()}-build-y"  # this process: maybe building right now
    live.mkdir()
    build.build(str(_fake_cc(tmp_path)), build.isa_flags("native"))
    assert not stale.exists() and live.exists()
