"""Structured outputs: grammar-constrained decoding (JSON Schema, regex, choice, EBNF grammar).

The whole package is torch-free ground: the request side (:class:`StructuredOutputsParams`,
imported here, so the batch parser and ``kvcli audit`` use it without loading torch or
xgrammar), grammar compiling and the validity check. The engine side, which masks logits
(``kvcli.engine.structured_decoding``), lives in the engine and imports xgrammar lazily.
"""

from kvcli.structured.guided import line_constraint
from kvcli.structured.params import StructuredOutputsParams, response_format_to_params

__all__ = ["StructuredOutputsParams", "line_constraint", "response_format_to_params"]
