"""Training batches of the toy world: clips, captions and their latents, reproducible from (seed, step)."""
from __future__ import annotations

from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from comfyui_chai.toyworld.latent import encode
from comfyui_chai.toyworld.prompts import Combo, caption
from comfyui_chai.toyworld.text import ToyTextEncoder
from comfyui_chai.toyworld.world import object_masks, random_spec, render


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


def batch_for(combos: Sequence[Combo], batch_size: int, seed: int, step: int, text: ToyTextEncoder) -> Batch:
    """The batch of one training step (a picklable entry point for worker processes)."""
    return make_batch(combos, batch_size, step_rng(seed, step), text)


class Prefetcher:
    """Batches of the next steps rendered ahead by worker processes; the same batches as `batch_for` in-process."""

    def __init__(self, combos: Sequence[Combo], batch_size: int, seed: int, text: ToyTextEncoder,
                 workers: int = 0) -> None:
        self.args = (tuple(combos), batch_size, seed)
        self.text = text
        self.ahead = 2 * workers
        self.pool = ProcessPoolExecutor(workers, mp_context=get_context("fork")) if workers > 0 else None
        self.pending: dict[int, Future] = {}

    def get(self, step: int) -> Batch:
        """The batch of `step` (and queue the following ones)."""
        if self.pool is None:
            return batch_for(*self.args, step, self.text)
        for s in range(step, step + self.ahead + 1):
            if s not in self.pending:
                self.pending[s] = self.pool.submit(batch_for, *self.args, s, self.text)
        for s in [s for s in self.pending if s < step]:
            self.pending.pop(s).cancel()
        return self.pending.pop(step).result()

    def close(self) -> None:
        """Stop the workers."""
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None
