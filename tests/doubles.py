"""Test doubles: a stand-in for the 2-D (SDXL) VAE, for tests and benchmarks that are about everything around it.

`PatchSpatialDouble` is NOT a VAE and claims nothing about SDXL: it averages 8x8 pixel blocks and mixes the 3 colour
channels into 4 latent channels with a fixed matrix (encode), and maps back with the pseudo-inverse followed by
nearest 8x upsampling (decode). It keeps the real part's interface and shape arithmetic (floor(n / 8) latents,
8x decode, [-1, 1] pixels), is deterministic, and reconstructs images that are constant on 8x8 blocks exactly,
which is what the pipeline tests need to check frame counts, chunking and round trips.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class PatchSpatialDouble(nn.Module):
    """Deterministic 8x block-average encoder / nearest-upsampling decoder with the 2-D VAE's interface."""

    def __init__(self, latent_channels: int = 4, factor: int = 8, logvar: float = -4.0, seed: int = 0) -> None:
        super().__init__()
        if latent_channels < 3:
            raise ValueError(f"latent_channels must be >= 3 for an invertible colour mix, got {latent_channels}")
        if factor < 1:
            raise ValueError(f"factor must be >= 1, got {factor}")
        self.factor = factor
        self.logvar = logvar
        mix = torch.randn(latent_channels, 3, generator=torch.Generator().manual_seed(seed))
        self.register_buffer("mix", mix)
        self.register_buffer("unmix", torch.linalg.pinv(mix))

    def encode_moments(self, frames: Tensor) -> Tensor:
        """[N, 3, H, W] -> [N, 2C, H // f, W // f]: block means mixed to C channels, then a constant logvar."""
        pooled = F.avg_pool2d(frames.float(), self.factor)
        mean = torch.einsum("lc,nchw->nlhw", self.mix, pooled)
        return torch.cat([mean, torch.full_like(mean, self.logvar)], dim=1)

    def encode(self, frames: Tensor) -> Tensor:
        """[N, 3, H, W] in [-1, 1] -> raw latents [N, C, H // f, W // f] (the mean)."""
        return self.encode_moments(frames).chunk(2, dim=1)[0]

    def decode(self, latents: Tensor) -> Tensor:
        """[N, C, h, w] raw latents -> [N, 3, h * f, w * f] pixels."""
        rgb = torch.einsum("cl,nlhw->nchw", self.unmix, latents.float())
        return F.interpolate(rgb, scale_factor=self.factor, mode="nearest")


__all__ = ["PatchSpatialDouble"]
