"""The head's part of a chunk: what depends on the tokens alone, and the read-out.

Before the blocks (`embed`): the scaled embedding rows x0 and every engram site's key and
tapped value (`EngramChunk`), exactly as `models.needle3.batch.chunk_pass` and
`V3Session._chunk` compute them; x0 also feeds confidence row 0. After the blocks
(`read_out`): the final norm and the LM head applied to the lane means the last stage sends.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..formats.needle3_geometry import V3Config
from ..models.needle3.engram import EngramChunk, EngramTail
from ..models.needle3.exact_ops import product
from ..models.needle3.norms import zc_norm
from ..models.needle3.weights import V3Weights, rotate

F32 = np.float32


@dataclass
class HeadChunk:
    x0: np.ndarray  # [C, d]
    site_kv: dict[int, tuple[np.ndarray, np.ndarray]]  # engram site -> (key, tapped value)
    tail: EngramTail  # the engram state after this chunk


def embed(cfg: V3Config, weights: V3Weights, quantized: bool, tokens: np.ndarray, start: int,
          tail: EngramTail) -> HeadChunk:
    """x0 and the engram sites' keys/values of the chunk `tokens` at positions `start ..`."""
    x0 = weights.embedding_rows(tokens) * np.sqrt(F32(cfg.d_model))
    engram = EngramChunk(cfg, weights.engram, tokens, start, tail, quantized)
    site_kv = {site: engram.site(site) for site in range(len(weights.engram))}
    return HeadChunk(x0, site_kv, engram.tail)


def read_out(weights: V3Weights, means: np.ndarray, quantized: bool) -> np.ndarray:
    """Logits [R, vocab_out] of lane means [R, d] (the last stage's `cell_row` in deploy
    numerics, `lanes.mean(axis=1)` in float): final norm, then the LM head."""
    hidden = zc_norm(means, weights.final_norm)
    if quantized:  # the exact A8 product with the tied embedding rows
        return product(hidden, weights.lm_head)
    return rotate(hidden) @ weights.lm_head  # rotated domain (weights.py)
