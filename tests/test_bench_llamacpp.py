"""`kvcli bench --compare llamacpp`: llama-server as a peer, here a fake llama-server (a small
HTTP server with llama-server's command line, /health and /completion) that records what it
was sent; a real binary runs with KVCLI_LLAMACPP_SERVER=PATH (else that test is skipped)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvcli.bench.llamacpp_client import LlamaCppError, completion_request, read_answer
from kvcli.bench.llamacpp_system import context_size, server_args
from kvcli.cli import main

SMALL = ["--num-prompts", "3", "--max-tokens", "4", "--scale", "0.1", "--threads", "1",
         "--no-warmup"]

FAKE = '''#!{python}
"""A stand-in llama-server: each answer's tokens are the prompt's last id + 1, 2, ...;
a prompt whose first 4 ids were seen before counts them as cached."""
import json, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
log = open({log!r}, "a")
log.write(json.dumps({{"argv": args}}) + "\\n"); log.flush()
seen, lock = set(), threading.Lock()

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def _send(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code); self.send_header("Content-Length", str(len(data)))
        self.end_headers(); self.wfile.write(data)
    def do_GET(self):
        self._send(200 if self.path == "/health" else 404, {{"status": "ok"}})
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        log.write(json.dumps({{"body": body}}) + "\\n"); log.flush()
        prompt, n = body["prompt"], body["n_predict"]
        with lock:
            cached = 4 if tuple(prompt[:4]) in seen else 0
            seen.add(tuple(prompt[:4]))
        tokens = [(prompt[-1] + i + 1) % 400 for i in range(n)]
        self._send(200, {{"tokens": tokens, "stop": True, "timings": {{
            "prompt_n": len(prompt) - cached, "cache_n": cached, "predicted_ms": 1.0}}}})

ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


@pytest.fixture
def fake_server(tmp_path) -> tuple[Path, Path]:
    log = tmp_path / "fake.log"
    script = tmp_path / "llama-server"
    script.write_text(FAKE.format(python=sys.executable, log=str(log)))
    script.chmod(0o755)
    return script, log


def _bench(*args: str):
    return CliRunner().invoke(main, ["bench", *args], catch_exceptions=False)


def test_request_and_answer():
    body = completion_request([5, 6, 7], 4)
    assert body == {"prompt": [5, 6, 7], "n_predict": 4, "temperature": 0.0, "top_k": 1,
                    "ignore_eos": True, "cache_prompt": True, "return_tokens": True,
                    "stream": False}
    answer = {"tokens": [1, 2, 3, 4], "timings": {"prompt_n": 2, "cache_n": 1,
                                                  "predicted_ms": 300.0}}
    done = read_answer(answer, 4, elapsed_s=0.5)
    assert (done.tokens, done.prompt_n, done.cache_n) == ([1, 2, 3, 4], 2, 1)
    assert done.ttft_s == pytest.approx(0.2)  # the arrival minus the decode after token 1
    with pytest.raises(LlamaCppError, match="returned 3 token ids, asked for 4"):
        read_answer({"tokens": [1, 2, 3]}, 4, 0.1)
    with pytest.raises(LlamaCppError, match="no token ids"):
        read_answer({"content": "hi"}, 4, 0.1)
    with pytest.raises(LlamaCppError, match="boom"):
        read_answer({"error": {"message": "boom"}}, 4, 0.1)
    assert read_answer({"tokens": [1]}, 1, 0.1).ttft_s is None


def test_server_shape():
    assert context_size([[1] * 100, [2] * 50], 32) == 512  # 2 slots of 100 + 32 + 16 -> 256
    assert context_size([[1] * 300], 32) == 512
    args = server_args(Path("/x/llama-server"), Path("m.gguf"), 8080, 2, 32, 4096)
    assert args[:3] == ["/x/llama-server", "-m", "m.gguf"]
    assert args[args.index("-np") + 1] == "32" and args[args.index("-c") + 1] == "4096"
    assert args[args.index("--host") + 1] == "127.0.0.1" and "--no-kv-unified" in args


def test_bench_runs_the_fake_server(tiny_models, kvcli_home, fake_server):
    script, log = fake_server
    gguf = str(tiny_models.gguf("llama"))
    result = _bench("--workload", "shared-prefix", "--model", gguf, "--compare", "llamacpp",
                    "--llamacpp-server", str(script), "--repeat", "2", "--json", *SMALL)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    kvcli, peer = doc["systems"]
    assert peer["name"] == "llamacpp" and peer["weights"] == "quantized"
    assert peer["precision"] == "gguf weights, 8-bit activations, float16 KV"
    assert peer["exact"] is False and peer["generated_tokens"] == 12
    assert peer["agreement"]["identical_share"] is not None and "llamacpp" in doc["speedup"]
    assert peer["details"]["slots"] == 3 and peer["ttft_mean_s"] is not None
    assert kvcli["precision"].startswith("gguf weights")  # auto: the GGUF in its own types ...
    assert not (kvcli_home / "models").exists()  # ... and no float32 conversion for the bench
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    starts = [e["argv"] for e in entries if "argv" in e]
    assert len(starts) == 3  # per workload, then before each of the 2 timed runs (cold cache)
    assert all(a[a.index("-m") + 1] == gguf and a[a.index("-np") + 1] == "3" for a in starts)
    bodies = [e["body"] for e in entries if "body" in e]
    assert len(bodies) == 6 and all(b["n_predict"] == 4 and b["ignore_eos"] for b in bodies)
    # shared-prefix: after the first prompt the fake cached the others' first 4 ids
    assert peer["cached_tokens"] > 0
    assert peer["prefill_tokens_computed"] + peer["cached_tokens"] == doc["prompt_tokens"]


def test_llamacpp_needs_a_server_and_a_gguf(tiny_models, tmp_path, fake_server, kvcli_home):
    result = _bench("--workload", "decode-1", "--compare", "llamacpp", *SMALL)
    assert result.exit_code == 2 and "--llamacpp-server PATH" in result.output
    result = _bench("--workload", "decode-1", "--model", str(tiny_models["llama"]),
                    "--compare", "llamacpp", "--llamacpp-server", str(fake_server[0]), *SMALL)
    assert result.exit_code == 2 and "runs a GGUF file" in result.output
    result = _bench("--workload", "decode-1", "--model", str(tiny_models.gguf("llama")),
                    "--compare", "llamacpp", "--llamacpp-server", str(tmp_path / "nope"), *SMALL)
    assert result.exit_code == 1 and "no such executable" in result.output, result.output


@pytest.mark.skipif(not os.environ.get("KVCLI_LLAMACPP_SERVER"),
                    reason="set KVCLI_LLAMACPP_SERVER to a llama-server binary")
def test_a_real_llama_server(tiny_models, kvcli_home):
    """llama.cpp on the tiny float32 GGUF: its answers parse, and being float32 weights its
    greedy tokens mostly follow kvcli's."""
    result = _bench("--workload", "distinct", "--model", str(tiny_models.gguf("llama")),
                    "--compare", "llamacpp", "--json", *SMALL)
    assert result.exit_code == 0, result.output
    peer = json.loads(result.stdout)["systems"][1]
    assert peer["generated_tokens"] == 12 and peer["prefill_tokens_computed"] is not None
