"""What an engine is built from, and the size of the KV pool that follows (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass

from kvcli.structured.compile_worker import DEFAULT_COMPILE_TIMEOUT

DEFAULT_KV_CACHE_MEMORY = 1 << 30  # 1 GiB
KV_CACHE_DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16", "int8")
MAX_DEFAULT_BLOCKS = 32768


@dataclass(slots=True)
class EngineConfig:
    model: str | None = None
    block_size: int = 16
    num_blocks: int | None = None
    kv_cache_memory: int | None = None  # bytes
    max_num_batched_tokens: int = 1024
    max_num_seqs: int = 64
    enable_prefix_caching: bool = True
    scheduling: str = "fcfs"  # or "cache-aware"
    device: str = "cpu"
    dtype: str = "float32"
    # The KV pool's element type: "auto" (the model's --dtype: today's exact cache), float32,
    # bfloat16, float16, or int8 (per token and KV head uint8 codes with a float32 scale and zero
    # point, read in place by the native CPU kernels: ~3.6x the tokens per byte, not exact).
    kv_cache_dtype: str = "auto"
    allow_pickle: bool = False
    seed: int = 0
    quiet: bool = False  # no model conversion or download progress on stderr
    kv_cache_dir: str | None = None  # persistent prefix cache on disk (kvcli/kvstore)
    kv_cache_dir_max_bytes: int | None = None  # its bound; None: kvstore.DEFAULT_MAX_BYTES
    kv_cache_dir_insecure: bool = False  # use it even if other users may write it (kvstore.safety)
    quantization: str | None = None  # "int8" or "gguf" weights (kvcli/model/quant); None: float
    # Seconds one constraint's grammar may take to compile (its lines fail past it); None: no limit
    structured_compile_timeout: float | None = DEFAULT_COMPILE_TIMEOUT
    chat_template: str | None = None  # a Jinja template replacing the model's (--chat-template)


def budget_num_blocks(config: EngineConfig, bytes_per_block: int) -> int:
    """The pool's blocks when ``num_blocks`` is not given: ``kv_cache_memory`` (default 1 GiB)
    over the bytes of one block, at most MAX_DEFAULT_BLOCKS unless the memory was given."""
    budget = config.kv_cache_memory or DEFAULT_KV_CACHE_MEMORY
    num_blocks = max(1, budget // bytes_per_block)
    if config.kv_cache_memory is None:
        num_blocks = min(num_blocks, MAX_DEFAULT_BLOCKS)
    return num_blocks
