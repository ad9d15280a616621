"""Benchmark: `kvcli audit` on 10,000 chat prompts of about 2,000 tokens, against tokenizing alone.

    python -m kvcli.bench.audit_bench [--prompts N] [--tokens T] [--json]

The workload is what an agent service logs: one system prompt and tool list shared
by everyone, conversations of several turns growing append-only, occasional
per-request noise (a timestamp, re-serialized arguments) so rules have work to do.
Both timings use the same rendered texts, chunking and tokenizer threads; the
audit time covers rendering, tokenizing, hashing, the prefix index, every rule
and building the JSON report. The target is audit <= 1.5 x tokenize.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import time
from typing import Any

from kvcli.audit import AuditConfig, Auditor, get_profile, load_tokenizer
from kvcli.audit.records import PromptRequest
from kvcli.audit.render import render_request
from kvcli.audit.report_json import document

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
    """Conversations sharing a system prompt and tools, each turn appending ~tokens/6."""
    rng = random.Random(seed)
    system = paragraph(rng, 40)
    tool_list = tools(rng)
    requests: list[PromptRequest] = []
    session = 0
    while len(requests) < prompts:
        session += 1
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
        messages.append({"role": "user", "content": paragraph(rng, tokens // 60)})
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
            messages.append({"role": "tool", "tool_call_id": f"c{turn}", "content": paragraph(rng, tokens // 150)})
            messages.append({"role": "user", "content": paragraph(rng, 2)})
    return requests


def measure(prompts: int, tokens: int, chunk: int) -> dict[str, Any]:
    requests = workload(prompts, tokens)
    tokenizer = load_tokenizer()
    texts = [render_request(i, r).text for i, r in enumerate(requests)]
    start = time.perf_counter()
    count = 0
    for i in range(0, len(texts), chunk):
        count += sum(map(len, tokenizer.encode_batch(texts[i : i + chunk], add_special_tokens=False)))
    tokenize_s = time.perf_counter() - start
    del texts
    profile = get_profile("kvcli")
    start = time.perf_counter()
    auditor = Auditor(AuditConfig(profile, chunk_size=chunk), tokenizer)
    results = list(auditor.run(requests, lambda problem: None))
    findings = [f for r in results for f in r.findings]
    report = document(tokenizer.name, profile, auditor.summary, results, findings, [])
    audit_s = time.perf_counter() - start
    return {
        "prompts": len(results), "tokens": count, "mean_tokens": round(count / len(results)),
        "tokenize_s": round(tokenize_s, 3), "audit_s": round(audit_s, 3),
        "ratio": round(audit_s / tokenize_s, 3), "hit_rate": round(auditor.summary.hit_rate, 4),
        "findings": len(findings), "report_bytes": len(report), "index_blocks": len(auditor.index),
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=10_000)
    parser.add_argument("--tokens", type=int, default=2_000, help="approximate tokens per prompt")
    parser.add_argument("--chunk", type=int, default=128)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    result = measure(args.prompts, args.tokens, args.chunk)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>14}: {value}")
        print(f"{'target':>14}: audit <= 1.5 x tokenize -> {'met' if result['ratio'] <= 1.5 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
