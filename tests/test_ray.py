"""``kvcli generate --ray``: the same job over Ray actors, on one machine.

One local Ray instance (2 CPUs) is shared by the module; each run starts 2 actors
holding the tiny test model. Checked: results equal a single-process run; prefix
affinity keeps every shared prefix on one worker and loses no cache hits against
one engine, while random routing measurably does; an actor killed mid-run still
gives exactly one result per request; --resume after the driver was killed
equals a clean run. Router and prediction tests, and the "no Ray" paths, run
without Ray.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from batch_fakes import FakeEngine
from click.testing import CliRunner

from kvcli.audit import predict_cached_tokens
from kvcli.cli import main
from kvcli.distributed.options import RayOptions
from kvcli.distributed.prediction import SingleEnginePrediction
from kvcli.distributed.routing import PrefixRouter, RandomRouter, routing_key
from kvcli.engine.config import EngineConfig
from kvcli.hashing import hash_token_blocks

TESTS_DIR = Path(__file__).resolve().parent
BLOCK = 16
GROUPS, PER_GROUP, PREFIX_TOKENS = 6, 4, 5 * BLOCK


def workload(groups: int = GROUPS, per_group: int = PER_GROUP, max_tokens: int = 6,
             seed: int = 1, ignore_eos: bool = False) -> list[dict[str, Any]]:
    """Interleaved requests (g0, g1, ..., g0, ...): each group shares an 80-token prefix."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, 440) for _ in range(PREFIX_TOKENS)] for _ in range(groups)]
    return [{"id": f"g{g}-{r}", "max_tokens": max_tokens, "ignore_eos": ignore_eos,
             "prompt_token_ids": prefixes[g] + [rng.randrange(3, 440) for _ in range(6)]}
            for r in range(per_group) for g in range(groups)]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def canonical(rows: list[dict[str, Any]]) -> list[str]:
    """Results without cached_tokens (it depends on what ran before), sorted by id."""
    out = []
    for r in rows:
        if "usage" in r:
            r = {**r, "usage": {k: v for k, v in r["usage"].items() if k != "cached_tokens"}}
        out.append(json.dumps(r, sort_keys=True))
    return sorted(out)


# ------------------------------------------------------------- without Ray
PLAIN = [{"id": "a", "prompt": "hello"}, {"id": "b", "prompt": "fox"}]


def test_without_ray_flag_nothing_of_ray_is_imported(tmp_path) -> None:
    script = f"""\
import sys
sys.path.insert(0, {str(TESTS_DIR)!r})
from batch_fakes import FakeEngine
import kvcli.batch.run
kvcli.batch.run.load_engine = lambda cfg: FakeEngine()
from kvcli.cli import main
try:
    main(["generate", {str(write_jsonl(tmp_path / "in.jsonl", PLAIN))!r}, "-q"])
except SystemExit as e:
    assert e.code == 0, e.code
assert not [m for m in sys.modules if m == "ray" or m.startswith("ray.")], "ray was imported"
assert "kvcli.distributed.pool" not in sys.modules
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 2


def test_missing_ray_names_the_install_command(monkeypatch, tmp_path) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    monkeypatch.setattr("kvcli.batch.run.load_engine", lambda cfg: FakeEngine())
    inp = str(write_jsonl(tmp_path / "in.jsonl", PLAIN))
    res = CliRunner().invoke(main, ["generate", inp, "--ray", "--workers", "2"])
    assert res.exit_code == 2 and "pip install 'kvcli[ray]'" in res.stderr
    res = CliRunner().invoke(main, ["generate", inp, "--workers", "2"])
    assert res.exit_code == 2 and "--workers needs --ray" in res.stderr


@dataclass
class RemoteCheckingEngine(FakeEngine):
    """Checks requests like a Ray worker does: add_request's ValueError comes back from step()."""

    rejected: list[Any] = field(default_factory=list)

    def add_request(self, request_id: str, *args: Any) -> None:
        from kvcli.batch.records import RejectedRequest

        try:
            super().add_request(request_id, *args)
        except ValueError as err:
            self.rejected.append(RejectedRequest(request_id, str(err)))

    def has_unfinished(self) -> bool:
        return bool(self.rejected) or super().has_unfinished()

    def step(self) -> list[Any]:
        rejected, self.rejected = self.rejected, []
        return [*rejected, *super().step()]


def test_a_remote_rejection_gives_the_local_error_result(monkeypatch, tmp_path) -> None:
    lines = [{"id": "ok", "prompt": "fox"}, {"id": "big", "prompt": "fox", "max_tokens": 20_000}]
    inp = str(write_jsonl(tmp_path / "in.jsonl", lines))
    outputs = []
    for engine_class in (FakeEngine, RemoteCheckingEngine):
        monkeypatch.setattr("kvcli.batch.run.load_engine", lambda cfg, c=engine_class: c())
        res = CliRunner().invoke(main, ["generate", inp, "--ordered", "-q"])
        assert res.exit_code == 1 and "in.jsonl:2 (id 'big'): max_tokens: the fake" in res.stderr
        outputs.append(res.stdout)
    assert outputs[0] == outputs[1] and '"param":"max_tokens"' in outputs[1]


def test_prefix_router_keeps_prefixes_on_one_worker_when_balanced() -> None:
    router, loads, alive = PrefixRouter(2), [0, 0], [True, True]
    chosen: dict[bytes, set[int]] = {}
    for i in range(24):  # 6 keys interleaved: new keys alternate, then stay with their owner
        key = bytes([i % 6]) * 32
        w = router.choose(key, loads, alive)
        loads[w] += 1
        chosen.setdefault(key, set()).add(w)
    assert all(len(ws) == 1 for ws in chosen.values()) and loads == [12, 12]
    assert router.spills == 0


def test_prefix_router_bounds_the_load_of_a_dominant_prefix() -> None:
    router, loads, alive = PrefixRouter(4, load_factor=1.25), [0] * 4, [True] * 4
    for _ in range(400):
        loads[router.choose(b"hot" * 11, loads, alive)] += 1
    assert max(loads) <= 1.25 * 400 / 4 + 1 and min(loads) > 0 and router.spills > 0
    loads = [0, 0, 0, 0]
    alive[router.choose(b"hot" * 11, loads, alive)] = False  # its owner died: a new owner
    assert alive[router.choose(b"hot" * 11, loads, alive)]


def test_random_router_uses_every_live_worker() -> None:
    router = RandomRouter(seed=3)
    assert {router.choose(b"k" * 32, [0] * 3, [True, False, True]) for _ in range(50)} == {0, 2}


def test_routing_key_is_the_engines_chain_hash_with_salt() -> None:
    ids = list(range(3, 3 + 5 * BLOCK))
    hashes = hash_token_blocks(ids, BLOCK, "tenant")
    assert routing_key(hashes, 4) == hash_token_blocks(ids[: 4 * BLOCK], BLOCK, "tenant")[-1]
    assert routing_key(hashes, 4) != routing_key(hash_token_blocks(ids, BLOCK), 4)
    assert routing_key(hash_token_blocks(ids[:10], BLOCK), 4) is None


def test_incremental_prediction_equals_the_audits() -> None:
    rows = workload() + workload(seed=2)[:5]
    ids = [r["prompt_token_ids"] for r in rows]
    salts = [None if i % 3 else "s" for i in range(len(ids))]
    pred = SingleEnginePrediction(BLOCK)
    mine = [pred.add(hash_token_blocks(x, BLOCK, s), len(x)) for x, s in zip(ids, salts,
                                                                               strict=True)]
    assert mine == predict_cached_tokens(ids, BLOCK, salts) and sum(mine) > 0


# ----------------------------------------------------------------- with Ray
@pytest.fixture(scope="module")
def ray_instance():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 << 20,
             logging_level="WARNING")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def model(tiny_models) -> str:
    return str(tiny_models["llama"])


class Captured:
    """The pools and routing choices of runs (wrapping kvcli.distributed.run's factories)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import kvcli.distributed.run as run

        self.pools: list[Any] = []
        self.choices: list[int] = []  # worker of each routed request, in input order
        real_build, real_router = run.build_pool, run.make_router

        def build_pool(*args: Any) -> Any:
            self.pools.append(real_build(*args))
            return self.pools[-1]

        def make_router(*args: Any) -> Any:
            router = real_router(*args)
            choose = router.choose

            def recording_choose(*a: Any) -> int:
                self.choices.append(choose(*a))
                return self.choices[-1]

            router.choose = recording_choose
            return router

        monkeypatch.setattr(run, "build_pool", build_pool)
        monkeypatch.setattr(run, "make_router", make_router)


def config(model: str, inp: Path, out: Path, **kw: Any) -> Any:
    from kvcli.batch.run import GenerateConfig

    engine = EngineConfig(model=model, num_blocks=256, max_num_seqs=1)
    return GenerateConfig(input=str(inp), output=str(out), quiet=True, token_ids=True,
                          stats_path=str(out) + ".stats", engine=engine, **kw)


def run_on_ray(model: str, inp: Path, out: Path, routing: str = "prefix", **kw: Any) -> int:
    from kvcli.distributed.run import run_generate_on_ray

    return run_generate_on_ray(config(model, inp, out, **kw), RayOptions(workers=2,
                                                                          routing=routing))


def stats_of(out: Path) -> dict[str, Any]:
    return json.loads(Path(str(out) + ".stats").read_text())


@pytest.mark.slow
def test_two_workers_equal_one_process_and_keep_prefixes_together(ray_instance, model,
                                                                   tmp_path, monkeypatch):
    from kvcli.batch.run import run_generate

    rows = workload()
    bad = {"id": "bad", "prompt_token_ids": [5, 10_000]}  # outside the vocabulary: an error line
    inp = write_jsonl(tmp_path / "in.jsonl", [*rows, bad])
    assert run_generate(config(model, inp, tmp_path / "local.jsonl")) == 1
    captured = Captured(monkeypatch)
    assert run_on_ray(model, inp, tmp_path / "ray.jsonl", ordered=True) == 1
    local, ray_rows = read_jsonl(tmp_path / "local.jsonl"), read_jsonl(tmp_path / "ray.jsonl")
    assert canonical(ray_rows) == canonical(local) and len(ray_rows) == len(rows) + 1
    assert [r["id"] for r in ray_rows] == [r["id"] for r in [*rows, bad]]  # --ordered
    assert ray_rows[-1]["error"]["param"] == "prompt_token_ids[1]"
    # Each shared prefix went to exactly one worker, and both workers got work.
    by_group: dict[str, set[int]] = {}
    for row, worker in zip(rows, captured.choices, strict=True):
        by_group.setdefault(row["id"].split("-")[0], set()).add(worker)
    assert all(len(ws) == 1 for ws in by_group.values()), by_group
    assert set(captured.choices) == {0, 1}
    # Hits within a block per request of one engine (the audit's prediction); here equal.
    stats = stats_of(tmp_path / "ray.jsonl")
    single = sum(predict_cached_tokens([r["prompt_token_ids"] for r in rows], BLOCK))
    assert stats["single_engine_cached_tokens"] == single
    assert abs(stats["cached_tokens"] - single) <= BLOCK * len(rows)
    assert stats["cached_tokens"] == sum(r["usage"]["cached_tokens"] for r in ray_rows[:-1])
    assert stats["cached_tokens"] == single
    assert [w["requests"] for w in stats["workers"]] == [12, 12]


@pytest.mark.slow
def test_random_routing_measurably_loses_hits(ray_instance, model, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", workload())
    assert run_on_ray(model, inp, tmp_path / "random.jsonl", routing="random") == 0
    stats = stats_of(tmp_path / "random.jsonl")
    # A group split over both workers computes its 80-token prefix twice.
    assert stats["cached_tokens"] <= stats["single_engine_cached_tokens"] - PREFIX_TOKENS
    assert stats["hit_rate"] < stats["single_engine_hit_rate"]


@pytest.mark.slow
def test_killed_actor_is_restarted_and_nothing_is_lost_or_doubled(ray_instance, model,
                                                                 tmp_path, monkeypatch):
    rows = workload(groups=4, per_group=8, max_tokens=48, ignore_eos=True)
    inp, out = write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    captured = Captured(monkeypatch)
    codes: list[int] = []
    job = threading.Thread(target=lambda: codes.append(
        run_on_ray(model, inp, out)), daemon=True)
    job.start()
    deadline = time.monotonic() + 300
    while not (out.exists() and out.read_bytes().count(b"\n") >= 2):
        assert job.is_alive() and time.monotonic() < deadline
        time.sleep(0.005)
    killed = captured.pools[0].slots[0]
    ray_instance.kill(killed.handle, no_restart=False)
    job.join(timeout=90)
    assert codes == [0] and killed.resent > 0  # it died with requests in its engine
    results = read_jsonl(out)
    assert sorted(r["id"] for r in results) == sorted(r["id"] for r in rows)
    assert all("error" not in r for r in results)
    assert [w["restarts"] for w in stats_of(out)["workers"]] == [1, 0]


@pytest.mark.slow
def test_resume_after_the_driver_is_killed_equals_a_clean_run(ray_instance, model, tmp_path):
    from kvcli.batch.run import run_generate

    rows = workload(groups=4, per_group=8, max_tokens=48, ignore_eos=True)
    inp, out = write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    address = ray_instance.get_runtime_context().gcs_address
    args = [sys.executable, "-m", "kvcli", "generate", str(inp), "-o", str(out), "--model", model,
            "--num-blocks", "256", "--max-num-seqs", "1", "--token-ids", "-q",
            "--ray", address, "--workers", "2"]
    proc = subprocess.Popen(args, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not (out.exists() and out.read_bytes().count(b"\n") >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=120)
    assert 3 <= out.read_bytes().count(b"\n") < len(rows)
    assert run_on_ray(model, inp, out, resume=True) == 0
    assert run_generate(config(model, inp, tmp_path / "clean.jsonl")) == 0
    assert canonical(read_jsonl(out)) == canonical(read_jsonl(tmp_path / "clean.jsonl"))


@pytest.mark.slow
def test_workers_run_the_int8_kv_cache_as_one_process_does(ray_instance, model, tmp_path):
    """--kv-cache-dtype reaches every actor's engine: its outputs equal the local int8 run's."""
    from dataclasses import replace

    from kvcli.batch.run import run_generate
    from kvcli.distributed.run import run_generate_on_ray

    inp = write_jsonl(tmp_path / "in.jsonl", workload())
    local = config(model, inp, tmp_path / "local.jsonl")
    local = replace(local, engine=replace(local.engine, kv_cache_dtype="int8"))
    assert run_generate(local) == 0
    ray_cfg = replace(local, output=str(tmp_path / "ray.jsonl"),
                      stats_path=str(tmp_path / "ray.jsonl") + ".stats")
    assert run_generate_on_ray(ray_cfg, RayOptions(workers=2)) == 0
    ray_rows = read_jsonl(tmp_path / "ray.jsonl")
    assert canonical(ray_rows) == canonical(read_jsonl(tmp_path / "local.jsonl"))
