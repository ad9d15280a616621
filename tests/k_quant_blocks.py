"""Random k-quant weights for the kernel tests: gguf's Python package cannot quantize Q4_K,
Q5_K or Q6_K, but every bit pattern of their blocks is a valid block, so random bytes with
small fp16 scales are weights whose reference is ``gguf.quants.dequantize``."""

from __future__ import annotations

import numpy as np
import torch

from kvcli.model.quant.weights import Q4_K, Q5_K, Q6_K, QuantWeight

K_QUANTS = {Q4_K: (144, (0, 2)), Q5_K: (176, (0, 2)), Q6_K: (210, (208,))}  # bytes, fp16 at


def random_k_quant_blocks(kind: int, out_f: int, in_f: int, seed: int,
                          scale: tuple[float, float] = (0.0005, 0.004)) -> np.ndarray:
    """``[out_f, in_f / 256 * block bytes]`` uint8: random blocks, fp16 scales in ``scale``."""
    rng = np.random.default_rng(seed)
    block_bytes, halves = K_QUANTS[kind]
    blocks = rng.integers(0, 256, (out_f, in_f // 256, block_bytes), dtype=np.uint8)
    for at in halves:
        d = rng.uniform(*scale, blocks.shape[:2]).astype(np.float16)
        blocks[:, :, at : at + 2] = d.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(out_f, -1)


def random_k_quant(kind: int, out_f: int, in_f: int, seed: int) -> QuantWeight:
    """Random k-quant blocks (every bit pattern is a valid block) with small fp16 scales."""
    blocks = random_k_quant_blocks(kind, out_f, in_f, seed)
    return QuantWeight(kind, torch.from_numpy(blocks), (out_f, in_f))
