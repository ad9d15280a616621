"""kvcli's reading of a vocabulary for xgrammar equals xgrammar's own from_huggingface,
except that special tokens are never allowed (kvcli's output text skips them)."""

from __future__ import annotations

import pytest

from kvcli.structured.vocab import tokenizer_info


def _both(model_dir, vocab_size=None):
    import xgrammar as xgr
    from transformers import AutoTokenizer

    from kvcli.tokenizer import Tokenizer

    ours_tok = Tokenizer.from_dir(model_dir)
    size = vocab_size or ours_tok.vocab_size
    hf = xgr.TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(model_dir),
                                            vocab_size=size, stop_token_ids=[1])
    return ours_tok, tokenizer_info(ours_tok, size, (1,)), hf


def _assert_same_reading(tok, ours, hf) -> None:
    assert (ours.vocab_type, ours.add_prefix_space) == (hf.vocab_type, hf.add_prefix_space)
    special = set(tok.all_special_ids)
    assert special and special - {1} <= set(ours.special_token_ids)  # 1: the stop token
    theirs, mine = hf.decoded_vocab, ours.decoded_vocab
    assert len(theirs) == len(mine)
    for token_id, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        assert a == (b"" if token_id in special else b), token_id


def test_byte_level_vocabulary(tiny_models):
    _assert_same_reading(*_both(tiny_models["llama"]))


def test_byte_fallback_vocabulary(stories_dir):
    """SentencePiece-style (Llama 2): <0x0A> byte pieces, "▁" spaces, a prepended space."""
    tok, ours, hf = _both(stories_dir)
    assert ours.vocab_type.name == "BYTE_FALLBACK"
    _assert_same_reading(tok, ours, hf)


def test_ids_beyond_the_tokenizer_are_never_allowed(tiny_models):
    tok, ours, _ = _both(tiny_models["llama"], vocab_size=None)
    wider = tokenizer_info(tok, tok.vocab_size + 40, (1,))
    assert wider.vocab_size == tok.vocab_size + 40
    assert set(range(tok.vocab_size, tok.vocab_size + 40)) <= set(wider.special_token_ids)


@pytest.mark.slow
def test_default_model_vocabulary(default_model_dir):
    _assert_same_reading(*_both(default_model_dir))
