"""The one forward of the transformer family: a batch forward over requests
that sessions, `model.forward`, `model.run_batch`, `hidden_states` and the layer-range parts
(stages) all call.

`Runner` holds what a forward reads (the spec, the prepared weights, the numerics strategy,
its RoPE tables and the fused native blocks) and no per-sequence state: every request brings
its own KV caches (`new_caches`), and the runner advances only them. `run_blocks` is the one
loop over blocks (a stage runs it over its range), `run` the one loop over a request's
prefill chunks (`models.chunking.chunks`): embed, blocks, and the final norm and LM head on the
rows wanted. With int8 numerics every row is computed on its own, so a position's bits do not
depend on the chunk size or on the other requests of a batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from ...kernels import native
from ..chunking import chunks
from ..token_ids import check_token_ids
from .block import block_forward
from .int8_fused import address, rope_arrays
from .spec import BlockSpec
from .weights import TransformerWeights

F32 = np.float32
CHUNK = 256  # positions per prefill chunk: bounds the [heads, CHUNK, positions] temporaries


@dataclass
class Request:
    """One sequence's tokens for a batch forward: its caches (by block index, advanced in
    place), the position of its first token, which logits it wants ("all", "last", "none"),
    its chunk size, and optionally a list receiving [L+1, T, d] hidden states per chunk."""

    caches: Sequence[Any] | Mapping[int, Any]
    tokens: np.ndarray
    start: int
    want: str = "last"
    chunk: int = CHUNK
    hidden: list[np.ndarray] | None = field(default=None)


class Runner:
    """The forward of one model (or part of one): read-only, shared by every sequence."""

    def __init__(self, spec: BlockSpec, weights: TransformerWeights, numerics: Any) -> None:
        self.spec, self.weights, self.numerics = spec, weights, numerics
        self.fused = True  # int8: run each block in one native call when it is built
        self._tables = {theta: numerics.rope_table(spec.head_dim, theta)
                        for theta in sorted({spec.theta(i) for i in range(spec.num_layers)})
                        } if spec.rope else {}

    @cached_property
    def fused_blocks(self) -> list | None:
        """The blocks as single native calls (None: float, a block the kernel does not
        compute, or no native library)."""
        return self.numerics.fused_blocks(self.spec, self.weights)

    def native_blocks(self) -> list | None:
        """The fused blocks a chunk runs now: None when `fused` is off or the native library
        is not loaded, and every block runs `block_forward`."""
        if not self.fused or native.library() is None:
            return None
        return self.fused_blocks

    def new_caches(self, blocks: range | None = None) -> dict[int, Any]:
        """Fresh KV caches of `blocks` (default every block) for one sequence."""
        blocks = range(self.spec.num_layers) if blocks is None else blocks
        return {i: self.numerics.kv_cache(self.spec, i) for i in blocks}

    def check_ids(self, ids: Sequence[int] | np.ndarray, position: int = 0) -> np.ndarray:
        """Token ids as int64, or a ModelInputError naming what is wrong (`token_ids`)."""
        return check_token_ids(ids, self.spec.vocab, self.spec.max_seq_len, position)

    def embed(self, tokens: np.ndarray, start: int) -> np.ndarray:
        """Block input [T, d] of tokens at positions start.. (scaled by `spec.embed_scale`,
        learned positions added)."""
        h = np.array(self.weights.embed[tokens], F32)
        if self.spec.embed_scale is not None:
            h *= F32(self.spec.embed_scale)
        if self.weights.positions is not None:
            h += self.weights.positions[start : start + len(tokens)]
        return h

    def readout(self, rows: np.ndarray) -> np.ndarray:
        """Logits [R, vocab] of last-block rows: the final norm, the LM head, then the
        spec's final soft-cap (`cap * tanh(x / cap)`, by the numerics strategy)."""
        logits = self.weights.lm_head(self.weights.final_norm(np.asarray(rows, F32)))
        cap = self.spec.final_softcap
        return logits if cap is None else self.numerics.softcap(logits, cap)

    def rope(self, start: int, count: int) -> dict[float, tuple[np.ndarray, np.ndarray]]:
        """cos, sin [count, head_dim] per RoPE theta, for positions start.. ({} without)."""
        return {theta: table(start, count) for theta, table in self._tables.items()}

    def run_blocks(self, first: int, end: int, h: np.ndarray, caches: Any, start: int,
                   states: list | None = None) -> np.ndarray:
        """The residual rows h [T, d] (positions start..) after blocks first..end-1;
        `caches[i]` is block i's cache (advanced in place); `states`, if given, receives each
        block's output. The one loop over blocks."""
        spec, layers = self.spec, self.weights.layers
        rope = self.rope(start, len(h))
        fused = self.native_blocks()
        if fused is not None and states is None and end > first:
            # one copy of the caller's rows, every block on it in place, addresses taken once
            h = np.array(h, F32, order="C", copy=True)
            cos, sin = rope_arrays(next(iter(rope.values()), None))
            at, cos_at, sin_at = h.ctypes.data, address(cos), address(sin)
            for index in range(first, end):
                fused[index].run(h, at, caches[index], start, cos_at, sin_at)
            return h
        for index in range(first, end):
            layer_rope = rope.get(spec.theta(index)) if spec.rope else None
            if fused is not None:
                h = fused[index](h, caches[index], start, layer_rope)
            else:
                h = block_forward(spec, layers[index], index, h, caches[index], start,
                                  layer_rope)
            if states is not None:
                states.append(h)
        return h

    def run(self, requests: Sequence[Request]) -> list[np.ndarray | None]:
        """The batch forward: per request, its tokens in chunks through every block; the
        logits it wants ([rows, vocab], or None for "none"). Each request's rows are its own
        (int8: the bits of running it alone)."""
        return [self._request(request) for request in requests]

    def _request(self, request: Request) -> np.ndarray | None:
        outputs = []
        tokens = request.tokens
        for piece in chunks(len(tokens), request.chunk, request.want):
            start = request.start + piece.first
            h = self.embed(tokens[piece.first : piece.end], start)
            states = [h.copy()] if request.hidden is not None else None
            h = self.run_blocks(0, self.spec.num_layers, h, request.caches, start, states)
            if states is not None:
                states[-1] = self.weights.final_norm(h)
                request.hidden.append(np.stack(states))
            if piece.rows != "none":
                outputs.append(self.readout(h if piece.rows == "all" else h[-1:]))
        if not outputs:
            return None
        return np.concatenate(outputs) if len(outputs) > 1 else outputs[0]


__all__ = ["CHUNK", "Request", "Runner"]
