"""The Open-Sora 1.2 temporal VAE (`VAE_Temporal_SD`): causal 3-D convolutions over SDXL-VAE latents.

Module and parameter names follow the official `OpenSora-VAE-v1.2/model.safetensors` (under `temporal_vae.`), so
`TemporalPart().state_dict()` has exactly the checkpoint's `temporal_vae.*`, `scale` and `shift` names and shapes.
Tensors are [B, C, T, H, W]. The encoder front-pads time to a multiple of the downsample factor (4), the decoder
returns that many frames per latent frame and `decode` drops the padding again.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

LATENT_SHIFT: tuple[float, ...] = (-0.10, 0.34, 0.27, 0.98)  # per-channel statistics of OpenSoraVAE_V1_2
LATENT_SCALE: tuple[float, ...] = (3.85, 2.32, 2.33, 3.06)
LOGVAR_RANGE = (-30.0, 20.0)
ACTIVATIONS = ("swish", "relu")


@dataclass(frozen=True)
class TemporalVAEConfig:
    """Shape of the temporal VAE; the defaults are the released `VAE_Temporal_SD` (309.7 M parameters)."""

    in_out_channels: int = 4  # channels of the 2-D VAE latent it compresses
    latent_embed_dim: int = 4  # encoder output is 2x this (mean, logvar); decoder input
    embed_dim: int = 4  # channels after quant_conv / before post_quant_conv (the video latent)
    filters: int = 128
    num_res_blocks: int = 4
    channel_multipliers: tuple[int, ...] = (1, 2, 2, 4)
    temporal_downsample: tuple[bool, ...] = (False, True, True)  # per level transition, len(multipliers) - 1
    num_groups: int = 32
    activation: str = "swish"

    def __post_init__(self) -> None:
        object.__setattr__(self, "channel_multipliers", tuple(int(m) for m in self.channel_multipliers))
        object.__setattr__(self, "temporal_downsample", tuple(bool(t) for t in self.temporal_downsample))
        for name in ("in_out_channels", "latent_embed_dim", "embed_dim", "filters", "num_res_blocks", "num_groups"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.channel_multipliers or min(self.channel_multipliers) < 1:
            raise ValueError(f"channel_multipliers must be non-empty positive integers, got {self.channel_multipliers}")
        if len(self.temporal_downsample) != len(self.channel_multipliers) - 1:
            raise ValueError(f"temporal_downsample needs {len(self.channel_multipliers) - 1} entries (one per level "
                             f"transition), got {len(self.temporal_downsample)}")
        for width in self.widths:
            if width % self.num_groups:
                raise ValueError(f"level width {width} is not divisible by num_groups {self.num_groups}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")

    @property
    def widths(self) -> tuple[int, ...]:
        """Channel width of each level (filters x multiplier)."""
        return tuple(self.filters * m for m in self.channel_multipliers)

    @property
    def time_downsample_factor(self) -> int:
        """Frames per latent frame (4 for the released model)."""
        return 2 ** sum(self.temporal_downsample)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dictionary (tuples as lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TemporalVAEConfig":
        """Inverse of `to_dict`; unknown keys are an error."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown TemporalVAEConfig fields: {', '.join(unknown)}")
        return cls(**dict(data))


def time_padding(num_frames: int, factor: int = 4) -> int:
    """Zero frames put in front of a clip of `num_frames` so that its length is a multiple of `factor`."""
    return (factor - num_frames % factor) % factor


class CausalConv3d(nn.Module):
    """Conv3d with zero padding: (k_t - 1) + (1 - stride_t) frames in front only, k // 2 on each side of H and W."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, int, int] = 3,
                 time_stride: int = 1, bias: bool = True) -> None:
        super().__init__()
        kt, kh, kw = (kernel_size,) * 3 if isinstance(kernel_size, int) else tuple(kernel_size)
        if kh % 2 == 0 or kw % 2 == 0:
            raise ValueError(f"spatial kernel sizes must be odd, got {kh}x{kw}")
        self.time_pad = (kt - 1) + (1 - time_stride)
        self.padding = (kw // 2, kw // 2, kh // 2, kh // 2, self.time_pad, 0)
        self.conv = nn.Conv3d(in_channels, out_channels, (kt, kh, kw), stride=(time_stride, 1, 1), bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        """Pad causally, then convolve."""
        return self.conv(F.pad(x, self.padding))


def _activation(name: str) -> nn.Module:
    """SiLU for 'swish' (the released model), ReLU for 'relu'."""
    return nn.SiLU() if name == "swish" else nn.ReLU()


class ResBlock(nn.Module):
    """norm, act, conv 3^3, norm, act, conv 3^3 (bias-free) plus the input, 1^3-projected when widths differ."""

    def __init__(self, in_channels: int, out_channels: int, num_groups: int, activation: str) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(num_groups, in_channels)
        self.conv1 = CausalConv3d(in_channels, out_channels, 3, bias=False)
        self.norm2 = nn.GroupNorm(num_groups, out_channels)
        self.conv2 = CausalConv3d(out_channels, out_channels, 3, bias=False)
        self.conv3 = CausalConv3d(in_channels, out_channels, 1, bias=False) if in_channels != out_channels else None
        self.act = _activation(activation)

    def forward(self, x: Tensor) -> Tensor:
        """x + F(x), the residual projected when the width changes."""
        h = self.conv1(self.act(self.norm1(x)))
        h = self.conv2(self.act(self.norm2(h)))
        return h + (x if self.conv3 is None else self.conv3(x))


def _res_stack(in_channels: int, out_channels: int, count: int, cfg: TemporalVAEConfig) -> nn.ModuleList:
    """`count` ResBlocks, the first one changing the width."""
    return nn.ModuleList(ResBlock(in_channels if j == 0 else out_channels, out_channels, cfg.num_groups,
                                  cfg.activation) for j in range(count))


def depth_to_time(x: Tensor, factor: int) -> Tensor:
    """[B, C*f, T, H, W] -> [B, C, T*f, H, W]; input channel c*f + s becomes frame t*f + s of channel c."""
    if factor == 1:
        return x
    b, cf, t, h, w = x.shape
    c = cf // factor
    return x.view(b, c, factor, t, h, w).permute(0, 1, 3, 2, 4, 5).reshape(b, c, t * factor, h, w)


class TemporalEncoder(nn.Module):
    """conv_in, per-level ResBlocks with strided causal convs for time downsampling, ResBlocks, norm, 1^3 conv."""

    def __init__(self, cfg: TemporalVAEConfig) -> None:
        super().__init__()
        widths = cfg.widths
        self.conv_in = CausalConv3d(cfg.in_out_channels, cfg.filters, 3, bias=False)
        self.block_res_blocks = nn.ModuleList()
        self.conv_blocks = nn.ModuleList()
        prev = cfg.filters
        for i, width in enumerate(widths):
            self.block_res_blocks.append(_res_stack(prev, width, cfg.num_res_blocks, cfg))
            prev = width
            if i < len(widths) - 1:
                # A level without time downsampling keeps an Identity slot so the indices match the checkpoint.
                self.conv_blocks.append(CausalConv3d(width, width, 3, time_stride=2) if cfg.temporal_downsample[i]
                                        else nn.Identity())
        self.res_blocks = _res_stack(prev, prev, cfg.num_res_blocks, cfg)
        self.norm1 = nn.GroupNorm(cfg.num_groups, prev)
        self.act = _activation(cfg.activation)
        self.conv2 = CausalConv3d(prev, 2 * cfg.latent_embed_dim, 1)

    def forward(self, x: Tensor) -> Tensor:
        """[B, in, T, H, W] (T a multiple of the downsample factor) -> [B, 2*latent, T/f, H, W]."""
        x = self.conv_in(x)
        for i, blocks in enumerate(self.block_res_blocks):
            for block in cast(nn.ModuleList, blocks):  # each level is a _res_stack
                x = block(x)
            if i < len(self.conv_blocks):
                x = self.conv_blocks[i](x)
        for block in self.res_blocks:
            x = block(x)
        return self.conv2(self.act(self.norm1(x)))


class TemporalDecoder(nn.Module):
    """conv1, ResBlocks, per-level ResBlocks (deepest first) with conv + depth-to-time upsampling, norm, conv_out."""

    def __init__(self, cfg: TemporalVAEConfig) -> None:
        super().__init__()
        widths = cfg.widths
        self.time_factors = tuple(2 if d else 1 for d in cfg.temporal_downsample)
        top = widths[-1]
        self.conv1 = CausalConv3d(cfg.latent_embed_dim, top, 3)
        self.res_blocks = _res_stack(top, top, cfg.num_res_blocks, cfg)
        blocks: list[nn.ModuleList] = [nn.ModuleList()] * len(widths)
        convs: list[nn.Module] = [nn.Identity()] * (len(widths) - 1)
        prev = top
        for i in reversed(range(len(widths))):
            blocks[i] = _res_stack(prev, widths[i], cfg.num_res_blocks, cfg)
            prev = widths[i]
            if i > 0:
                factor = self.time_factors[i - 1]
                convs[i - 1] = CausalConv3d(prev, prev * factor, 3) if factor > 1 else nn.Identity()
        self.block_res_blocks = nn.ModuleList(blocks)
        self.conv_blocks = nn.ModuleList(convs)
        self.norm1 = nn.GroupNorm(cfg.num_groups, prev)
        self.act = _activation(cfg.activation)
        self.conv_out = CausalConv3d(prev, cfg.in_out_channels, 3)

    def forward(self, z: Tensor) -> Tensor:
        """[B, latent, T, H, W] -> [B, in, T*f, H, W] (padding frames still in front)."""
        x = self.conv1(z)
        for block in self.res_blocks:
            x = block(x)
        for i in reversed(range(len(self.block_res_blocks))):
            for block in cast(nn.ModuleList, self.block_res_blocks[i]):  # each level is a _res_stack
                x = block(x)
            if i > 0:
                x = depth_to_time(self.conv_blocks[i - 1](x), self.time_factors[i - 1])
        return self.conv_out(self.act(self.norm1(x)))


def gaussian_mean(moments: Tensor) -> Tensor:
    """Mean half of [mean | logvar] moments along dim 1."""
    return moments.chunk(2, dim=1)[0]


def gaussian_sample(moments: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """mean + exp(logvar / 2) * eps with logvar clamped to [-30, 20]; eps drawn on the generator's device."""
    mean, logvar = moments.chunk(2, dim=1)
    std = torch.exp(0.5 * logvar.float().clamp(*LOGVAR_RANGE))
    gen_device = generator.device if generator is not None else torch.device("cpu")
    eps = torch.randn(mean.shape, generator=generator, dtype=torch.float32, device=gen_device)
    return (mean.float() + std * eps.to(mean.device)).to(mean.dtype)


class TemporalVAE(nn.Module):
    """Encoder, quant convs and decoder of `VAE_Temporal` (the checkpoint's `temporal_vae.*`)."""

    def __init__(self, config: TemporalVAEConfig | None = None) -> None:
        super().__init__()
        self.config = config or TemporalVAEConfig()
        cfg = self.config
        self.encoder = TemporalEncoder(cfg)
        self.quant_conv = CausalConv3d(2 * cfg.latent_embed_dim, 2 * cfg.embed_dim, 1)
        self.post_quant_conv = CausalConv3d(cfg.embed_dim, cfg.latent_embed_dim, 1)
        self.decoder = TemporalDecoder(cfg)

    @property
    def time_downsample_factor(self) -> int:
        """Frames per latent frame."""
        return self.config.time_downsample_factor

    def latent_frames(self, num_frames: int) -> int:
        """Latent frames for one independently encoded clip: ceil(num_frames / factor)."""
        return math.ceil(num_frames / self.time_downsample_factor)

    def encode_moments(self, x: Tensor) -> Tensor:
        """[B, in, T, H, W] -> [B, 2*embed, ceil(T/f), H, W] (mean | logvar), time front-padded with zeros first."""
        pad = time_padding(x.shape[2], self.time_downsample_factor)
        if pad:
            x = F.pad(x, (0, 0, 0, 0, pad, 0))
        return self.quant_conv(self.encoder(x)).to(x.dtype)

    def encode(self, x: Tensor, sample: bool = False, generator: torch.Generator | None = None) -> Tensor:
        """Posterior mean, or a sample from it when `sample` (reproducible with `generator`)."""
        moments = self.encode_moments(x)
        return gaussian_sample(moments, generator) if sample else gaussian_mean(moments)

    def decode(self, z: Tensor, num_frames: int) -> Tensor:
        """[B, embed, T, H, W] -> [B, in, num_frames, H, W], dropping the front padding of a num_frames clip."""
        factor = self.time_downsample_factor
        if not (z.shape[2] - 1) * factor < num_frames <= z.shape[2] * factor:
            raise ValueError(f"{z.shape[2]} latent frames decode to {(z.shape[2] - 1) * factor + 1}.."
                             f"{z.shape[2] * factor} frames, not {num_frames}")
        x = self.decoder(self.post_quant_conv(z))
        return x[:, :, time_padding(num_frames, factor):]


class TemporalPart(nn.Module):
    """The temporal VAE plus the latent statistics, named as in the checkpoint (`temporal_vae.*`, `scale`, `shift`)."""

    scale: Tensor  # buffers
    shift: Tensor

    def __init__(self, config: TemporalVAEConfig | None = None, shift: tuple[float, ...] = LATENT_SHIFT,
                 scale: tuple[float, ...] = LATENT_SCALE) -> None:
        super().__init__()
        self.temporal_vae = TemporalVAE(config)
        channels = self.temporal_vae.config.embed_dim
        if len(shift) != channels or len(scale) != channels:
            raise ValueError(f"shift and scale need {channels} values each, got {len(shift)} and {len(scale)}")
        self.register_buffer("scale", torch.tensor(scale, dtype=torch.float32).view(1, -1, 1, 1, 1))
        self.register_buffer("shift", torch.tensor(shift, dtype=torch.float32).view(1, -1, 1, 1, 1))

    @property
    def config(self) -> TemporalVAEConfig:
        """Configuration of the temporal VAE."""
        return self.temporal_vae.config

    def normalize(self, z: Tensor) -> Tensor:
        """Video latent -> model space: (z - shift) / scale per channel."""
        return (z - self.shift.to(z)) / self.scale.to(z)

    def denormalize(self, z: Tensor) -> Tensor:
        """Model space -> video latent: z * scale + shift per channel."""
        return z * self.scale.to(z) + self.shift.to(z)


__all__ = [
    "LATENT_SHIFT", "LATENT_SCALE", "TemporalVAEConfig", "time_padding", "CausalConv3d", "ResBlock", "depth_to_time",
    "TemporalEncoder", "TemporalDecoder", "TemporalVAE", "TemporalPart", "gaussian_mean", "gaussian_sample",
]
