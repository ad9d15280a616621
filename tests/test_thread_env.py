"""kvcli's thread-pool defaults: set at import, before torch loads, unless the user set them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from kvcli.bench.peer_process import peer_env

SHOW = ("import json, os, kvcli; print(json.dumps({k: os.environ.get(k) for k in "
        "('GOMP_SPINCOUNT', 'OMP_WAIT_POLICY', 'OPENBLAS_THREAD_TIMEOUT')}))")


def _env_after_import(**env: str) -> dict[str, str | None]:
    base = {k: v for k, v in os.environ.items()
            if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "OPENBLAS_THREAD_TIMEOUT")}
    out = subprocess.run([sys.executable, "-c", SHOW], env={**base, **env}, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def test_openmp_threads_spin_a_bounded_while_by_default() -> None:
    assert _env_after_import() == {"GOMP_SPINCOUNT": "30000", "OMP_WAIT_POLICY": None,
                                   "OPENBLAS_THREAD_TIMEOUT": "20"}


def test_a_users_settings_win() -> None:
    assert _env_after_import(GOMP_SPINCOUNT="5")["GOMP_SPINCOUNT"] == "5"
    # A wait policy of the user's own keeps libgomp's spin for it: no count is added.
    passive = _env_after_import(OMP_WAIT_POLICY="PASSIVE")
    assert passive["GOMP_SPINCOUNT"] is None and passive["OMP_WAIT_POLICY"] == "PASSIVE"


def test_peers_run_without_kvclis_knobs(monkeypatch) -> None:
    monkeypatch.setenv("GOMP_SPINCOUNT", "30000")
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    env = peer_env({"OMP_NUM_THREADS": "2"})
    assert "GOMP_SPINCOUNT" not in env and "OMP_WAIT_POLICY" not in env
    assert "OPENBLAS_THREAD_TIMEOUT" not in env and env["OMP_NUM_THREADS"] == "2"
