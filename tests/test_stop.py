"""Stopping rules (torch-free): EOS, stop ids, stop strings across tokens, length limits."""

from __future__ import annotations

from kvcli.engine.request import Request, RequestStatus
from kvcli.engine.stop import check_stop, final_text
from kvcli.sampling_params import SamplingParams

VOCAB = {i: chr(ord("a") + i) for i in range(26)} | {26: " ", 27: "EN", 28: "D", 29: "!"}


def decode(ids: list[int]) -> str:
    return "".join(VOCAB[i] for i in ids)


def run(params: SamplingParams, tokens: list[int], eos=(29,)) -> tuple[Request, RequestStatus | None]:
    req = Request("r", [0, 1], params, eos_token_ids=eos)
    status = None
    for t in tokens:
        req.append_output_token(t)
        status = check_stop(req, 1000, decode)
        if status is not None:
            break
    return req, status


def test_stop_string_split_across_tokens_is_found_and_cut_from_the_text():
    req, status = run(SamplingParams(max_tokens=100, stop=["END"]), [7, 8, 26, 27, 28, 0, 1])
    assert status is RequestStatus.FINISHED_STOPPED and req.stop_reason == "END"
    assert req.num_output_tokens == 5  # stopped at the token that completed "END"
    assert final_text(req, decode) == "hi "


def test_stop_string_far_into_a_long_output_is_still_found():
    tokens = [i % 26 for i in range(500)] + [27, 28]
    req, status = run(SamplingParams(max_tokens=1000, stop=["END"]), tokens)
    assert status is RequestStatus.FINISHED_STOPPED and req.num_output_tokens == 502


def test_eos_and_stop_ids_and_length():
    _, status = run(SamplingParams(max_tokens=10), [3, 29])
    assert status is RequestStatus.FINISHED_STOPPED
    req, status = run(SamplingParams(max_tokens=10, ignore_eos=True), [3, 29, 4])
    assert status is None and req.num_output_tokens == 3
    req, status = run(SamplingParams(max_tokens=10, stop_token_ids=[4]), [3, 4])
    assert status is RequestStatus.FINISHED_STOPPED and req.stop_reason == 4
    req, status = run(SamplingParams(max_tokens=3), [3, 3, 3])
    assert status is RequestStatus.FINISHED_LENGTH
