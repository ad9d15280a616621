"""Structured outputs: grammar-constrained decoding (JSON Schema, regex, choice, EBNF grammar).

Only the torch-free request side is imported here (:class:`StructuredOutputsParams`),
so the batch parser and ``kvcli audit`` can use it without loading torch or
xgrammar; the engine side (``kvcli.structured.decoding``) imports xgrammar lazily.
"""

from kvcli.structured.guided import line_constraint
from kvcli.structured.params import StructuredOutputsParams, response_format_to_params

__all__ = ["StructuredOutputsParams", "line_constraint", "response_format_to_params"]
