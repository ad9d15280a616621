"""Benchmark: `kvcli audit` on 10,000 chat prompts of about 2,000 tokens, against tokenizing alone.

    python -m kvcli.bench.audit_bench [--prompts N] [--tokens T] [--repeat R] [--json]

The workload is what an agent service logs: one system prompt and tool list shared
by everyone, conversations of several turns growing append-only, occasional
per-request noise (a timestamp) so rules have work to do. "tokenize" encodes the
same rendered texts in the same chunks with the tokenizer exactly as the audit
configures it; "audit" covers rendering, tokenizing (in the audit's worker process,
overlapping the rest), hashing, the prefix index, every rule and the JSON report. Each is timed R times, alternating, and the best
wall time is kept (the machine may be shared); CPU times are reported too. The
target is audit <= 1.5 x tokenize.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import resource
import sys
import time
from typing import Any

from kvcli.audit import AuditConfig, Auditor, get_profile
from kvcli.audit.records import PromptRequest
from kvcli.audit.render import render_request
from kvcli.audit.report_json import document
from kvcli.audit.tokenizers import TiktokenTokenizer

WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have from or one had by "
    "word but not what all were we when your can said there use an each which she do how their if will up "
    "other about out many then them these so some her would make like him into time has look two more write "
    "go see number no way could people my than first water been call who oil its now find long down day did "
    "get come made may part deploy server region database backup invoice request latency cache token prompt "
    "model error retry timeout memory worker queue build release health check log metric alert customer "
    "account billing plan storage bucket network certificate domain record config secret key rotate"
).split()


def sentence(rng: random.Random, n: int) -> str:
    words = [rng.choice(WORDS) for _ in range(n)]
    if rng.random() < 0.3:
        words.insert(rng.randrange(len(words)), str(rng.randrange(10_000)))
    return " ".join(words).capitalize() + rng.choice([".", ".", "?", "!"])


def paragraph(rng: random.Random, sentences: int) -> str:
    return " ".join(sentence(rng, rng.randint(6, 18)) for _ in range(sentences))


def tools(rng: random.Random) -> list[dict[str, Any]]:
    out = []
    for name in ("search_docs", "get_status", "create_ticket", "get_invoice", "run_query"):
        props = {f"arg_{i}": {"type": "string", "description": sentence(rng, 8)} for i in range(4)}
        out.append({"type": "function", "function": {"name": name, "description": paragraph(rng, 2),
                    "parameters": {"type": "object", "properties": props, "required": ["arg_0"]}}})  # fmt: skip
    return out


def workload(prompts: int, tokens: int, seed: int = 0) -> list[PromptRequest]:
    """Conversations of up to 6 turns sharing a system prompt and tools; a conversation's
    last turn is about `tokens` long (turns average about 0.8 of that)."""
    rng = random.Random(seed)
    system = paragraph(rng, 30)
    tool_list = tools(rng)
    requests: list[PromptRequest] = []
    session = 0
    while len(requests) < prompts:
        session += 1
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
        messages.append({"role": "user", "content": paragraph(rng, tokens // 70)})
        for turn in range(6):
            if len(requests) >= prompts:
                break
            body = [dict(m) for m in messages]
            if rng.random() < 0.02:  # a request stamped with the time: volatile-prefix
                body[0]["content"] = f"Now: 2025-03-14T09:{turn:02d}:{rng.randrange(60):02d}Z\n" + system
            requests.append(PromptRequest(source=f"bench:{len(requests) + 1}", id=f"r{len(requests)}",
                                          messages=body, tools=tool_list, session=f"s{session}"))  # fmt: skip
            args = json.dumps({"arg_0": sentence(rng, 4), "arg_1": str(rng.randrange(100))})
            messages.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{turn}", "type": "function", "function": {"name": "search_docs", "arguments": args}}]})  # fmt: skip
            messages.append({"role": "tool", "tool_call_id": f"c{turn}", "content": paragraph(rng, tokens // 200)})
            messages.append({"role": "user", "content": paragraph(rng, 1)})
    return requests


def time_tokenize(tokenizer: TiktokenTokenizer, texts: list[str], chunk: int) -> tuple[float, float, int]:
    wall, cpu, count = time.perf_counter(), time.process_time(), 0
    for i in range(0, len(texts), chunk):
        count += sum(map(len, tokenizer.encode_batch(texts[i : i + chunk], add_special_tokens=False)))
    return time.perf_counter() - wall, time.process_time() - cpu, count


def cpu_seconds() -> float:
    """This process's CPU time plus its finished children's (the audit's tokenizer worker)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def time_audit(requests: list[PromptRequest], tokenizer: TiktokenTokenizer, chunk: int) -> tuple[float, float, Auditor, int]:
    profile = get_profile("kvcli")
    wall, cpu = time.perf_counter(), cpu_seconds()
    auditor = Auditor(AuditConfig(profile, chunk_size=chunk, freeze_gc=True), tokenizer)
    results = list(auditor.run(requests, lambda problem: None))
    findings = [f for r in results for f in r.findings]
    report = document(tokenizer.name, profile, auditor.summary, results, findings, [])
    elapsed = time.perf_counter() - wall, cpu_seconds() - cpu
    del results, findings
    gc.unfreeze()
    gc.collect()
    return elapsed[0], elapsed[1], auditor, len(report)


def measure(prompts: int, tokens: int, chunk: int, repeat: int) -> dict[str, Any]:
    requests = workload(prompts, tokens)
    texts = [render_request(i, r).text for i, r in enumerate(requests)]
    tokenizer = TiktokenTokenizer()  # threads as the audit uses them: all cores but one
    all_cores = TiktokenTokenizer(threads=os.cpu_count() or 1)
    tok_walls, tok_cpus, audit_walls, audit_cpus = [], [], [], []
    for _ in range(repeat):
        wall, cpu, count = time_tokenize(tokenizer, texts, chunk)
        tok_walls.append(wall)
        tok_cpus.append(cpu)
        wall, cpu, auditor, report_bytes = time_audit(requests, tokenizer, chunk)
        audit_walls.append(wall)
        audit_cpus.append(cpu)
    all_cores_wall = time_tokenize(all_cores, texts, chunk)[0]
    tokenize_s, audit_s = min(tok_walls), min(audit_walls)
    return {
        "prompts": prompts, "tokens": count, "mean_tokens": round(count / prompts),
        "tokenizer_threads": tokenizer._threads, "tokenize_s": round(tokenize_s, 3),
        "audit_s": round(audit_s, 3), "ratio": round(audit_s / tokenize_s, 3),
        "tokenize_cpu_s": round(min(tok_cpus), 3), "audit_cpu_s": round(min(audit_cpus), 3),
        "cpu_ratio": round(min(audit_cpus) / min(tok_cpus), 3),
        "tokenize_all_cores_s": round(all_cores_wall, 3),
        "ratio_vs_all_cores": round(audit_s / all_cores_wall, 3),
        "hit_rate": round(auditor.summary.hit_rate, 4), "findings": sum(auditor.summary.findings.values()),
        "report_bytes": report_bytes, "index_blocks": len(auditor.index),
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "load_average": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--prompts", type=int, default=10_000)
    parser.add_argument("--tokens", type=int, default=2_000, help="approximate tokens per prompt")
    parser.add_argument("--chunk", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=2, help="timings per side; the best is kept")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    result = measure(args.prompts, args.tokens, args.chunk, max(1, args.repeat))
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>22}: {value}")
        print(f"{'target':>22}: audit <= 1.5 x tokenize -> {'met' if result['ratio'] <= 1.5 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
