"""The embedder interface: phrases in, L2-normalised float32 vectors out."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np


class EmbedError(RuntimeError):
    """A phrase could not be embedded, or the embedder could not be set up; the message says which and why."""


class Embedder(ABC):
    """Maps entity phrases to unit vectors whose cosine similarity is compared against `default_threshold`."""

    identity: str
    dim: int
    default_threshold: float

    @abstractmethod
    def embed(self, phrases: Sequence[str]) -> np.ndarray:
        """Return a (len(phrases), dim) float32 array with L2-normalised rows; raise EmbedError, never zeros."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dim={self.dim}, threshold={self.default_threshold})"


def describe_phrases(phrases: Sequence[str], indices: Sequence[int], limit: int = 8) -> str:
    """Format offending phrases as `#index 'text'` for an error message."""
    shown = ", ".join(f"#{i} {phrases[i]!r}" for i in indices[:limit])
    more = len(indices) - limit
    return shown + (f" (and {more} more)" if more > 0 else "")


def check_phrases(phrases: Sequence[str]) -> list[str]:
    """Return phrases as a list; TypeError for a bare string or non-strings, EmbedError for blank phrases."""
    if isinstance(phrases, (str, bytes)):
        raise TypeError("embed() takes a sequence of phrases, not a single string; wrap it in a list")
    items = list(phrases)
    wrong = [i for i, p in enumerate(items) if not isinstance(p, str)]
    if wrong:
        raise TypeError(f"phrases must be str; got {type(items[wrong[0]]).__name__} at index {wrong[0]}")
    blank = [i for i, p in enumerate(items) if not p.strip()]
    if blank:
        raise EmbedError(f"cannot embed empty or whitespace-only phrase(s): {describe_phrases(items, blank)}")
    return items


def normalise_rows(vectors: np.ndarray, phrases: Sequence[str], source: str) -> np.ndarray:
    """L2-normalise rows to float32; EmbedError naming the phrases whose rows are non-finite or zero."""
    vecs = np.asarray(vectors, dtype=np.float64)
    finite = np.asarray(np.isfinite(vecs).all(axis=1))
    norms = np.linalg.norm(np.where(finite[:, None], vecs, 0.0), axis=1)
    bad_nonfinite = np.flatnonzero(~finite).tolist()
    bad_zero = np.flatnonzero(finite & (norms <= 1e-12)).tolist()
    if bad_nonfinite or bad_zero:
        parts = []
        if bad_nonfinite:
            parts.append(f"non-finite vector for {describe_phrases(phrases, bad_nonfinite)}")
        if bad_zero:
            parts.append(f"all-zero vector for {describe_phrases(phrases, bad_zero)}")
        raise EmbedError(f"{source} returned " + "; ".join(parts))
    return (vecs / norms[:, None]).astype(np.float32)
