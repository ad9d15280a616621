"""Model acquisition, torch-free: turn a --model spec into a checked local model directory.

- ``resolve.py``: the spec forms (default model, directory, .gguf, listed name, hub repo id)
  and ``kvcli models``' listing; ``model_dir.py``: what a usable directory holds.
- ``hub.py``: Hugging Face hub snapshots (cached, or downloaded when online).
- ``convert.py``: a GGUF converted once, staged and renamed into place, with checksums
  (``integrity.py``) and progress lines (``progress.py``). The one torch step, de-quantizing
  and saving the tensors, is the caller's ``write_tensors`` (kvcli/model/gguf_convert.py).
- ``gguf_meta.py``: a GGUF's config and tokenizer for ``--quantization gguf`` (no weights);
  ``quant_modes.py``: which ``--quantization`` mode a spec runs in (``resolve_mode``: ``auto``
  is gguf for a GGUF the gguf mode can run, from its header: ``gguf_header.py``) and accepts.
- ``config.py``: a ``config.json`` parsed into the ``ModelConfig`` the model layers build from.

Nothing here imports torch or anything above the ground floor (the import-linter contracts in
pyproject.toml), so ``kvcli audit`` and ``kvcli models`` use it without loading the engine.
"""
