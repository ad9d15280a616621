"""The test session's native kernel builds: one directory for every test and every kvcli
process a test starts (KVCLI_KERNELS_DIR), and for a whole-suite run the builds begun before
collection (conftest.py's pytest_configure / pytest_unconfigure call these).

A fresh $KVCLI_HOME per test would otherwise compile the C kernels again (30-40 s on 2 cores)
in each of the dozens of tests that start `kvcli` as a process; tests of the build itself unset
the variable. Collection (~20 s) is one core's work, so the default build (build.start, which
the first test loading the kernels collects) then costs the run almost nothing on the other
core. The AVX2 variant (KVCLI_NATIVE_ISA=avx2, one test's on an AVX2-only CPU) is compiled
under `nice -n 19` from the same start: it takes the CPU time the tests leave idle (waiting on
their processes), and is on disk, under the key that test's load computes, when it runs (if
not, that test compiles it as before). A run of chosen files compiles on first use, so that a
one-test run does not pay for builds it may not need.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

ENV = "KVCLI_KERNELS_DIR"
_saved: list[str | None] = []
_early: list[threading.Thread | None] = []  # per session: None, or the variant's build


def set_up(whole_suite: bool) -> None:
    _saved.append(os.environ.get(ENV))
    os.environ[ENV] = tempfile.mkdtemp(prefix="kvcli-test-kernels-")
    if not whole_suite or os.environ.get("KVCLI_NATIVE", "1") == "0":
        return
    from kvcli.model.native import build

    build.start("native")
    _early.append(None)
    cc = shutil.which(os.environ.get("CC", "cc"))
    try:
        flags = build.isa_flags("avx2")
    except ValueError:  # not an AVX2 CPU: no test builds the variant
        return
    if cc is None or shutil.which("nice") is None:
        return
    niced = Path(os.environ[ENV]) / ".niced-cc"  # `--version` is cc's: the key is the same
    niced.write_text(f'#!/bin/sh\nexec nice -n 19 {cc} "$@"\n')
    niced.chmod(0o755)
    _early[-1] = threading.Thread(target=_build_quietly, args=(str(niced), flags), daemon=True,
                                  name="kvcli-test-avx2-build")
    _early[-1].start()


def _build_quietly(cc: str, flags: tuple[str, ...]) -> None:
    from kvcli.model.native import build

    try:
        build.build(cc, flags)
    except (OSError, subprocess.SubprocessError):
        pass  # the variant's test then compiles it, and reports what fails


def tear_down() -> None:
    if _early:  # no compiler may outlive the run (one that ended before a test collected it)
        from kvcli.model.native import build

        try:
            build.library_path("native")
        except (OSError, ValueError, subprocess.SubprocessError):
            pass  # the tests have reported it; only the directory is left to remove
        variant = _early.pop()
        if variant is not None:
            variant.join()
    shutil.rmtree(os.environ[ENV], ignore_errors=True)
    old = _saved.pop()
    if old is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = old
