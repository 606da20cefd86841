"""The toy world's 'latent': a fixed linear map of RGB pixels to 4 channels (pixel space, no learned autoencoder).

Why pixel space: at 16x16 pixels a clip is already as small as an Open-Sora latent of a 128x128 video, and a
learned autoencoder would cost training time and add reconstruction error the quality benchmark would have to
separate from the sampler's. The 4 channels are RGB (scaled to [-1, 1]) through the first three columns of a
4x4 Hadamard matrix (orthonormal columns), times `LATENT_SCALE`, so the latent has STDiT3's 4 channels and
roughly unit variance. Decoding applies the transpose: exact on the 3-d image of RGB; a component a model puts
along the fourth direction (1, -1, -1, 1)/2 carries no colour and is dropped.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

LATENT_CHANNELS = 4
# Orthonormal columns: ENCODE.T @ ENCODE = I_3.
ENCODE = 0.5 * torch.tensor([[1.0, 1.0, 1.0],
                             [1.0, -1.0, 1.0],
                             [1.0, 1.0, -1.0],
                             [1.0, -1.0, -1.0]])
# Measured on 4,096 generated clips: before scaling the channels have standard deviations 0.93, 0.38, 0.47 and
# 0.39 (0.59 over all); 1.6 brings the overall deviation to about 0.95, near the unit variance the flow's noise
# has. One shared scale keeps the map orthogonal up to a constant.
LATENT_SCALE = 1.6


def encode(video: Tensor | np.ndarray) -> Tensor:
    """RGB clips [B, T, H, W, 3] (or [T, H, W, 3]) in [0, 1] -> latents [B, 4, T, H, W] float32."""
    v = torch.as_tensor(np.asarray(video) if not isinstance(video, Tensor) else video, dtype=torch.float32)
    if v.dim() == 4:
        v = v[None]
    if v.dim() != 5 or v.shape[-1] != 3:
        raise ValueError(f"expected RGB clips [B, T, H, W, 3], got {list(v.shape)}")
    z = torch.einsum("cr,bthwr->bcthw", ENCODE, 2.0 * v - 1.0)
    return z * LATENT_SCALE


def decode(latent: Tensor) -> Tensor:
    """Latents [B, 4, T, H, W] -> RGB clips [B, T, H, W, 3] clamped to [0, 1] (float32, on the latent's device)."""
    if latent.dim() != 5 or latent.shape[1] != LATENT_CHANNELS:
        raise ValueError(f"expected latents [B, 4, T, H, W], got {list(latent.shape)}")
    x = torch.einsum("cr,bcthw->bthwr", ENCODE.to(latent.device), latent.float() / LATENT_SCALE)
    return ((x + 1.0) / 2.0).clamp(0.0, 1.0)
