"""Training batches of the toy world: clips, captions and their latents, reproducible from (seed, step)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from .latent import encode
from .prompts import Combo, caption
from .text import ToyTextEncoder
from .world import object_masks, random_spec, render


@dataclass
class Batch:
    """One training batch: latents x0 [B, 4, T, H, W], caption features y [B, 1, L, C], mask [B, L], object masks."""

    x0: Tensor
    y: Tensor
    mask: Tensor
    objects: Tensor  # [B, 1, T, H, W] float, 1 on the object's coloured pixels
    captions: list[str]
    combos: list[Combo]


def make_batch(combos: Sequence[Combo], batch_size: int, rng: np.random.Generator,
               text: ToyTextEncoder) -> Batch:
    """Draw `batch_size` combinations uniformly from `combos`, render a random clip and phrasing of each."""
    if batch_size < 1 or not combos:
        raise ValueError("need a positive batch size and at least one combination")
    picks = [combos[int(i)] for i in rng.integers(0, len(combos), size=batch_size)]
    specs = [random_spec(*c, rng) for c in picks]
    videos = np.stack([render(s) for s in specs])
    objects = torch.from_numpy(np.stack([object_masks(s) for s in specs])[:, None].astype(np.float32))
    captions = [caption(c, rng) for c in picks]
    y, mask = text.encode(captions)
    return Batch(encode(videos), y, mask, objects, captions, picks)


def step_rng(seed: int, step: int) -> np.random.Generator:
    """The data generator of one training step (independent of every other step: resumable exactly)."""
    return np.random.default_rng([int(seed), int(step)])


def step_generator(seed: int, step: int) -> torch.Generator:
    """The torch generator (noise, timesteps, caption dropout) of one training step."""
    return torch.Generator().manual_seed((int(seed) * 1_000_003 + int(step)) % (2**63))
