"""Tokenizing the next chunk while the current one is audited.

A tokenizer thread gains nothing here: tiktoken releases the GIL while it encodes,
but needs it back for every text, and a main thread busy with Python code hands it
over only every switch interval, so the two take turns. A forked worker process
runs truly alongside; it inherits the loaded vocabulary (no reload) and sends back
each prompt's ids as little-endian uint32 bytes, which is also the form the prefix
index and the hashing want. The fork happens before any other thread exists. A
model tokenizer (Rust `tokenizers`, not fork-safe once used) and platforms without
fork use a thread instead.
"""

from __future__ import annotations

import multiprocessing
from array import array
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

from kvcli.audit.tokenizers import AuditTokenizer, TiktokenTokenizer

_INHERITED: AuditTokenizer | None = None  # set before the fork; the worker process reads it


def encode_to_bytes(tokenizer: AuditTokenizer | None, texts: list[str], add_special_tokens: bool) -> list[bytes]:
    tok = tokenizer if tokenizer is not None else _INHERITED
    assert tok is not None, "the worker process has no tokenizer"
    return [array("I", ids).tobytes() for ids in tok.encode_batch(texts, add_special_tokens=add_special_tokens)]


class TokenizeWorker:
    __slots__ = ("_tokenizer", "_pool", "_in_process")

    def __init__(self, tokenizer: AuditTokenizer, allow_process: bool = True) -> None:
        global _INHERITED
        self._tokenizer = tokenizer
        forkable = "fork" in multiprocessing.get_all_start_methods()
        self._in_process = allow_process and forkable and isinstance(tokenizer, TiktokenTokenizer)
        self._pool: Executor
        if self._in_process:
            _INHERITED = tokenizer
            self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("fork"))
        else:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvcli-audit-tokenize")

    def submit(self, texts: list[str], add_special_tokens: bool) -> Future[list[bytes]]:
        tokenizer = None if self._in_process else self._tokenizer
        return self._pool.submit(encode_to_bytes, tokenizer, texts, add_special_tokens)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> TokenizeWorker:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
