"""The library entry point: ``LLM(model).generate(prompts, params)`` and ``LLM(model).embed(texts)``
like vLLM's offline API."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvcli.engine.config import make_engine_config
from kvcli.engine.llm_engine import LLMEngine
from kvcli.engine.outputs import RequestOutput
from kvcli.sampling_params import SamplingParams

Prompt = str | list[int] | dict[str, Any]


class LLM:
    """Offline batch generation: ``LLM("smollm2-135m").generate(["Hi"], SamplingParams())``.

    Engine options are :class:`~kvcli.engine.config.EngineConfig` fields as keyword
    arguments, with its defaults (the command line's); an unknown one is a TypeError.
    """

    def __init__(self, model: str | None = None, **engine_kwargs: Any) -> None:
        if model is not None:  # None: EngineConfig's default model
            engine_kwargs["model"] = model
        self.engine = LLMEngine.from_config(make_engine_config(**engine_kwargs))

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> LLM:
        self = cls.__new__(cls)
        self.engine = engine
        return self

    def encode(self, prompt: Prompt) -> tuple[list[int], str | None]:
        """Token ids of a prompt: text, token ids, or {"prompt"|"prompt_token_ids"|"messages"}."""
        tok = self.engine.tokenizer
        if isinstance(prompt, str):
            return tok.encode(prompt, add_special_tokens=True), None
        if isinstance(prompt, dict):
            salt = prompt.get("cache_salt")
            if "prompt_token_ids" in prompt:
                return list(prompt["prompt_token_ids"]), salt
            if "messages" in prompt:
                text = tok.apply_chat_template(prompt["messages"], prompt.get("tools"))
                return tok.encode(text, add_special_tokens=False), salt
            return tok.encode(prompt["prompt"], add_special_tokens=True), salt
        return list(prompt), None

    def generate(
        self,
        prompts: Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt; results in input order."""
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params = list(sampling_params)
        base = self.engine._arrivals
        for i, (prompt, sp) in enumerate(zip(prompts, params, strict=True)):
            ids, salt = self.encode(prompt)
            self.engine.add_request(str(base + i), ids, sp, cache_salt=salt)
        results: dict[str, RequestOutput] = {}
        while self.engine.has_unfinished():
            for out in self.engine.step():
                results[out.request_id] = out
        return [results[str(base + i)] for i in range(len(prompts))]

    def embed(self, prompts: Sequence[Prompt], dimensions: int | None = None
              ) -> list[list[float]]:
        """One embedding per prompt (the model's pooling: kvcli/checkpoint/pooling.py), in input
        order; ``dimensions`` where the model is Matryoshka. Raises ValueError for an input or
        size the model cannot embed."""
        params = self.engine.embedding.params(dimensions)
        base = self.engine._arrivals
        for i, prompt in enumerate(prompts):
            ids, salt = self.encode(prompt)
            self.engine.add_embedding_request(f"e{base + i}", [ids], params, cache_salt=salt)
        results: dict[str, RequestOutput] = {}
        while self.engine.has_unfinished():
            for out in self.engine.step():
                results[out.request_id] = out
        outs = [results[f"e{base + i}"] for i in range(len(prompts))]
        failed = next((o for o in outs if o.error or o.embeddings is None), None)
        if failed is not None:
            raise ValueError(f"embedding failed: {failed.error}")
        return [o.embeddings[0] for o in outs]
