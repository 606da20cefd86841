"""The toy world's text encoder: fixed hashed word vectors, no weights, shaped like T5 features for STDiT3.

Every lower-case word ([a-z0-9'-]+) maps to a deterministic pseudo-random vector of `dim` components with
unit variance, derived from SHAKE-256 of the word (identical on every platform and library version). A prompt
becomes y [1, 1, max_tokens, dim] (one row per word, zero rows after the last word) and a 0/1 mask
[1, max_tokens]. The world needs no word order: a clip has one scene, one object, one colour and one motion, so
a bag of word vectors identifies it, and STDiT3's caption projection and cross-attention learn which words
matter. Random 64-d vectors of different words are nearly orthogonal (|cos| ~ 0.12), so synonyms are learned as
separate words. Unknown words still get a vector (and are ignored by a model that never saw them).
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

WORD = re.compile(r"[a-z0-9][a-z0-9'-]*")


@lru_cache(maxsize=4096)
def word_vector(word: str, dim: int) -> tuple[float, ...]:
    """Deterministic unit-variance vector of a word (uniform components in [-sqrt 3, sqrt 3])."""
    raw = hashlib.shake_256(f"toyworld:{word}".encode()).digest(4 * dim)
    u = np.frombuffer(raw, dtype="<u4").astype(np.float64) / 2.0**32
    return tuple(((u - 0.5) * np.sqrt(12.0)).tolist())


def words(prompt: str) -> list[str]:
    """Lower-case word tokens of a prompt."""
    return WORD.findall(prompt.lower())


def kept_text(prompt: str, max_words: int) -> str:
    """The prompt as written, cut after its `max_words`-th word token (what the encoder reads of it)."""
    found = list(re.finditer(r"[A-Za-z0-9][A-Za-z0-9'-]*", prompt))
    if len(found) <= max_words:
        return prompt
    return prompt[:found[max_words - 1].end()] if max_words > 0 else ""


@dataclass(frozen=True)
class ToyTextEncoder:
    """Hashed bag-of-words caption features: y [B, 1, max_tokens, dim] and mask [B, max_tokens]."""

    dim: int = 64
    max_tokens: int = 20

    def __post_init__(self) -> None:
        if self.dim < 2 or self.max_tokens < 1:
            raise ValueError(f"dim must be >= 2 and max_tokens >= 1, got {self.dim}, {self.max_tokens}")

    def encode(self, prompts: Sequence[str]) -> tuple[Tensor, Tensor]:
        """Features and mask for a batch of prompts (an empty prompt gets one '<empty>' token)."""
        y = torch.zeros(len(prompts), 1, self.max_tokens, self.dim)
        mask = torch.zeros(len(prompts), self.max_tokens, dtype=torch.long)
        for i, prompt in enumerate(prompts):
            tokens = words(prompt)[: self.max_tokens] or ["<empty>"]
            y[i, 0, : len(tokens)] = torch.tensor([word_vector(w, self.dim) for w in tokens])
            mask[i, : len(tokens)] = 1
        return y, mask

    def __call__(self, prompt: str) -> tuple[Tensor, Tensor]:
        """(y [1, 1, L, dim], mask [1, L]) of one prompt: the `text_encode` the CHAI pipeline expects."""
        return self.encode([prompt])
