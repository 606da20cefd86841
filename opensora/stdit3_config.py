"""STDiT3's architecture settings (XL/2 by default) and the input conventions shared by its modules."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

VAE_DOWNSCALE = 8  # pixels per latent cell, used when the nominal pixel size is not given
DEFAULT_FPS = 24.0
IMAGE_FPS = 120.0  # Open-Sora conditions single images on fps 120
FREQ_EMBED_DIM = 256  # sinusoid width fed to the timestep and fps MLPs


@dataclass(frozen=True)
class STDiT3Config:
    """Architecture of an STDiT3 model; the defaults are STDiT3-XL/2 as released with Open-Sora 1.2."""

    hidden_size: int = 1152
    depth: int = 28  # spatial blocks; there are as many temporal blocks, interleaved
    num_heads: int = 16
    mlp_ratio: float = 4.0
    patch_size: tuple[int, int, int] = (1, 2, 2)
    in_channels: int = 4
    pred_sigma: bool = True  # the model also outputs a (discarded) sigma half: out_channels = 2 * in_channels
    caption_channels: int = 4096  # T5-XXL d_model
    model_max_length: int = 300  # T5 tokens; rows of the null-caption table
    qk_norm: bool = True
    input_sq_size: int = 512  # reference side (pixels) of the position-embedding scale
    norm_eps: float = 1e-6  # layer norms and q/k RMS norms
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "patch_size", tuple(int(p) for p in self.patch_size))
        for name in ("hidden_size", "depth", "num_heads", "in_channels", "caption_channels", "model_max_length",
                     "input_sq_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"STDiT3Config.{name} must be a positive int, got {value!r}")
        if len(self.patch_size) != 3 or min(self.patch_size) <= 0:
            raise ValueError(f"STDiT3Config.patch_size must be three positive ints (t, h, w), got {self.patch_size}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even (RoPE rotates pairs)")
        if self.hidden_size % 4:
            raise ValueError(f"hidden_size {self.hidden_size} must be divisible by 4 (2-D sin-cos embedding)")
        if self.mlp_ratio <= 0 or int(self.hidden_size * self.mlp_ratio) <= 0:
            raise ValueError(f"mlp_ratio must be positive, got {self.mlp_ratio}")
        if self.norm_eps <= 0 or self.rope_theta <= 0:
            raise ValueError("norm_eps and rope_theta must be positive")

    @property
    def head_dim(self) -> int:
        """Width of one attention head (72 for XL/2)."""
        return self.hidden_size // self.num_heads

    @property
    def out_channels(self) -> int:
        """Output channels: velocity, plus the sigma half when pred_sigma."""
        return self.in_channels * (2 if self.pred_sigma else 1)

    @property
    def mlp_hidden(self) -> int:
        """Hidden width of the block MLPs (4608 for XL/2)."""
        return int(self.hidden_size * self.mlp_ratio)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of the fields."""
        out = asdict(self)
        out["patch_size"] = list(self.patch_size)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "STDiT3Config":
        """Build from a dict such as `to_dict()` wrote; unknown fields are an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown STDiT3Config fields: {unknown}")
        return cls(**dict(data))
