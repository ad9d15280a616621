"""vllm.inputs.TokensPrompt: a dict with the prompt's token ids, as in vLLM."""


def TokensPrompt(prompt_token_ids: list[int]) -> dict:  # noqa: N802 - vLLM's name
    return {"prompt_token_ids": prompt_token_ids}
