"""What the toy-world ComfyUI nodes compute, in plain torch (ComfyUI is never imported here).

- Text: ComfyUI's CONDITIONING carries caption features [1, L, C] with only the valid tokens, which is how
  `CHAI_OpenSoraTextEncode` hands T5 features to the OpenSora model (padding trimmed, no mask). The toy's
  hashed word features (`toy_text_encoder`: y [1, 1, 20, 64] plus a 0/1 mask) become exactly that: the first L
  rows, L = the prompt's word count (at most 20). The model's null caption of the same length is the negative,
  as in `lab.evaluate.generate`, where the mask hides the same padded rows of both.
- Latent: zeros of `ToyVideoSpec().latent_shape(B)` = [B, 4, 8, 16, 16]; nothing else travels with it, the
  loader gives the model its nominal 128x128, 8-frame video (`opensora.comfy_adapter.FixedSampling`).
- Frames: `latent.decode` to RGB in [0, 1], nearest-neighbour upscaled (8x: 128x128, what the model's nominal
  size says), as ComfyUI's IMAGE batch [B * T, H, W, 3] for CreateVideo.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .latent import decode
from .model import DEFAULT_FPS, NOMINAL_DOWNSCALE, ToyVideoSpec, toy_text_encoder
from .text import words

DEFAULT_UPSCALE = NOMINAL_DOWNSCALE  # 16x16 frames -> 128x128, the nominal size the model was told
MAX_UPSCALE = 64
FPS = float(DEFAULT_FPS)  # the frame rate the model was trained and conditioned at (nominal)
# The rate the decoded clips are played at: 8 frames at the nominal 24 fps last a third of a second, too short
# to see what moved; at 8 fps a clip lasts one second (and the workflow's animated preview loops it).
PLAYBACK_FPS = 8.0
MAX_BATCH = 64


@dataclass(frozen=True)
class ToyCaption:
    """A prompt's caption features [1, L, dim] (valid tokens only) and how many of its words they cover."""

    features: Tensor
    used_words: int
    total_words: int


def prompt_conditioning(prompt: str) -> ToyCaption:
    """The toy text encoder's features of a prompt, padding dropped (an empty prompt gives one '<empty>' token)."""
    encoder = toy_text_encoder()
    y, mask = encoder(prompt or "")
    used = int(mask[0].sum())
    return ToyCaption(y[:, 0, :used].clone(), used, len(words(prompt or "")))


def empty_latent(batch_size: int = 1, device: torch.device | str = "cpu") -> Tensor:
    """Zeros [batch_size, 4, 8, 16, 16]: the toy world's one latent size."""
    if not isinstance(batch_size, int) or not 1 <= batch_size <= MAX_BATCH:
        raise ValueError(f"batch_size must be an int in 1..{MAX_BATCH}, got {batch_size!r}")
    return torch.zeros(ToyVideoSpec().latent_shape(batch_size), device=device)


def decode_frames(latent: Tensor, upscale: int = DEFAULT_UPSCALE) -> Tensor:
    """Toy latents [B, 4, T, H, W] -> RGB frames [B * T, H * upscale, W * upscale, 3] in [0, 1] (float32, CPU)."""
    if not isinstance(upscale, int) or not 1 <= upscale <= MAX_UPSCALE:
        raise ValueError(f"upscale must be an int in 1..{MAX_UPSCALE}, got {upscale!r}")
    video = decode(latent.detach().to("cpu", torch.float32))  # [B, T, H, W, 3]
    if upscale > 1:
        video = video.repeat_interleave(upscale, dim=2).repeat_interleave(upscale, dim=3)
    return video.reshape(-1, *video.shape[2:]).contiguous()
