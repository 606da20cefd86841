"""Test helpers for the store: deterministic entity vectors that stand in for a real embedder.

The store tests claim nothing about embedding quality, so a hash-seeded vector per head noun (plus a little
per-phrase noise) stands in: "red ball" and "blue ball" are similar (about 0.96), unrelated heads are not.
"""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import numpy as np
import torch

from comfyui_chai.cache_store.entities.extract import Entity
from comfyui_chai.cache_store.types import EmbeddedEntities

DIM = 32
EMBEDDER = "test-hash-embedder@1"
REPO = Path(__file__).resolve().parents[1]


def _seeded(text: str) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    return np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)


def vector(text: str) -> np.ndarray:
    """Unit vector dominated by the phrase's last word (its head noun)."""
    v = _seeded("head:" + text.split()[-1]) + 0.3 * _seeded("phrase:" + text)
    return v / np.linalg.norm(v)


def ents(*texts: str, embedder: str = EMBEDDER) -> EmbeddedEntities:
    """EmbeddedEntities for the given phrases ('beach' and 'forest' tagged as scenes)."""
    entities = tuple(Entity(t, "scene" if t.split()[-1] in {"beach", "forest", "street"} else "object",
                            t.split()[-1]) for t in texts)
    vectors = np.stack([vector(t) for t in texts]) if texts else np.zeros((0, DIM), np.float32)
    return EmbeddedEntities(entities, vectors, embedder)


def latents(seed: int = 0, shape: tuple[int, ...] = (1, 4, 2, 4, 4)) -> dict[str, torch.Tensor]:
    """Three small donor latents, as a full run would capture at three cache steps."""
    g = torch.Generator().manual_seed(seed)
    return {f"step{i}": torch.randn(shape, generator=g) for i in (2, 3, 4)}


SIGMAS = [0.9, 0.8, 0.7]


def subprocess_env() -> dict[str, str]:
    """Environment for child processes that import the repo's packages."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), env.get("PYTHONPATH", "")])
    return env


PYTHON = sys.executable
