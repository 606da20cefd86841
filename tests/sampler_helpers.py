"""A reference step callback for sampler tests: copies of the latent entering chosen steps."""
from __future__ import annotations

from collections.abc import Sequence

import torch


class LatentCapture:
    """Step callback that keeps copies of the latent entering chosen steps (0-based), keyed by step index."""

    def __init__(self, steps: Sequence[int], device: str | torch.device = "cpu") -> None:
        self.steps = frozenset(int(s) for s in steps)
        self.device = device
        self.latents: dict[int, torch.Tensor] = {}
        self.sigmas: dict[int, float] = {}

    def __call__(self, step: int, x: torch.Tensor, sigma: float, velocity: torch.Tensor) -> None:
        """Store x at this step if it is one of the chosen steps."""
        if step in self.steps:
            self.latents[step] = x.detach().to(self.device, copy=True)
            self.sigmas[step] = float(sigma)
