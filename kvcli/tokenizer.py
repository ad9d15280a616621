"""A torch-free tokenizer for a model directory: `tokenizers` plus the chat template.

It reads the files transformers writes with save_pretrained (tokenizer.json,
tokenizer_config.json, chat_template.jinja, generation_config.json) and gives
the same ids, text and chat prompts as transformers' fast tokenizer, without
importing transformers or torch, so `kvcli audit` and the engine's input side
stay light.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from kvcli.detokenizer import IncrementalDetokenizer

__all__ = ["IncrementalDetokenizer", "Tokenizer", "TokenizerError", "read_json"]

SPECIAL_TOKEN_NAMES = (
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
)  # fmt: skip
_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


class TokenizerError(ValueError):
    """A model directory's tokenizer files are missing or malformed."""


def read_json(path: Path) -> dict[str, Any]:
    """Parse a JSON object file; errors name the file, line and column."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise TokenizerError(f"{path}:{err.lineno}:{err.colno}: invalid JSON: {err.msg}") from err
    if not isinstance(data, dict):
        raise TokenizerError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _token_content(value: Any) -> str | None:
    """A special token as tokenizer_config.json spells it: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _as_id_list(value: Any) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _model_eos_ids(directory: Path) -> list[int]:
    """The stop ids generation uses: generation_config.json's, else config.json's."""
    for name in ("generation_config.json", "config.json"):
        path = directory / name
        if path.is_file():
            ids = _as_id_list(read_json(path).get("eos_token_id"))
            if ids:
                return ids
    return []


def _chat_templates(directory: Path, config: Mapping[str, Any]) -> dict[str, str]:
    """Named chat templates; template files win over tokenizer_config.json, as in transformers."""
    templates: dict[str, str] = {}
    if (directory / "chat_template.jinja").is_file():
        templates["default"] = (directory / "chat_template.jinja").read_text(encoding="utf-8")
    extra = directory / "additional_chat_templates"
    if extra.is_dir():
        for file in sorted(extra.glob("*.jinja")):
            templates[file.stem] = file.read_text(encoding="utf-8")
    if templates:
        return templates
    raw = config.get("chat_template")
    if raw is None and (directory / "chat_template.json").is_file():
        raw = read_json(directory / "chat_template.json").get("chat_template")
    if isinstance(raw, str):
        return {"default": raw}
    if isinstance(raw, list):
        return {item["name"]: item["template"] for item in raw if isinstance(item, Mapping)}
    return {}


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's byte-to-printable-character table used by byte-level BPE."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), 256),
    ]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(char): byte for byte, char in zip(printable, chars, strict=True)}


class Tokenizer:
    """Encode, decode and render chat prompts for one model directory."""

    __slots__ = (
        "_backend",
        "_special",
        "_templates",
        "_model_eos",
        "_clean_up",
        "_byte_level",
        "name",
    )

    def __init__(
        self,
        backend: Any,
        *,
        special_tokens: Mapping[str, str] | None = None,
        chat_templates: Mapping[str, str] | None = None,
        model_eos_ids: Sequence[int] = (),
        clean_up_spaces: bool = False,
        name: str = "",
    ) -> None:
        self._backend = backend
        self._special = dict(special_tokens or {})
        self._templates = dict(chat_templates or {})
        self._model_eos = tuple(model_eos_ids)
        # transformers skips this clean-up for BPE models (it would corrupt them).
        self._clean_up = clean_up_spaces and type(backend.model).__name__ != "BPE"
        self._byte_level = b'"ByteLevel"' in (
            backend.decoder.__getstate__() if backend.decoder else b""
        )
        self.name = name

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Load tokenizer.json and its companions from a Hugging Face model directory."""
        from tokenizers import AddedToken
        from tokenizers import Tokenizer as Backend

        directory = Path(path)
        file = directory / "tokenizer.json"
        if not file.is_file():
            raise TokenizerError(
                f"{directory}: no tokenizer.json (kvcli needs the fast-tokenizer file that "
                "transformers' save_pretrained writes)"
            )
        try:
            backend = Backend.from_file(str(file))
        except Exception as err:  # the Rust side raises a bare Exception
            raise TokenizerError(f"{file}: cannot load tokenizer: {err}") from err
        config_file = directory / "tokenizer_config.json"
        config = read_json(config_file) if config_file.is_file() else {}
        legacy_map = directory / "special_tokens_map.json"
        fallback = read_json(legacy_map) if legacy_map.is_file() else {}
        special = {}
        for name in SPECIAL_TOKEN_NAMES:
            content = _token_content(config.get(name, fallback.get(name)))
            if content is not None:
                special[name] = content
        # Like transformers, a named special token absent from the vocabulary is added.
        missing = [t for t in special.values() if backend.token_to_id(t) is None]
        if missing:
            backend.add_special_tokens(
                [AddedToken(t, special=True, normalized=False) for t in missing]
            )
        backend.encode_special_tokens = bool(config.get("split_special_tokens", False))
        return cls(
            backend,
            special_tokens=special,
            chat_templates=_chat_templates(directory, config),
            model_eos_ids=_model_eos_ids(directory),
            clean_up_spaces=bool(config.get("clean_up_tokenization_spaces", False)),
            name=str(directory),
        )

    # ---- ids and text -------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(
        self, texts: Sequence[str], add_special_tokens: bool = True
    ) -> list[list[int]]:
        encodings = self._backend.encode_batch_fast(
            list(texts), add_special_tokens=add_special_tokens
        )
        return [encoding.ids for encoding in encodings]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        text = self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return _clean_up_tokenization(text) if self._clean_up else text

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._backend.id_to_token(token_id)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes one token stands for (special tokens: their text)."""
        token = self._backend.id_to_token(token_id)
        if token is None:
            raise ValueError(
                f"token_id: {token_id} is outside the vocabulary (size {self.vocab_size})"
            )
        if token_id in self._backend.get_added_tokens_decoder():
            return token.encode("utf-8")
        if self._byte_level:
            table = _unicode_to_byte()
            return bytes(table[char] for char in token)
        match = _BYTE_TOKEN.match(token)
        if match:  # sentencepiece byte fallback, e.g. <0xE6>
            return bytes([int(match.group(1), 16)])
        return token.replace("\u2581", " ").encode("utf-8")

    # ---- special tokens -----------------------------------------------------
    @property
    def special_tokens(self) -> dict[str, str]:
        """Named special tokens (bos_token, eos_token, ...) as their text."""
        return dict(self._special)

    @property
    def all_special_ids(self) -> frozenset[int]:
        added = self._backend.get_added_tokens_decoder()
        return frozenset(token_id for token_id, token in added.items() if token.special)

    @property
    def bos_token_id(self) -> int | None:
        bos = self._special.get("bos_token")
        return None if bos is None else self._backend.token_to_id(bos)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Ids that end generation: generation_config's eos ids, then the tokenizer's eos."""
        ids = list(self._model_eos)
        eos = self._special.get("eos_token")
        eos_id = None if eos is None else self._backend.token_to_id(eos)
        if eos_id is not None:
            ids.append(eos_id)
        return tuple(dict.fromkeys(ids))

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce, added tokens included."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    # ---- chat ---------------------------------------------------------------
    @property
    def chat_template(self) -> str | None:
        """The default chat template, or None when the model has none."""
        return self._templates.get("default") or (
            next(iter(self._templates.values())) if len(self._templates) == 1 else None
        )

    def set_chat_template(self, template: str) -> None:
        """Use ``template`` for every chat prompt instead of the model's own (all of them,
        named ones included, as vLLM's ``--chat-template`` does)."""
        self._templates = {"default": template}

    def _select_template(self, chat_template: str | None, has_tools: bool) -> str:
        if chat_template is not None:
            return self._templates.get(chat_template, chat_template)
        if not self._templates:
            raise TokenizerError(
                f"{self.name or 'tokenizer'}: the model has no chat template (no chat_template.jinja "
                "and no chat_template in tokenizer_config.json); give a raw prompt instead of messages"
            )
        if has_tools and "tool_use" in self._templates:
            return self._templates["tool_use"]
        template = self.chat_template
        if template is None:
            raise TokenizerError(
                f"{self.name or 'tokenizer'}: several chat templates and no default: "
                f"{', '.join(sorted(self._templates))}"
            )
        return template

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        **template_kwargs: Any,
    ) -> str:
        """The prompt text, exactly as transformers' apply_chat_template(tokenize=False)."""
        from kvcli.chat_template import render_chat  # jinja2: ~50 ms, only for chat prompts

        template = self._select_template(chat_template, tools is not None)
        return render_chat(
            template,
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            special_tokens=self._special,
            **template_kwargs,
        )


def _clean_up_tokenization(text: str) -> str:
    """transformers' clean_up_tokenization (for WordPiece-style vocabularies)."""
    for before, after in (
        (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
        (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"),
    ):  # fmt: skip
        text = text.replace(before, after)
    return text
