"""Compile the native kernels into ``$KVCLI_HOME/kernels`` once, in parallel, maybe in the
background (the engine starts it before the model loads).

The shared object is keyed by the source, the flags (the ISA variant's among them,
``KVCLI_NATIVE_ISA``), the compiler and the CPU's feature flags. A build compiles one object per
source, as many at once as the process may use cores (qgemm.c and qint.c, ~70% of the work,
first, so that the cores finish together), links them, and publishes the result atomically.
:func:`start` runs that on a thread: a fresh ``$KVCLI_HOME`` then compiles while the GGUF's
metadata is derived and the weights load, and a warm one checks its key (``cc --version``)
meanwhile; :func:`library_path` waits for a started build with the same inputs, else builds.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

_HERE = Path(__file__).parent
# Slowest to compile first (see the module docstring); the rest in any order.
SOURCES = tuple(_HERE / n
                for n in ("qgemm.c", "qint.c", "qint_pack.c", "pool.c", "gemm.c", "gemm_nt.c", "gemv.c",
                          "paged_attention.c",
                          "prefill_attention.c", "elementwise.c", "paged_attention_int8.c",
                          "prefill_attention_int8.c", "paged_attention_bf16.c",
                          "prefill_attention_bf16.c", "decode_step.c",
                          "bf16_gemm.c", "w8a8.c", "swiglu_amx.c"))
# Included by the sources above, so part of the build's key too (paged_attention.c is built
# once per converted-cache format, by paged_attention_int8.c and paged_attention_bf16.c).
HEADERS = tuple(_HERE / n for n in ("pool.h", "f32_vec.h", "qblocks.h", "qint_kernel.h",
                                    "qint_layout.h", "kv_int8.h", "kv_rows.h", "decode_vec.h",
                                    "qgemm_factored.h", "qint_nibble_avx2.h", "qint_amx.h",
                                    "prefill_scores.h", "prefill_panels.h", "prefill_amx.h", "decode_vnni.h",
                                    "paged_attention.c", "vexp.h", "amx_tiles.h"))
# -ffast-math lets the compiler vectorise the dot products and sums (float32 results then differ
# from torch's in the last bits, as OpenBLAS's do) and call glibc's vector expf (decode attention
# 1.10 -> 1.01 ms per layer for 32 sequences). It is given to the compile step only: linking with it would add
# crtfastmath.o, which flushes denormals to zero for the whole process (torch and NumPy too).
FLAGS = ("-O3", "-fPIC", "-pthread", "-ffast-math")
LINK = ("-shared", "-pthread")
LIBS = ("-lm", "-ldl")  # after the objects; -ldl: pool.c finds torch's OpenMP (dlsym)
# KVCLI_NATIVE_ISA: the instruction set to build for. "avx2" is what an AVX2-only CPU (AMD Zen 3)
# compiles (x86-64-v3: AVX2, FMA, F16C; no AVX-512), tuned for this CPU: it runs the AVX2 code
# paths on an AVX-512 machine, where they would otherwise go untested.
ISA_FLAGS = {"native": ("-march=native",), "avx512": ("-march=native",),
             "avx2": ("-march=x86-64-v3", "-mtune=native")}
_ISA_NEEDS = {"avx512": ("avx512f",), "avx2": ("avx2", "fma", "f16c")}  # /proc/cpuinfo flags
_TEMP_PREFIX = ".tmp-"  # as checkpoint/convert.py's: a dead process's build dir is removed
_started: dict[tuple[str, ...], Future[Path | None]] = {}
# ISAs whose library this process already has: load_variant keeps it for the process's life, so
# a later engine (another KVCLI_HOME, as the tests set) must not start a build nobody collects.
_collected: set[str] = set()
_lock = threading.Lock()


def cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return os.uname().machine


def isa_flags(isa: str) -> tuple[str, ...]:
    """The compile flags of a KVCLI_NATIVE_ISA value (ValueError: unknown, or the CPU lacks it)."""
    if isa not in ISA_FLAGS:
        raise ValueError(f"KVCLI_NATIVE_ISA={isa!r}: expected one of {', '.join(ISA_FLAGS)}")
    cpu = set(cpu_flags().split())
    missing = [flag for flag in _ISA_NEEDS.get(isa, ()) if flag not in cpu]
    if missing:
        raise ValueError(f"KVCLI_NATIVE_ISA={isa}: this CPU lacks {', '.join(missing)} "
                         "(/proc/cpuinfo); use native")
    return (*FLAGS, *ISA_FLAGS[isa])


def build_key(compiler: str, flags: tuple[str, ...]) -> str:
    """What the shared object is named by: every source and header, flag, the compiler's
    version and the CPU's flags."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                             timeout=30).stdout
    texts = [src.read_text() for src in (*SOURCES, *HEADERS)]
    return hashlib.sha256("\0".join([*texts, *flags, *LINK, *LIBS, version, cpu_flags()])
                          .encode()).hexdigest()[:16]


def build(compiler: str, flags: tuple[str, ...]) -> Path:
    """The shared object for ``flags``, compiled unless cached (OSError, SubprocessError)."""
    from kvcli.checkpoint.convert import remove_stale_temp_dirs
    from kvcli.paths import kernels_dir
    from kvcli.startup import removed_if_interrupted

    target = kernels_dir() / f"kvcli-kernels-{build_key(compiler, flags)}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_dirs(target.parent)
    temp = Path(tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{os.getpid()}-build-",
                                 dir=target.parent))
    try:
        with removed_if_interrupted(temp):
            objs = [temp / f"{src.stem}.o" for src in SOURCES]
            _compile_all([[compiler, "-c", *flags, str(src), "-o", str(obj)]
                          for src, obj in zip(SOURCES, objs, strict=True)])
            linked = temp / target.name
            _run([compiler, *LINK, *map(str, objs), "-o", str(linked), *LIBS])
            os.replace(linked, target)  # atomic: concurrent builders each publish a whole file
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return target


def _run(cmd: list[str]) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)


def _compile_all(cmds: list[list[str]]) -> None:
    """Each command on its own core (the compiler runs outside the GIL); the first error is
    raised once all have ended."""
    with ThreadPoolExecutor(max_workers=max(1, min(len(cmds), _cores()))) as pool:
        for done in [pool.submit(_run, cmd) for cmd in cmds]:
            done.result()


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _inputs(isa: str) -> tuple[str, ...]:
    """What a build's outcome depends on besides the files (they are in its key)."""
    from kvcli.paths import kernels_dir

    return (isa, os.environ.get("KVCLI_NATIVE", "1"), os.environ.get("CC", "cc"),
            str(kernels_dir()))


def _library(isa: str) -> Path | None:
    flags = isa_flags(isa)
    if os.environ.get("KVCLI_NATIVE", "1") == "0":
        return None
    compiler = shutil.which(os.environ.get("CC", "cc"))
    return None if compiler is None else build(compiler, flags)


def start(isa: str | None = None) -> None:
    """Build (or find) ``isa``'s kernels on a daemon thread; :func:`library_path` collects it."""
    isa = isa or os.environ.get("KVCLI_NATIVE_ISA", "native")
    key = _inputs(isa)
    with _lock:
        if key in _started or isa in _collected:
            return
        future: Future[Path | None] = Future()
        _started[key] = future

    def run() -> None:
        try:
            future.set_result(_library(isa))
        except BaseException as err:  # noqa: BLE001 - handed to library_path's caller
            future.set_exception(err)

    threading.Thread(target=run, daemon=True, name="kvcli-native-build").start()


def library_path(isa: str) -> Path | None:
    """The shared object for ``isa``, or None (no compiler, ``KVCLI_NATIVE=0``): a build
    :func:`start` began with the same inputs is waited for, else it is built here. Raises what
    the build raised (ValueError, OSError, SubprocessError)."""
    with _lock:
        future = _started.pop(_inputs(isa), None)
    path = _library(isa) if future is None else future.result()
    with _lock:
        _collected.add(isa)
    return path
