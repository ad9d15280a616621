"""Scheduler unit tests: plain Python, no torch, milliseconds."""

from __future__ import annotations

import subprocess
import sys

from kvcli.engine.kv_cache import KVCacheManager
from kvcli.engine.request import Request, RequestStatus
from kvcli.engine.scheduler import Scheduler, SchedulerConfig
from kvcli.sampling_params import SamplingParams

BS = 4


def make(rid: str, n: int, start: int = 0, max_tokens: int = 8) -> Request:
    return Request(rid, list(range(start, start + n)), SamplingParams(max_tokens=max_tokens),
                   block_size=BS)


def sched(blocks: int = 64, budget: int = 32, seqs: int = 8, policy: str = "fcfs") -> Scheduler:
    return Scheduler(SchedulerConfig(budget, seqs, 512, policy), KVCacheManager(blocks, BS))


def step(s: Scheduler, sample: bool = True) -> list[tuple[str, int]]:
    """Schedule, pretend the forward ran, append a token to rows that completed."""
    out = s.schedule()
    s.update_after_step(out)
    for r in out.requests:
        if sample and r.num_computed_tokens == r.num_tokens:
            r.append_output_token(7)
    return [(r.request_id, n) for r, n in zip(out.requests, out.num_new_tokens, strict=True)]


def test_scheduler_and_cache_manager_do_not_import_torch():
    code = ("import sys, kvcli.engine.scheduler, kvcli.engine.kv_cache, kvcli.engine.request;"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_chunked_prefill_splits_a_long_prompt_across_steps():
    s = sched(budget=10)
    s.add_request(make("a", 25))
    assert step(s) == [("a", 10)]
    assert step(s) == [("a", 10)]
    assert step(s) == [("a", 5)]
    assert step(s) == [("a", 1)]  # decode


def test_running_first_then_waiting_within_budget():
    s = sched(budget=12)
    s.add_request(make("a", 6))
    assert step(s) == [("a", 6)]
    s.add_request(make("b", 20, start=100))
    assert step(s) == [("a", 1), ("b", 11)]  # decode first, then a chunk of b


def test_max_num_seqs_caps_admission():
    s = sched(seqs=2)
    for i in range(3):
        s.add_request(make(str(i), 4, start=10 * i))
    assert [rid for rid, _ in step(s)] == ["0", "1"]
    assert len(s.waiting) == 1


def test_preempts_newest_when_blocks_run_out_and_recomputes():
    s = sched(blocks=4, budget=64)
    s.add_request(make("a", 8))  # 2 blocks
    s.add_request(make("b", 7, start=50))  # 2 blocks: pool is full
    assert step(s) == [("a", 8), ("b", 7)]
    step(s)  # b decodes into its 2nd block's last slot; a needs a 3rd block -> preempt b
    assert s.num_preemptions == 1
    b = next(r for r in s.waiting)
    assert b.request_id == "b" and b.status is RequestStatus.PREEMPTED
    assert b.num_computed_tokens == 0 and b.num_preemptions == 1
    s.finish(s.running[0], RequestStatus.FINISHED_LENGTH)
    ids = step(s)
    assert ids[0][0] == "b"  # readmitted and recomputed (prompt + its output so far)


def test_cache_aware_groups_requests_sharing_a_prefix():
    s = sched(seqs=1, policy="cache-aware")
    s.add_request(make("x1", 8, start=0))
    s.add_request(make("y", 8, start=100))
    s.add_request(make("x2", 9, start=0))
    order = []
    while s.has_unfinished():
        for r in list(s.running):
            s.finish(r, RequestStatus.FINISHED_LENGTH)
        order += [rid for rid, _ in step(s, sample=False)]
    assert order == ["x1", "x2", "y"]


def test_same_step_admission_hits_blocks_registered_by_an_earlier_request():
    s = sched()
    s.add_request(make("a", 12))
    s.add_request(make("b", 12))  # identical prompt, same step
    assert step(s) == [("a", 12), ("b", 4)]  # b computes only its last block (cap)
    assert s.kv_cache.stats.hits == 8
