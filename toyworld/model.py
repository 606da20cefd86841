"""The toy world's video spec, flow schedule and tiny STDiT3 configuration.

The 16x16x8 pixel 'latent' (see `latent.py`) stands where an Open-Sora latent of a 128x128, 8-frame video
would: nominal height and width are 8 x 16 = 128 pixels (STDiT3's default when none are given), and the tiny
config's `input_sq_size` is 128 so its sin-cos position table spaces the 8x8 patch grid at unit steps. The
Open-Sora timestep shift for that nominal size (0.25) would spend most steps at low noise; the toy schedule is
the plain shifted schedule with `DEFAULT_SHIFT`, passed to samplers explicitly.
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from ..opensora.loading import CheckpointError, load_stdit3
from ..opensora.stdit3 import STDiT3Config
from .latent import LATENT_CHANNELS
from .text import ToyTextEncoder
from .world import FRAMES, SIZE

NOMINAL_DOWNSCALE = 8  # nominal pixels per latent cell, as for Open-Sora's VAE
DEFAULT_SHIFT = 1.0
DEFAULT_CFG = 2.0  # the guidance scale the shipped model is evaluated and demonstrated at
DEFAULT_FPS = 24.0
TEXT_DIM = 64
TEXT_TOKENS = 20


@dataclass(frozen=True)
class ToyVideoSpec:
    """The toy world's one video size, duck-typed like `opensora.presets.VideoSpec` for the CHAI pipeline."""

    size: int = SIZE
    frames: int = FRAMES
    fps: float = DEFAULT_FPS

    def __post_init__(self) -> None:
        if self.size < 2 or self.frames < 1 or self.fps <= 0:
            raise ValueError(f"bad toy video spec: size {self.size}, frames {self.frames}, fps {self.fps}")

    @property
    def height(self) -> int:
        """Nominal pixel height given to the model (8 per latent cell)."""
        return self.size * NOMINAL_DOWNSCALE

    @property
    def width(self) -> int:
        """Nominal pixel width given to the model."""
        return self.size * NOMINAL_DOWNSCALE

    @property
    def num_frames(self) -> int:
        """Frame count (the pixel latent has no temporal compression)."""
        return self.frames

    @property
    def latent_frames(self) -> int:
        """Latent frame count (= frames)."""
        return self.frames

    @property
    def model_fps(self) -> float:
        """fps given to the model."""
        return float(self.fps)

    def latent_shape(self, batch_size: int = 1) -> tuple[int, int, int, int, int]:
        """Latent shape [B, 4, frames, size, size]."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        return (batch_size, LATENT_CHANNELS, self.frames, self.size, self.size)

    def model_kwargs(self, batch_size: int, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        """height / width / fps tensors for STDiT3's forward."""
        return {"height": torch.full((batch_size,), float(self.height), device=device),
                "width": torch.full((batch_size,), float(self.width), device=device),
                "fps": torch.full((batch_size,), float(self.fps), device=device)}


def toy_sigmas(steps: int, shift: float = DEFAULT_SHIFT) -> torch.Tensor:
    """Flow sigmas [steps + 1] from 1 to 0: uniform in time, then shifted (shift 1 = plain uniform)."""
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if shift <= 0:
        raise ValueError(f"shift must be > 0, got {shift}")
    u = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    return (shift * u / (1 + (shift - 1) * u)).to(torch.float32)


def toy_config(hidden_size: int = 96, depth: int = 4, num_heads: int = 4, mlp_ratio: float = 4.0,
               patch_t: int = 2) -> Any:
    """The tiny STDiT3Config of the toy world (patch patch_t x 2 x 2, 4 channels, hashed 64-d captions)."""
    return STDiT3Config(hidden_size=hidden_size, depth=depth, num_heads=num_heads, mlp_ratio=mlp_ratio,
                      patch_size=(patch_t, 2, 2), in_channels=LATENT_CHANNELS, pred_sigma=True,
                      caption_channels=TEXT_DIM, model_max_length=TEXT_TOKENS, input_sq_size=SIZE * NOMINAL_DOWNSCALE)


def toy_text_encoder() -> ToyTextEncoder:
    """The text encoder matching `toy_config`'s caption shape."""
    return ToyTextEncoder(dim=TEXT_DIM, max_tokens=TEXT_TOKENS)


WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
WEIGHTS_NAME = "toyworld_stdit3.safetensors"


# The quality lab's model, trained on the detailed world (world 2); the demo and the nodes keep the first model,
# trained before the world had detail (world 1: plain backgrounds), whose objects and motions are reliable.
LAB_WEIGHTS_NAME = "toyworld_detail_stdit3.safetensors"


# The lab model distilled into a 4-step student at guidance 1 (lab/distill.py, scripts/distill_toyworld.py): the
# toy analogue of the few-step "lightning" LoRAs; sample it at 4 steps, cfg 1, sigmas 1, .75, .5, .25, 0.
DISTILLED_WEIGHTS_NAME = "toyworld_detail_stdit3_4step.safetensors"


def distilled_weights() -> Path:
    """The quality lab's 4-step guidance-1 student."""
    return WEIGHTS_DIR / DISTILLED_WEIGHTS_NAME


def default_weights() -> Path:
    """The trained toy-world STDiT3 shipped with the pack (the demo's and the nodes' model)."""
    return WEIGHTS_DIR / WEIGHTS_NAME


def lab_weights() -> Path:
    """The quality lab's toy STDiT3, trained on the detailed world."""
    return WEIGHTS_DIR / LAB_WEIGHTS_NAME


def load_toy_model(path: str | Path | None = None, device: str | torch.device = "cpu") -> Any:
    """The trained toy STDiT3 (fp32, eval mode) from `path` or the shipped weights, with a clear error if absent."""
    path = Path(path) if path is not None else default_weights()
    if not path.is_file():
        raise FileNotFoundError(f"toy-world weights not found at {path}; train them with "
                                f"`python scripts/train_toyworld.py --out DIR --steps 12500 --threads 2` (about an "
                                f"hour on 2 CPU cores; README, Training) or restore the file from the repository")
    try:
        return load_stdit3(path, device=device)
    except CheckpointError:
        raise
    except (RuntimeError, OSError, EOFError, pickle.UnpicklingError, SafetensorError) as exc:
        raise CheckpointError(f"{path} is not a readable STDiT3 checkpoint ({str(exc)[:200]}); give a "
                              f".safetensors file that scripts/train_toyworld.py wrote") from exc
