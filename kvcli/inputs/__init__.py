"""One request model for `kvcli generate` and `kvcli audit` (torch-free).

Every accepted input line -- a plain prompt, chat ``messages`` (+ ``tools``),
``prompt_token_ids``, an OpenAI Batch chat/completions line, an Anthropic
Messages body or batch line, an OpenAI Responses body -- becomes one
:class:`InputRequest` through :func:`parse_request`. Both commands read lines
through it, so the audit predicts the prompt generate computes, and a bad line
gets the same ``field: reason`` error from both.
"""

from kvcli.inputs.content import PartText, content_text, template_messages
from kvcli.inputs.errors import LineError, clip, show_value, type_name
from kvcli.inputs.request import Format, InputRequest, Prompt, parse_request

__all__ = [
    "Format",
    "InputRequest",
    "LineError",
    "PartText",
    "Prompt",
    "clip",
    "content_text",
    "parse_request",
    "show_value",
    "template_messages",
    "type_name",
]
