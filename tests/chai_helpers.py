"""Test helpers for Cache Attention: a tiny random STDiT3 and a deterministic stand-in for the T5 text encoder.

The tests claim nothing about T5 or about sample quality; they need a real STDiT3 forward (tiny, random weights
everywhere so no term hides behind a 0 or a 1) and text features that differ between prompts.
"""
from __future__ import annotations

import hashlib

import torch

from comfyui_chai.opensora.presets import VideoSpec
from comfyui_chai.opensora.stdit3 import STDiT3, STDiT3Config

TINY = dict(hidden_size=64, depth=2, num_heads=4, caption_channels=32, model_max_length=8)
VIDEO = VideoSpec(height=128, width=128, num_frames=17)  # latent [1, 4, 5, 16, 16]


def tiny_stdit3(seed: int = 0, **overrides) -> STDiT3:
    """A tiny fp32 STDiT3 in eval mode with every tensor randomised."""
    torch.manual_seed(seed)
    model = STDiT3(STDiT3Config(**{**TINY, **overrides})).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=gen))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    return model


def _word_vector(word: str, dim: int) -> torch.Tensor:
    seed = int.from_bytes(hashlib.sha256(word.encode()).digest()[:8], "little")
    return torch.randn(dim, generator=torch.Generator().manual_seed(seed))


def toy_text_encode(prompt: str, tokens: int = 8, dim: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """(y [1, 1, tokens, dim], mask [1, tokens]): one hash-seeded vector per word, zero padding masked out."""
    words = prompt.lower().split()[:tokens] or ["<empty>"]
    y = torch.zeros(1, 1, tokens, dim)
    for i, word in enumerate(words):
        y[0, 0, i] = _word_vector(word, dim)
    mask = torch.zeros(1, tokens, dtype=torch.long)
    mask[0, : len(words)] = 1
    return y, mask
