"""How a model turns its final hidden states into one embedding (torch-free).

Read from a sentence-transformers layout when the model directory has one (``modules.json``:
a Transformer module at the root, then ``Pooling`` and optionally ``Normalize``;
``1_Pooling/config.json`` names the pooling), else vLLM's default for decoder-only models:
the last token's hidden state, L2-normalised. A layout kvcli cannot reproduce exactly (a Dense
projection, max pooling, ``include_prompt: false``, lower-casing...) is not guessed at: the
spec carries the reason, and every embeddings line on that model fails with it.

``dimensions`` (OpenAI's field: a Matryoshka truncation) is allowed where the model's
``config.json`` says it was trained for it, as vLLM reads it: ``matryoshka_dimensions`` (the
allowed sizes) or ``is_matryoshka: true`` (any size up to the hidden size).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POOLING_TYPES = ("last", "mean", "cls")
# 1_Pooling/config.json's flags -> our names; the other modes (max, mean_sqrt_len, weightedmean)
# are refused.
_ST_MODES = {"pooling_mode_lasttoken": "last", "pooling_mode_mean_tokens": "mean",
             "pooling_mode_cls_token": "cls"}
_ST_OTHER_MODES = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                   "pooling_mode_weightedmean_tokens")
_ST_STRING_MODES = {"lasttoken": "last", "mean": "mean", "cls": "cls"}


@dataclass(slots=True, frozen=True)
class PoolingParams:
    """What one embedding request computes: ``pooling`` over its tokens' final hidden states,
    truncated to ``dimensions`` (None: all), then L2-normalised if ``normalize``."""

    pooling: str = "last"
    normalize: bool = True
    dimensions: int | None = None

    @property
    def needs_every_token(self) -> bool:
        """Mean and CLS pooling read hidden states a prefix-cache hit never computes (K/V
        cannot give them back): such requests compute their whole prompt."""
        return self.pooling != "last"


@dataclass(slots=True, frozen=True)
class EmbeddingSpec:
    """A model's embedding recipe; ``unsupported`` says why kvcli cannot follow it."""

    pooling: str = "last"
    normalize: bool = True
    hidden_size: int = 0
    matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] = ()
    source: str = "default (last token, L2-normalised, as vLLM for decoder-only models)"
    unsupported: str | None = None

    def params(self, dimensions: int | None) -> PoolingParams:
        """The request's pooling; raises ``ValueError("dimensions: ...")`` for a size the model
        was not trained to give."""
        if self.unsupported is not None:
            raise ValueError(f"input: this model cannot compute embeddings with kvcli: "
                             f"{self.unsupported}")
        if dimensions is not None and dimensions != self.hidden_size:
            self._check_dimensions(dimensions)
        else:
            dimensions = None
        return PoolingParams(self.pooling, self.normalize, dimensions)

    def _check_dimensions(self, dimensions: int) -> None:
        if not self.matryoshka:
            raise ValueError(f"dimensions: this model gives {self.hidden_size}-dimensional "
                             "embeddings and does not support other sizes (its config.json has "
                             "neither is_matryoshka nor matryoshka_dimensions)")
        if not 1 <= dimensions <= self.hidden_size:
            raise ValueError(f"dimensions: expected 1 to {self.hidden_size}, got {dimensions}")
        allowed = self.matryoshka_dimensions
        if allowed and dimensions not in allowed:
            raise ValueError(f"dimensions: this model supports "
                             f"{', '.join(map(str, allowed))}, got {dimensions}")


def read_embedding_spec(model_dir: Path, config: dict[str, Any]) -> EmbeddingSpec:
    """The spec for ``model_dir`` (its parsed ``config.json`` is ``config``); never raises:
    an unreadable layout becomes the spec's ``unsupported`` reason."""
    hidden = int(config.get("hidden_size") or 0)
    dims = config.get("matryoshka_dimensions")
    matryoshka = {"hidden_size": hidden,
                  "matryoshka": bool(config.get("is_matryoshka")) or bool(dims),
                  "matryoshka_dimensions": tuple(int(d) for d in dims or ())}
    unsupported = _causal_attention(config)
    if unsupported is not None:
        return EmbeddingSpec(**matryoshka, unsupported=unsupported)
    modules = Path(model_dir) / "modules.json"
    if not modules.is_file():
        return EmbeddingSpec(**matryoshka)
    try:
        pooling, normalize = _sentence_transformers(Path(model_dir), hidden)
    except _Unsupported as err:
        return EmbeddingSpec(**matryoshka, source="sentence-transformers", unsupported=str(err))
    return EmbeddingSpec(pooling, normalize, **matryoshka,
                         source=f"sentence-transformers ({pooling} pooling"
                                + (", normalised)" if normalize else ")"))


class _Unsupported(Exception):
    pass


def _causal_attention(config: dict[str, Any]) -> str | None:
    """kvcli's attention is causal; a bidirectional embedding model would be answered wrongly."""
    if config.get("is_causal") is False or config.get("use_bidirectional_attention") is True:
        return "its config.json asks for bidirectional attention; kvcli's attention is causal"
    return None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise _Unsupported(f"{path.name}: unreadable ({err})") from None


def _sentence_transformers(model_dir: Path, hidden: int) -> tuple[str, bool]:
    modules = _read_json(model_dir / "modules.json")
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise _Unsupported("modules.json: expected a list of modules")
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if not kinds or kinds[0] != "Transformer" or "Pooling" not in kinds:
        raise _Unsupported(f"modules.json: expected Transformer, Pooling[, Normalize], "
                           f"got {', '.join(kinds) or 'nothing'}")
    if str(modules[0].get("path", "")) not in ("", "."):
        raise _Unsupported(f"modules.json: the Transformer module lives in "
                           f"{modules[0].get('path')!r}, not at the model's root")
    extra = [k for k in kinds[1:] if k not in ("Pooling", "Normalize")]
    if extra or kinds.count("Pooling") != 1 or kinds.index("Pooling") != 1:
        raise _Unsupported(f"modules.json: {', '.join(extra) or 'the module order'} after the "
                           "Transformer is not supported (only Pooling, then Normalize)")
    _check_transformer_config(model_dir)
    pooling = _pooling_mode(model_dir / str(modules[1].get("path") or "1_Pooling"), hidden)
    return pooling, "Normalize" in kinds


def _check_transformer_config(model_dir: Path) -> None:
    path = model_dir / "sentence_bert_config.json"
    if path.is_file() and _read_json(path).get("do_lower_case"):
        raise _Unsupported("sentence_bert_config.json: do_lower_case is not supported")


def _pooling_mode(pool_dir: Path, hidden: int) -> str:
    config = _read_json(pool_dir / "config.json")
    if not isinstance(config, dict):
        raise _Unsupported(f"{pool_dir.name}/config.json: expected an object")
    if config.get("include_prompt") is False:
        raise _Unsupported(f"{pool_dir.name}/config.json: include_prompt false is not supported")
    size = config.get("word_embedding_dimension", config.get("embedding_dimension"))
    if size is not None and hidden and size != hidden:
        raise _Unsupported(f"{pool_dir.name}/config.json: embedding dimension {size} is "
                           f"not the model's hidden size {hidden}")
    mode = config.get("pooling_mode")
    if isinstance(mode, str):
        if mode not in _ST_STRING_MODES:
            raise _Unsupported(f"{pool_dir.name}/config.json: pooling_mode {mode!r} is not "
                               "supported (lasttoken, mean, cls are)")
        return _ST_STRING_MODES[mode]
    chosen = [name for flag, name in _ST_MODES.items() if config.get(flag)]
    other = [flag for flag in _ST_OTHER_MODES if config.get(flag)]
    if other or len(chosen) != 1:
        what = ", ".join(other) if other else f"{len(chosen)} pooling modes"
        raise _Unsupported(f"{pool_dir.name}/config.json: {what} (kvcli pools with exactly one "
                           "of lasttoken, mean, cls)")
    return chosen[0]
