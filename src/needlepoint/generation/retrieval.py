"""Tool retrieval with the Needle 2 contrastive probe head.

With many tools, the prompt (and the tool-call grammar) only needs the few that fit the
query: each tool and the query are embedded with `model.embed` (the contrastive head,
L2-normalised), tools are ranked by cosine similarity, and the top k are offered.

Decisions (docs/api.md, "Tool retrieval"):

* **Tool text.** A tool is embedded as the compact JSON of its schema
  (`{"name","description","parameters"}`, `prompt.compact_json`): byte for byte the entry
  the prompt lists inside `<tools>`, so the head scores the same text the model reads, and
  parameter names/descriptions ("brightness", "city") count, not just the summary line.
  The query is embedded as the raw user text. Both are scored as `[BOS] + encode(text)`
  (`V2Model.embed`).
* **Score.** Embeddings are unit vectors, so cosine similarity is the dot product.
* **Order.** `rank` is best first, ties broken by the original tool order. The tools offered
  to the model keep the caller's order (`top_k`): the chosen set, not its ranking, is what
  retrieval decides; the prompt then lists tools as the caller wrote them, and one subset
  always renders (and compiles) the same way.
* **Cache.** Tools do not change over a `Needle`'s life: `ToolIndex` embeds them once, on
  first use, and reuses the matrix for every query.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import NeedlepointError
from ..formats.needle_wire import compact_json
from ..models.protocol import ModelProtocol

# Defaults of `Needle(retrieve_k=..., retrieve_threshold=...)`: up to 8 tools are all shown
# (a small prompt the model handles as trained); beyond that only the best 5 are.
DEFAULT_RETRIEVE_K = 5
DEFAULT_RETRIEVE_THRESHOLD = 8


class RetrievalUnavailableError(NeedlepointError, ValueError):
    """The model has no contrastive embedding head, so tools cannot be ranked."""


def has_embedding_head(model: ModelProtocol) -> bool:
    """True when `model.embed(text)` can run: the model's capabilities declare an embedding
    head (a Needle 2 archive with a contrastive head; Needle 3's `embedding_head` is not
    implemented, transformers have none)."""
    return model.capabilities.embedding


def require_embedding_head(model: Any) -> None:
    if not has_embedding_head(model):
        name = type(model).__name__
        raise RetrievalUnavailableError(
            f"tool retrieval needs a contrastive embedding head, and this model ({name}) has "
            "none: use a Needle 2 archive with a contrastive head (the Needle 3 "
            "embedding_head is not supported)")


def tool_text(schema: Mapping[str, Any]) -> str:
    """The text a tool is embedded as: its compact JSON schema, as the prompt lists it."""
    return compact_json(dict(schema))


def embed_tools(
    model: Any,
    schemas: Sequence[Mapping[str, Any]],
    text: Callable[[Mapping[str, Any]], str] = tool_text,
) -> np.ndarray:
    """`[len(schemas), dim]` float32: one unit-norm embedding per tool, in the given order."""
    require_embedding_head(model)
    if not schemas:
        return np.zeros((0, 0), dtype=np.float32)
    return np.stack([np.asarray(model.embed(text(s)), dtype=np.float32) for s in schemas])


def cosine_scores(tool_embeddings: np.ndarray, query_embedding: np.ndarray) -> np.ndarray:
    """Cosine similarity of each tool to the query (both sides unit-norm: a dot product)."""
    if tool_embeddings.shape[0] == 0:
        return np.zeros(0, dtype=np.float32)
    return tool_embeddings @ np.asarray(query_embedding, dtype=np.float32)


def rank(scores: np.ndarray) -> list[int]:
    """Tool indices, best score first; equal scores keep the original order (stable)."""
    return [int(i) for i in np.argsort(-np.asarray(scores), kind="stable")]


def top_k(scores: np.ndarray, k: int) -> list[int]:
    """The indices of the k best tools, in their original order (the prompt's order)."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    return sorted(rank(scores)[:k])


class ToolIndex:
    """One tool list's embeddings, computed on first use and kept (tools never change).

    Not thread-safe, like the `Needle` that owns it."""

    def __init__(
        self,
        model: Any,
        schemas: Sequence[Mapping[str, Any]],
        text: Callable[[Mapping[str, Any]], str] = tool_text,
    ) -> None:
        self.model = model
        self.schemas = [dict(s) for s in schemas]
        self.text = text
        self._embeddings: np.ndarray | None = None

    @property
    def available(self) -> bool:
        return has_embedding_head(self.model)

    @property
    def embeddings(self) -> np.ndarray:
        if self._embeddings is None:
            self._embeddings = embed_tools(self.model, self.schemas, self.text)
        return self._embeddings

    def scores(self, query: str) -> np.ndarray:
        """Each tool's cosine similarity to `query`, in the tools' order."""
        require_embedding_head(self.model)
        if not self.schemas:
            return np.zeros(0, dtype=np.float32)
        return cosine_scores(self.embeddings, self.model.embed(query))

    def ranked(self, query: str) -> list[tuple[float, int]]:
        """`(score, tool index)` for every tool, best first."""
        scores = self.scores(query)
        return [(float(scores[i]), i) for i in rank(scores)]

    def top_k(self, query: str, k: int) -> list[int]:
        """The k best tools' indices, in the original order."""
        return top_k(self.scores(query), k)
