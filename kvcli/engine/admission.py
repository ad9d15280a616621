"""The checks a prompt passes before the engine takes it (torch-free).

Each raises ``ValueError("field: reason")``, the convention the batch layer turns
into that line's error naming the field.
"""

from __future__ import annotations

from kvcli.numbers import plural
from kvcli.sampling_params import SamplingParams, out_of_vocab

#: The words of the refusal of a max_tokens past the context (kvcli generate adds its flag).
CONTEXT_OVERFLOW = "exceed the model's context"


def check_prompt(ids: list[int], params: SamplingParams, max_model_len: int, vocab_size: int,
                 num_blocks: int, block_size: int) -> None:
    """A request that could never run is refused now, not after it has held the pool."""
    if not ids:
        raise ValueError("prompt: empty prompt")
    if len(ids) >= max_model_len:
        raise ValueError(f"prompt: {plural(len(ids), 'token')}, the model's context is "
                         f"{max_model_len} (prompt plus at least one new token)")
    if len(ids) + params.max_tokens > max_model_len:  # as vLLM and the OpenAI API refuse it
        raise ValueError(f"max_tokens: {params.max_tokens} new tokens after the {len(ids)}-token "
                         f"prompt {CONTEXT_OVERFLOW} of {max_model_len} tokens; "
                         f"at most {max_model_len - len(ids)} fit")
    bad = next((t for t in ids if not isinstance(t, int) or not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ValueError(f"prompt_token_ids: token id {bad!r} outside [0, {vocab_size})")
    bad_bias = out_of_vocab(params, vocab_size)
    if bad_bias is not None:
        raise ValueError(bad_bias)
    need = -(-min(len(ids) + params.max_tokens, max_model_len) // block_size)
    if need > num_blocks:
        raise ValueError(f"prompt: needs {need} KV blocks but the pool has {num_blocks} "
                         "(raise --num-blocks / --kv-cache-memory or lower max_tokens)")


def check_embedding_prompt(ids: list[int], max_model_len: int, vocab_size: int, num_blocks: int,
                           block_size: int, name: str = "input") -> None:
    """An embedding input computes no new token: it may fill the whole context."""
    if not ids:
        raise ValueError(f"{name}: empty input")
    if len(ids) > max_model_len:
        raise ValueError(f"{name}: {plural(len(ids), 'token')}, the model's context is "
                         f"{max_model_len}")
    bad = next((t for t in ids if not isinstance(t, int) or not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ValueError(f"{name}: token id {bad!r} outside [0, {vocab_size})")
    need = -(-len(ids) // block_size)
    if need > num_blocks:
        raise ValueError(f"{name}: needs {need} KV blocks but the pool has {num_blocks} "
                         "(raise --num-blocks / --kv-cache-memory)")
