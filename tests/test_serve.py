"""`kvcli serve` through the official openai SDK: real server processes on loopback, a tiny model.

Upload, create, poll, download (each line validated with the SDK's own types), pagination,
validation failures with their line numbers, limits, 401s, FIFO queueing, cancel, and a
server killed with SIGKILL mid-batch that a restart finishes with every custom_id once.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import openai
import pytest
from openai.types import Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion
from serve_process import MODEL, ServeProcess, batch_line, write_jsonl

KEY = "sk-test-" + "7" * 24
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["category", "urgent"],
          "properties": {"category": {"enum": ["shipping", "billing"]},
                         "urgent": {"type": "boolean"}}}
FINAL = ("completed", "failed", "cancelled", "expired")


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    # --max-num-seqs 2: a long batch runs long enough to be cancelled part-way.
    proc = ServeProcess(tiny_models["llama"], tmp_path_factory.mktemp("serve") / "data",
                        "--max-file-bytes", "256KB", "--max-lines", "400", "--max-num-seqs", "2",
                        "-q", api_key=KEY).start()
    yield proc
    proc.stop()


@pytest.fixture
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0)


def wait(client: openai.OpenAI, batch_id: str, until=lambda b: b.status in FINAL,
         timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if until(batch):
            return batch
        time.sleep(0.1)
    raise AssertionError(f"batch {batch_id} still {batch.status}: {batch.request_counts}")


def run(client, tmp_path: Path, rows: list, endpoint="/v1/chat/completions", **kw):
    path = write_jsonl(tmp_path / f"in-{time.monotonic_ns()}.jsonl", rows)
    with open(path, "rb") as f:
        uploaded = client.files.create(file=f, purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=endpoint,
                                  completion_window="24h", **kw)
    return wait(client, batch.id)


def lines_of(client, file_id: str | None) -> list[dict]:
    return [] if file_id is None else \
        [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def test_chat_batch_round_trip(client, tmp_path) -> None:
    rows = [batch_line(f"chat-{i}", max_tokens=5 + i % 3) for i in range(6)]
    rows.append(batch_line("bad-field", temperature=-1))  # the engine refuses: a line error
    rows.append(batch_line("schema", max_tokens=60, response_format={
        "type": "json_schema", "json_schema": {"name": "ticket", "schema": SCHEMA}}))
    batch = run(client, tmp_path, rows, metadata={"job": "nightly"})
    assert batch.status == "completed", batch
    assert batch.model == MODEL and batch.metadata == {"job": "nightly"}
    assert batch.request_counts.model_dump() == {"total": 8, "completed": 7, "failed": 1}
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at
    out = lines_of(client, batch.output_file_id)
    assert sorted(r["custom_id"] for r in out) == sorted([*(f"chat-{i}" for i in range(6)),
                                                          "schema"])
    prompt = completion = 0
    for row in out:
        body = ChatCompletion.model_validate(row["response"]["body"])
        assert row["response"]["status_code"] == 200 and row["error"] is None
        assert body.model == MODEL and body.choices[0].message.role == "assistant"
        prompt += body.usage.prompt_tokens
        completion += body.usage.completion_tokens
    assert batch.usage.input_tokens == prompt and batch.usage.output_tokens == completion
    constrained = next(r for r in out if r["custom_id"] == "schema")["response"]["body"]
    if constrained["choices"][0]["finish_reason"] == "stop":  # structured outputs as generate's
        jsonschema.validate(json.loads(constrained["choices"][0]["message"]["content"]), SCHEMA)
    assert batch.usage.input_tokens_details.cached_tokens >= 0
    errors = lines_of(client, batch.error_file_id)
    assert [(e["custom_id"], e["response"]) for e in errors] == [("bad-field", None)]
    assert "temperature" in errors[0]["error"]["message"]
    assert client.files.retrieve(batch.output_file_id).purpose == "batch_output"


def test_completions_batch(client, tmp_path) -> None:
    rows = [batch_line(f"c{i}", "/v1/completions", max_tokens=4) for i in range(3)]
    batch = run(client, tmp_path, rows, endpoint="/v1/completions")
    assert batch.status == "completed" and batch.error_file_id is None
    for row in lines_of(client, batch.output_file_id):
        body = Completion.model_validate(row["response"]["body"])
        assert body.object == "text_completion" and body.usage.completion_tokens == 4


def test_embeddings_batch(client, tmp_path) -> None:
    rows = [{"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
             "body": {"model": MODEL, "input": ["Instruct: retrieve\nQuery: the fox", f"x {i}"]}}
            for i in range(3)]
    batch = run(client, tmp_path, rows, endpoint="/v1/embeddings")
    assert batch.status == "completed" and batch.error_file_id is None
    prompt = 0
    for row in lines_of(client, batch.output_file_id):
        body = CreateEmbeddingResponse.model_validate(row["response"]["body"])
        assert [d.index for d in body.data] == [0, 1] and len(body.data[0].embedding) == 64
        prompt += body.usage.prompt_tokens
    assert batch.usage.input_tokens == prompt and batch.usage.output_tokens == 0


def test_validation_failures_name_their_lines(client, tmp_path) -> None:
    rows = [batch_line("a"), batch_line("a"), batch_line("b", "/v1/completions"),
            '{"custom_id": "c", "method": "POST",', batch_line("d", model="gpt-4o"),
            batch_line("ok")]
    batch = run(client, tmp_path, rows)
    assert batch.status == "failed" and batch.failed_at and batch.output_file_id is None
    got = {(e.line, e.code) for e in batch.errors.data}
    assert got == {(2, "duplicate_custom_id"), (3, "mismatched_endpoint"),
                   (4, "invalid_json_line"), (5, "model_not_found")}


def test_limits(server, client, tmp_path) -> None:
    too_many = run(client, tmp_path, [batch_line(f"r{i}") for i in range(401)])
    assert too_many.status == "failed"
    assert too_many.errors.data[0].code == "too_many_requests"
    big = write_jsonl(tmp_path / "big.jsonl", [batch_line("x", prompt_pad="y" * 300_000)])
    with pytest.raises(openai.APIStatusError) as err, open(big, "rb") as f:
        client.files.create(file=f, purpose="batch")
    assert err.value.status_code == 413
    assert not list((server.data_dir / "tmp").iterdir())  # nothing of it kept


def test_files_endpoints_and_pagination(client, tmp_path) -> None:
    ids = []
    for i in range(3):
        with open(write_jsonl(tmp_path / f"f{i}.jsonl", [batch_line(f"p{i}")]), "rb") as f:
            ids.append(client.files.create(file=f, purpose="batch").id)
    assert client.files.retrieve(ids[0]).filename == "f0.jsonl"
    assert json.loads(client.files.content(ids[1]).text)["custom_id"] == "p1"
    first = client.files.list(limit=2)
    assert [f.id for f in first.data] == ids[:0:-1] and first.has_more
    assert client.files.list(limit=2, after=ids[1]).data[0].id == ids[0]
    assert client.files.delete(ids[2]).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(ids[2])
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve("../kvcli.db")
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id=ids[2], endpoint="/v1/chat/completions",
                              completion_window="24h")


def test_wrong_or_missing_key_is_401(server) -> None:
    for key in ("sk-wrong", KEY[:-1]):
        bad = openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0)
        with pytest.raises(openai.AuthenticationError) as err:
            bad.models.list()
        assert err.value.status_code == 401 and err.value.code == "invalid_api_key"
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as raw:
        urllib.request.urlopen(f"{server.base_url}/batches", timeout=10)
    assert raw.value.code == 401 and "error" in json.loads(raw.value.read())


def test_one_server_per_data_dir(server) -> None:
    res = subprocess.run([sys.executable, "-m", "kvcli", "serve", "--data-dir",
                          str(server.data_dir), "--port", "0"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and "in use by another kvcli serve" in res.stderr


def test_two_batches_run_in_order(client, tmp_path) -> None:
    created = []
    for n in range(2):
        path = write_jsonl(tmp_path / f"q{n}.jsonl",
                           [batch_line(f"q{n}-{i}", max_tokens=8) for i in range(8)])
        with open(path, "rb") as f:
            file_id = client.files.create(file=f, purpose="batch").id
        created.append(client.batches.create(input_file_id=file_id, completion_window="24h",
                                             endpoint="/v1/chat/completions"))
    first, second = (wait(client, b.id) for b in created)
    assert first.status == second.status == "completed"
    assert second.in_progress_at >= first.completed_at
    page = client.batches.list(limit=1)
    assert page.data[0].id == second.id and page.has_more
    assert client.batches.list(limit=1, after=second.id).data[0].id == first.id


def test_cancel_keeps_finished_lines(client, tmp_path) -> None:
    rows = [batch_line(f"long-{i}", max_tokens=48, ignore_eos=True) for i in range(200)]
    path = write_jsonl(tmp_path / "long.jsonl", rows)
    with open(path, "rb") as f:
        file_id = client.files.create(file=f, purpose="batch").id
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    with open(write_jsonl(tmp_path / "queued.jsonl", [batch_line("w")]), "rb") as f:
        queued = client.batches.create(input_file_id=client.files.create(file=f, purpose="batch").id,
                                       endpoint="/v1/chat/completions", completion_window="24h")
    wait(client, batch.id, lambda b: b.request_counts.completed >= 2)
    assert client.batches.retrieve(queued.id).status == "validating"  # waits its turn (FIFO)
    gone = client.batches.cancel(queued.id)  # never started: cancelled at once
    assert gone.status == "cancelled" and gone.in_progress_at is None and not gone.output_file_id
    assert client.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    done = wait(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at and done.cancelling_at
    out = lines_of(client, done.output_file_id)
    ids = [r["custom_id"] for r in out]
    assert 2 <= len(ids) < 200 and len(set(ids)) == len(ids)
    assert done.request_counts.completed == len(ids) and done.request_counts.total == 200
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(run(client, tmp_path, [batch_line("z")]).id)


def test_sigkill_mid_batch_then_restart_finishes_each_id_once(tiny_models, tmp_path) -> None:
    """Killed with SIGKILL, restarted, stopped with SIGTERM (graceful), restarted: done once."""
    data = tmp_path / "data"
    proc = ServeProcess(tiny_models["llama"], data, "--max-num-seqs", "2", "-q").start()
    # Enough steps that the batch outlasts the restart's first completions and the SIGTERM.
    total, tokens = 90, 128
    try:
        client = openai.OpenAI(base_url=proc.base_url, api_key="unused", max_retries=0)
        rows = [batch_line(f"k{i}", max_tokens=tokens, ignore_eos=True) for i in range(total)]
        with open(write_jsonl(tmp_path / "kill.jsonl", rows), "rb") as f:
            file_id = client.files.create(file=f, purpose="batch").id
        batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
        seen = wait(client, batch.id, lambda b: b.request_counts.completed >= 5)
        proc.kill()
        assert seen.status == "in_progress" and seen.request_counts.completed < total - 10, \
            "the batch was nearly done before the kill"
        proc.start()
        client = openai.OpenAI(base_url=proc.base_url, api_key="unused", max_retries=0)
        wait(client, batch.id,
             lambda b: b.request_counts.completed >= seen.request_counts.completed + 10)
        proc.stop()  # SIGTERM: the step in flight ends, the batch stays in_progress
        # uvicorn re-raises the signal once it has shut down (the worker first, then the app).
        assert proc.proc.returncode == -signal.SIGTERM
        status, counted, written = stored_state(proc, batch.id)
        assert status == "in_progress" and counted == written < total - 5  # the last count too
        proc.start()
        done = wait(client, batch.id)
        assert done.status == "completed" and done.error_file_id is None
        assert done.request_counts.model_dump() == {"total": total, "completed": total,
                                                    "failed": 0}
        out = lines_of(client, done.output_file_id)
        assert sorted(r["custom_id"] for r in out) == sorted(f"k{i}" for i in range(total))
        for row in out:
            ChatCompletion.model_validate(row["response"]["body"])
        assert done.usage.output_tokens == tokens * total
    finally:
        proc.stop()


def test_expired_batch_keeps_its_answers_and_fails_the_rest(tiny_models, tmp_path) -> None:
    proc = ServeProcess(tiny_models["llama"], tmp_path / "data", "--expire-after", "3s",
                        "--max-num-seqs", "1", "-q").start()
    try:
        client = openai.OpenAI(base_url=proc.base_url, api_key="unused", max_retries=0)
        # Far more work than 3 s of this machine (150 x 64 tokens all finished in 3 s on a
        # quiet Xeon): the batch must expire whatever the CPU, and expiring costs no more.
        n = 1000
        rows = [batch_line(f"e{i}", max_tokens=128, ignore_eos=True) for i in range(n)]
        batch = run(client, tmp_path, rows)
        assert batch.status == "expired" and batch.expired_at
        answered = [r["custom_id"] for r in lines_of(client, batch.output_file_id)]
        expired = lines_of(client, batch.error_file_id)
        assert {e["error"]["code"] for e in expired} == {"batch_expired"}
        ids = answered + [e["custom_id"] for e in expired]
        assert sorted(ids) == sorted(f"e{i}" for i in range(n)) and expired
        assert batch.request_counts.model_dump() == {"total": n, "completed": len(answered),
                                                     "failed": len(expired)}
    finally:
        proc.stop()


def test_files_past_their_retention_are_deleted(tiny_models, tmp_path) -> None:
    proc = ServeProcess(tiny_models["llama"], tmp_path / "data", "--file-retention", "2s",
                        "-q").start()
    try:
        client = openai.OpenAI(base_url=proc.base_url, api_key="unused", max_retries=0)
        with open(write_jsonl(tmp_path / "r.jsonl", [batch_line("r")]), "rb") as f:
            uploaded = client.files.create(file=f, purpose="batch")
        assert uploaded.expires_at == uploaded.created_at + 2
        assert (tmp_path / "data" / "files" / uploaded.id).exists()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                client.files.retrieve(uploaded.id)
            except openai.NotFoundError:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the file outlived its retention")
        assert not (tmp_path / "data" / "files" / uploaded.id).exists()
    finally:
        proc.stop()


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


@pytest.fixture(scope="module")
def open_server(tiny_models, tmp_path_factory):
    """No key (loopback), the tiny model under the default model's name, a small KV pool."""
    proc = ServeProcess(tiny_models["llama"], tmp_path_factory.mktemp("open") / "data",
                        "--kv-cache-memory", "32MiB", "-q", name="smollm2-135m").start()
    yield proc
    proc.stop()


def test_readme_example_runs_as_written(open_server, tmp_path) -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme[readme.index("## Serve: the OpenAI Batch API"):]
    code = section[section.index("```python\n") + 10:section.index("\n```\n", section.index("```python"))]
    assert 'base_url="http://127.0.0.1:8000/v1"' in code
    code = code.replace("127.0.0.1:8000", f"127.0.0.1:{open_server.port}")  # only the port
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("completed") and "completed=2" in lines[0]
    # The random model's replies may hold newlines: each answer starts a line with its id.
    assert {line.split(" ", 1)[0] for line in lines[1:]} >= {"q0", "q1"}


def test_ten_thousand_lines(open_server, tmp_path) -> None:
    """A 10,000-line batch completes with each id once; the peak RSS is printed (-s) and bounded
    loosely (the engine's and tokenizer's caches grow with distinct prompts, not the server)."""
    n = 10_000
    client = openai.OpenAI(base_url=open_server.base_url, api_key="unused", max_retries=0)
    before = _peak_rss_kib(open_server.proc.pid)
    rows = [batch_line(f"t{i}", max_tokens=1, model="smollm2-135m") for i in range(n)]
    batch = run(client, tmp_path, rows)
    peak = _peak_rss_kib(open_server.proc.pid)
    print(f"10,000-line batch: server peak RSS {peak / 1024:.0f} MiB "
          f"({before / 1024:.0f} MiB before it)")
    assert batch.status == "completed" and batch.request_counts.completed == n
    ids = [r["custom_id"] for r in lines_of(client, batch.output_file_id)]
    assert len(ids) == n and len(set(ids)) == n
    assert peak - before < 1 << 20  # KiB: 1 GiB; it takes ~120-250 MiB here


def stored_state(proc: ServeProcess, batch_id: str) -> tuple[str, int, int]:
    """A stopped server's record of a batch: status, completed count, lines in its output."""
    with sqlite3.connect(proc.data_dir / "kvcli.db") as db:
        data, private = db.execute("SELECT data, private FROM batches WHERE id = ?",
                                   (batch_id,)).fetchone()
    obj, out = json.loads(data), proc.data_dir / "files" / json.loads(private)["output_file_id"]
    return obj["status"], obj["request_counts"]["completed"], len(out.read_bytes().splitlines())


def test_non_loopback_host_needs_a_key() -> None:
    from click.testing import CliRunner

    from kvcli.cli import main

    res = CliRunner().invoke(main, ["serve", "--host", "0.0.0.0"], env={"KVCLI_API_KEY": ""})
    assert res.exit_code == 2 and "--api-key" in res.output


def test_help_imports_neither_the_web_stack_nor_torch() -> None:
    code = ("import sys\nfrom click.testing import CliRunner\nfrom kvcli.cli import main\n"
            "for args in (['--help'], ['serve', '--help'], ['audit', '--help']):\n"
            "    assert CliRunner().invoke(main, args).exit_code == 0\n"
            "heavy = {'torch', 'starlette', 'uvicorn', 'python_multipart'} & set(sys.modules)\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
