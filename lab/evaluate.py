"""Generate toy-world clips with a trained model (reference RF Euler sampler, CFG) and score them by the detectors."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from comfyui_chai.opensora import sampler
from comfyui_chai.toyworld.detect import Detection, accuracy, detect
from comfyui_chai.toyworld.latent import decode
from comfyui_chai.toyworld.model import DEFAULT_CFG, DEFAULT_SHIFT, ToyVideoSpec, toy_sigmas, toy_text_encoder
from comfyui_chai.toyworld.prompts import Combo, caption

DEFAULT_STEPS = 30


@torch.no_grad()
def generate(model: Any, prompts: Sequence[str], seeds: Sequence[int], steps: int = DEFAULT_STEPS,
             cfg: float = DEFAULT_CFG, shift: float = DEFAULT_SHIFT, batch_size: int = 16,
             solver: str = "euler") -> np.ndarray:
    """RGB clips [N, T, H, W, 3] in [0, 1] for prompts, one seed each (noise drawn per clip from its seed)."""
    if len(prompts) != len(seeds):
        raise ValueError("need one seed per prompt")
    video, text = ToyVideoSpec(), toy_text_encoder()
    device = next(model.parameters()).device
    sigmas = toy_sigmas(steps, shift)
    out = []
    for start in range(0, len(prompts), batch_size):
        chunk = list(prompts[start:start + batch_size])
        b = len(chunk)
        noise = torch.cat([sampler.make_noise(video.latent_shape(1), int(s)) for s in seeds[start:start + b]])
        y, mask = text.encode(chunk)
        uncond = model.null_caption(b, y.shape[2]) if cfg != 1.0 else None
        kwargs = {"mask": mask.to(device), **video.model_kwargs(b, device)}
        latent = sampler.sample(model, noise.to(device), y.to(device), uncond, sigmas, cfg, None, kwargs,
                                solver=solver)
        out.append(decode(latent).cpu().numpy())
    return np.concatenate(out)


@dataclass
class EvalResult:
    """Detector accuracy of generated clips, with what was asked and what was read."""

    accuracy: dict[str, float]
    prompts: list[str]
    combos: list[Combo]
    detections: list[Detection]
    videos: np.ndarray


def evaluate(model: Any, combos: Sequence[Combo], steps: int = DEFAULT_STEPS, cfg: float = DEFAULT_CFG,
             seed: int = 0, shift: float = DEFAULT_SHIFT, batch_size: int = 16) -> EvalResult:
    """Generate one clip per combination (a seeded random phrasing, seed + i as noise seed) and score it."""
    rng = np.random.default_rng(seed)
    prompts = [caption(c, rng) for c in combos]
    seeds = [seed + i for i in range(len(combos))]
    videos = generate(model, prompts, seeds, steps, cfg, shift, batch_size)
    detections = [detect(v) for v in videos]
    return EvalResult(accuracy(detections, list(combos)), prompts, list(combos), detections, videos)
