"""Embedder around a callable, e.g. the text encoder (CLIP/T5) the ComfyUI workflow already loaded."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .base import Embedder, EmbedError, check_phrases, normalise_rows


def _to_numpy(value: Any) -> np.ndarray:
    """Convert a torch tensor (any dtype/device) or array-like to a float64 numpy array."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # torch tensor, without importing torch
        value = value.detach().float().cpu().numpy()
    return np.asarray(value, dtype=np.float64)


class FunctionEmbedder(Embedder):
    """Wraps `fn(list[str]) -> (n, dim)` array or tensor; validates, converts to float32 and L2-normalises."""

    def __init__(self, name: str, fn: Callable[[list[str]], Any], dim: int, threshold: float) -> None:
        if not isinstance(name, str) or not name.strip():
            raise ValueError("FunctionEmbedder needs a non-empty name (include a model hash so caches stay apart)")
        if not callable(fn):
            raise ValueError(f"fn must be callable, got {type(fn).__name__}")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be a positive int, got {dim!r}")
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold) \
                or not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be a cosine similarity in [0, 1], got {threshold!r}")
        self.name = name
        self.fn = fn
        self.dim = dim
        self.default_threshold = float(threshold)
        self.identity = f"fn:{name}"

    def embed(self, phrases: Sequence[str]) -> np.ndarray:
        """Call fn on the phrases and return (n, dim) float32 unit rows; EmbedError on bad output."""
        items = check_phrases(phrases)
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        try:
            raw = self.fn(list(items))
        except EmbedError:
            raise
        except Exception as exc:  # noqa: BLE001 - surface any encoder failure as one error type
            raise EmbedError(f"embedder {self.identity!r} failed on {len(items)} phrase(s): {exc}") from exc
        try:
            vectors = _to_numpy(raw)
        except (TypeError, ValueError) as exc:
            raise EmbedError(f"embedder {self.identity!r} returned {type(raw).__name__}, not numbers: {exc}") from exc
        if vectors.shape != (len(items), self.dim):
            raise EmbedError(
                f"embedder {self.identity!r} returned shape {tuple(vectors.shape)}, expected ({len(items)}, {self.dim})"
            )
        return normalise_rows(vectors, items, f"embedder {self.identity!r}")
