"""Donor checks shared by the adapters of ComfyUI's video DiTs that Cache Attention aligns token by token."""
from __future__ import annotations

from typing import Any, Sequence

from torch import Tensor, nn

from ..run import CacheAttentionRun


def has_modules(owner: Any, names: Sequence[str]) -> bool:
    """True when every name is an nn.Module attribute of owner."""
    return all(isinstance(getattr(owner, n, None), nn.Module) for n in names)


def check_video_donors(run: CacheAttentionRun, channels: int, family: str,
                       latent_shape: Sequence[int] | None = None) -> None:
    """Donors must be [C, T, H, W] / [B, C, T, H, W] latents of `channels` channels and, when the sampled latent's
    shape is given, of its shape: a full 3-D attention aligns donor and live tokens by position."""
    shape = tuple(run.donors.shape)
    if len(shape) not in (4, 5) or shape[-4] != channels:
        raise ValueError(f"donor latents of shape {shape} are not {channels}-channel {family} video latents "
                         "([C, T, H, W] or [B, C, T, H, W])")
    if latent_shape is not None and tuple(latent_shape)[-4:] != shape[-4:]:
        raise ValueError(f"donor latents {shape} and the latent being sampled {tuple(latent_shape)} differ in "
                         f"shape: {family} Cache Attention needs the same resolution and frame count (token "
                         "positions are shared through RoPE)")


def tokens_of(value: Any) -> int | None:
    """The token count of a block argument [B, L, dim], or None."""
    return int(value.shape[1]) if isinstance(value, Tensor) and value.dim() == 3 else None
