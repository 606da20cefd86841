"""The exact OpenSora 1.2 rectified-flow schedule: resolution/length-dependent shift, timesteps and sigmas.

Conventions (OpenSora v1.2 ``RFLOW`` with ``use_timestep_transform=True``, the inference default):

- OpenSora timestep ``t`` lies in [0, 1000]; its flow sigma is ``sigma = t / 1000`` and the noisy latent is
  ``x_t = (1 - sigma) * x0 + sigma * noise``. This sigma is exactly ComfyUI's flow sigma
  (``ModelSamplingDiscreteFlow`` with ``multiplier=1000``: model timestep = 1000 * sigma).
- Step i of N starts from ``u_i = 1 - i / N`` (i = 0..N-1, so the first timestep is exactly 1000) and is
  shifted by ``sigma_i = s * u_i / (1 + (s - 1) * u_i)`` (ComfyUI's ``time_snr_shift``); the sampler then
  integrates from the last sigma to 0, so the sigma list has N + 1 entries and ends with 0.
- The shift is ``s = sqrt(H * W / 512**2) * sqrt(n)`` with the nominal pixel size and ``n = 1`` for an image,
  otherwise ``num_frames // 17 * 5``. fps plays no part.
- The official pipeline holds height, width and frame count in bf16 tensors, so its effective shift is
  bf16-rounded (2.421875 instead of 2.41872 at 240p 9:16, 51 frames). ``bf16=True`` (default) reproduces
  those numbers; ``bf16=False`` uses the exact formula in float64.
"""

from __future__ import annotations

import math
from typing import overload

import torch

from .presets import VAE_CHUNK_FRAMES, vae_latent_frames

NUM_TIMESTEPS = 1000
BASE_RESOLUTION = 512 * 512
# Latent frames per 17-frame chunk as hard-coded in OpenSora's timestep transform.
SHIFT_FRAMES_PER_CHUNK = vae_latent_frames(VAE_CHUNK_FRAMES)


def shift_latent_frames(num_frames: int) -> int:
    """Temporal factor n of OpenSora's shift: 1 for an image, else num_frames // 17 * 5 (at least 1, see notes)."""
    if num_frames < 1:
        raise ValueError(f"num_frames must be >= 1, got {num_frames}")
    if num_frames == 1:
        return 1
    # OpenSora gets n = 0 for 2..16 frames, which collapses every timestep to 0 and samples nothing; we use
    # the image factor there instead. Frame counts of 17 and more follow OpenSora exactly.
    return max(1, num_frames // VAE_CHUNK_FRAMES * SHIFT_FRAMES_PER_CHUNK)


def opensora_shift(height: float, width: float, num_frames: int, *, bf16: bool = True) -> float:
    """Timestep-transform shift s for a nominal pixel height/width and frame count (bf16-rounded by default)."""
    if height <= 0 or width <= 0:
        raise ValueError(f"height and width must be > 0, got {height}x{width}")
    n_time = shift_latent_frames(num_frames)
    if not bf16:
        return math.sqrt(height * width / BASE_RESOLUTION) * math.sqrt(n_time)
    # Replay the official arithmetic: every operand and intermediate is a bf16 tensor, rounded at each op.
    bf = torch.bfloat16
    h = torch.tensor([float(height)], dtype=bf)
    w = torch.tensor([float(width)], dtype=bf)
    frames = torch.tensor([float(num_frames)], dtype=bf)
    if num_frames == 1:
        n = torch.ones_like(frames)
    else:
        n = frames // VAE_CHUNK_FRAMES * SHIFT_FRAMES_PER_CHUNK
        if n.item() < 1:  # same deviation as shift_latent_frames for 2..16 frames
            n = torch.ones_like(frames)
    ratio = (h * w / BASE_RESOLUTION).sqrt() * n.sqrt()
    return float(ratio.item())


@overload
def time_shift(u: float, shift: float) -> float: ...


@overload
def time_shift(u: torch.Tensor, shift: float) -> torch.Tensor: ...


def time_shift(u: float | torch.Tensor, shift: float) -> float | torch.Tensor:
    """Map uniform time u in [0, 1] to the shifted sigma s*u / (1 + (s-1)*u)."""
    if shift <= 0:
        raise ValueError(f"shift must be > 0, got {shift}")
    return shift * u / (1 + (shift - 1) * u)


def _check_steps(steps: int) -> None:
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")


def shifted_timesteps(steps: int, shift: float, *, bf16: bool = True) -> torch.Tensor:
    """OpenSora model timesteps for a shift: float32 [steps], first 1000, decreasing (bf16: shift held in bf16)."""
    _check_steps(steps)
    if shift <= 0:
        raise ValueError(f"shift must be > 0, got {shift}")
    base = [(1.0 - i / steps) * NUM_TIMESTEPS for i in range(steps)]
    if not bf16:
        u = torch.tensor(base, dtype=torch.float64) / NUM_TIMESTEPS
        return (time_shift(u, shift) * NUM_TIMESTEPS).to(torch.float32)
    # Official path: timesteps are float32 tensors, the shift a bf16 tensor; bf16 op float32 promotes to float32,
    # but (shift - 1) is still evaluated (and rounded) in bf16.
    t = torch.tensor(base, dtype=torch.float32) / NUM_TIMESTEPS
    ratio = torch.tensor([shift], dtype=torch.bfloat16)
    new_t = ratio * t / (1 + (ratio - 1) * t)
    return new_t * NUM_TIMESTEPS


def opensora_timesteps(steps: int, height: float, width: float, num_frames: int, *, bf16: bool = True) -> torch.Tensor:
    """OpenSora model timesteps (t in (0, 1000], first exactly 1000) for a nominal video size, float32 [steps]."""
    return shifted_timesteps(steps, opensora_shift(height, width, num_frames, bf16=bf16), bf16=bf16)


def sigmas_from_timesteps(timesteps: torch.Tensor) -> torch.Tensor:
    """Flow sigmas (t / 1000) with the final 0 appended: float32 [len(timesteps) + 1]."""
    t = torch.as_tensor(timesteps, dtype=torch.float32).flatten()
    return torch.cat([t / NUM_TIMESTEPS, t.new_zeros(1)])


def timesteps_from_sigmas(sigmas: torch.Tensor) -> torch.Tensor:
    """OpenSora model timesteps for flow sigmas: 1000 * sigma (same length, float32)."""
    return torch.as_tensor(sigmas, dtype=torch.float32) * NUM_TIMESTEPS


def shifted_sigmas(steps: int, shift: float, *, bf16: bool = True) -> torch.Tensor:
    """Flow sigmas for a given shift: float32 [steps + 1], from 1.0 down to a final 0."""
    return sigmas_from_timesteps(shifted_timesteps(steps, shift, bf16=bf16))


def opensora_sigmas(steps: int, height: float, width: float, num_frames: int, *, bf16: bool = True) -> torch.Tensor:
    """Exact OpenSora 1.2 flow sigmas for a nominal pixel size and frame count: float32 [steps + 1], ends with 0."""
    return sigmas_from_timesteps(opensora_timesteps(steps, height, width, num_frames, bf16=bf16))


def uniform_flow_sigmas(steps: int, shift: float = 1.0) -> torch.Tensor:
    """Sigmas [steps + 1] uniform in time from 1 to 0, then shifted (float64 arithmetic, float32 result)."""
    # The schedule of a model trained with one fixed shift (the toy-world model: shift 1, plain uniform steps);
    # unlike `shifted_sigmas` nothing goes through OpenSora's bf16 rounding or 1000-step timestep grid.
    _check_steps(steps)
    if not (math.isfinite(shift) and shift > 0):
        raise ValueError(f"shift must be > 0, got {shift}")
    u = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    return time_shift(u, shift).to(torch.float32)
