"""What one ``kvcli generate`` was asked to do: its files, flags and per-line defaults."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvcli.batch.source import DEFAULT_MAX_LINE_BYTES
from kvcli.engine.config import EngineConfig
from kvcli.sampling_params import SamplingParams


@dataclass(slots=True)
class GenerateConfig:
    input: str
    output: str | None = None  # None / "-": stdout
    more_inputs: tuple[str, ...] = ()  # INPUT files after the first, read as one input (InputFiles)
    resume: bool = False
    overwrite: bool = False
    ordered: bool = False
    input_order: str = "given"  # "prefix": the whole file grouped by prompt prefix (ordering.py)
    token_ids: bool = False
    deterministic_ids: bool = False  # OpenAI ids from custom_id + prompt (output.py)
    strict: bool = False
    fail_fast: bool = False
    max_pending: int = 256
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    quiet: bool = False
    progress: bool = False
    stats_path: str | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)  # per-line defaults
    clamp_max_tokens: bool = False  # an explicit max_tokens past the context: cap, not error
    seed: int = 0
    engine: EngineConfig = field(default_factory=EngineConfig)
    served_model_names: tuple[str, ...] = ()  # what a line's "model" may say; () = --model
    debug: bool = False  # full tracebacks of a line's unexpected exception
    reasoning_parser: str = "auto"  # kvcli.reasoning: auto | none | a parser's name

    @property
    def model_names(self) -> tuple[str, ...]:
        """The names this run answers to, as vLLM's: --served-model-name, else --model; the
        first is the one results report."""
        model = self.engine.model
        return self.served_model_names or ((str(model),) if model else ())

    @property
    def to_stdout(self) -> bool:
        return self.output in (None, "-")

    @property
    def output_name(self) -> str:
        return "stdout" if self.to_stdout else str(self.output)
