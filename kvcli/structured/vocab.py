"""The model's vocabulary as xgrammar sees it, built from kvcli's torch-free tokenizer.

The same reading of the vocabulary as ``xgrammar.TokenizerInfo.from_huggingface`` (token
strings in their encoded form, the vocabulary type, whether the tokenizer prepends a
space), with two deliberate differences:

* special tokens (``<|im_start|>``, ``<s>``...) are given as empty strings, which xgrammar
  treats as never allowed: kvcli's output text skips special tokens, so a grammar that
  accepted one as literal text would validate text the user never sees;
* the mask covers the model's logits (``vocab_size`` may exceed the tokenizer's: padding
  rows of the output layer), and ids without a token are never allowed.
"""

from __future__ import annotations

from typing import Any

# Byte-fallback vocabularies (Llama 2, Mistral) spell raw bytes as <0x00>..<0xFF>.
_MIN_BYTE_PIECES = 128


def encoded_vocab(tokenizer: Any, vocab_size: int) -> list[str]:
    """Token strings by id, ``vocab_size`` long; "" for special tokens and for ids with none."""
    special = tokenizer.all_special_ids
    out = []
    for token_id in range(vocab_size):
        token = None if token_id in special else tokenizer.id_to_token(token_id)
        out.append(token or "")
    return out


def vocab_type_name(tokenizer: Any, vocab: list[str]) -> str:
    """``BYTE_LEVEL`` (GPT-2 style), ``BYTE_FALLBACK`` (SentencePiece style) or ``RAW``."""
    pieces = set(vocab)
    if sum(f"<0x{b:02X}>" in pieces for b in range(256)) >= _MIN_BYTE_PIECES:
        return "BYTE_FALLBACK"
    space = tokenizer.encode(" ", add_special_tokens=False)
    if space and tokenizer.id_to_token(space[0]) == "\u0120":  # "Ġ": byte-level's space
        return "BYTE_LEVEL"
    return "RAW"


def adds_prefix_space(tokenizer: Any, vocab_type: str) -> bool:
    """Does encoding "a" give a first token with a leading space marker ("▁a" / "Ġa")?"""
    ids = tokenizer.encode("a", add_special_tokens=False)
    token = tokenizer.id_to_token(ids[0]) if ids else None
    marker = "\u2581" if vocab_type == "BYTE_FALLBACK" else "\u0120"
    return bool(token) and token.startswith(marker)


def tokenizer_info(tokenizer: Any, vocab_size: int, stop_token_ids: tuple[int, ...]) -> Any:
    """An ``xgrammar.TokenizerInfo`` for masks of width ``vocab_size`` (the model's logits)."""
    import xgrammar as xgr

    vocab = encoded_vocab(tokenizer, vocab_size)
    kind = vocab_type_name(tokenizer, vocab)
    return xgr.TokenizerInfo(vocab, getattr(xgr.VocabType, kind), vocab_size=vocab_size,
                             stop_token_ids=list(stop_token_ids),
                             add_prefix_space=adds_prefix_space(tokenizer, kind))
