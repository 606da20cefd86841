"""Pluggable phrase embedders for entity matching."""
from __future__ import annotations

from typing import Any

from .base import Embedder, EmbedError
from .function import FunctionEmbedder
from .minilm import MiniLMEmbedder

# Embedders that can be built from a name and settings alone; FunctionEmbedder wraps a live encoder object
# (the workflow's CLIP/T5), so callers construct it directly.
EMBEDDERS: dict[str, type[Embedder]] = {"minilm": MiniLMEmbedder}

__all__ = ["Embedder", "EmbedError", "MiniLMEmbedder", "FunctionEmbedder", "get_embedder", "EMBEDDERS"]


def get_embedder(name: str = "minilm", **kwargs: Any) -> Embedder:
    """Build an embedder by name ("minilm"); ValueError listing the known names otherwise."""
    cls = EMBEDDERS.get(name.strip().lower()) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"unknown embedder {name!r}; known: {', '.join(sorted(EMBEDDERS))}")
    return cls(**kwargs)
