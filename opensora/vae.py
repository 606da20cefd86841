"""The OpenSora 1.2 video VAE pipeline (`OpenSoraVAE_V1_2`): a 2-D VAE per frame, then the causal temporal VAE.

Arithmetic, as Open-Sora's `VideoAutoencoderPipeline` does it:

- encode: every frame through the 2-D VAE (micro-batches of 4 frames), latents times 0.18215; the 2-D latent video
  is cut into 17-frame chunks, each front-padded with zero frames to a multiple of 4 and encoded independently
  (17 -> 5 latent frames, a remainder of r frames -> ceil(r / 4)); the per-channel statistics then give the model
  latent (z - shift) / scale.
- decode: z * scale + shift, then chunks of 5 latent frames (the matching 17-frame chunk), each decoded to
  4 frames per latent frame with the chunk's front padding dropped, then every frame through the 2-D decoder
  after dividing by 0.18215. The frame count is needed to know the last chunk's padding.
- spatial sizes are floored to multiples of 8 by the 2-D VAE (240x426 -> 30x53 latents -> 240x424 pixels).

The 2-D VAE is injected (`SpatialVAE`: ComfyUI's own VAE in the glue, a test double in tests); it works on raw
latents, the 0.18215 scale lives here. Memory is bounded by running the temporal part chunk by chunk and the 2-D
part in micro-batches, optionally in overlapping spatial tiles that are blended linearly.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from .presets import SPATIAL_COMPRESSION, VAE_CHUNK_FRAMES, VAE_TIME_DOWNSAMPLE, latent_hw, vae_latent_frames
from .vae_temporal import TemporalPart, gaussian_mean, gaussian_sample, time_padding

SPATIAL_SCALE = 0.18215  # Open-Sora hard-codes the SD1.x factor for its SDXL VAE
MICRO_BATCH_FRAMES = 4
CHUNK_LATENT_FRAMES = vae_latent_frames(VAE_CHUNK_FRAMES)  # 5

Progress = Callable[[int, int], None]


@runtime_checkable
class SpatialVAE(Protocol):
    """The per-frame 2-D VAE: raw latents (no 0.18215), pixels in [-1, 1], [N, C, H, W] tensors."""

    def encode(self, frames: Tensor) -> Tensor:
        """[N, 3, H, W] -> [N, 4, H // 8, W // 8] posterior mean."""
        ...

    def decode(self, latents: Tensor) -> Tensor:
        """[N, 4, h, w] -> [N, 3, 8h, 8w]."""
        ...


@dataclass(frozen=True)
class Chunk:
    """One independently encoded clip: its pixel frames, front padding and latent frames."""

    frame_start: int
    frames: int
    padding: int
    latent_start: int
    latents: int


def chunk_plan(num_frames: int, chunk_frames: int = VAE_CHUNK_FRAMES,
               factor: int = VAE_TIME_DOWNSAMPLE) -> list[Chunk]:
    """How `num_frames` frames split into chunks (17 frames -> 3 padding frames -> 5 latents each)."""
    if num_frames < 1:
        raise ValueError(f"num_frames must be >= 1, got {num_frames}")
    plan, latent = [], 0
    for start in range(0, num_frames, chunk_frames):
        frames = min(chunk_frames, num_frames - start)
        pad = time_padding(frames, factor)
        plan.append(Chunk(start, frames, pad, latent, (frames + pad) // factor))
        latent += plan[-1].latents
    return plan


def default_num_frames(latent_frames: int, chunk_frames: int = VAE_CHUNK_FRAMES,
                       factor: int = VAE_TIME_DOWNSAMPLE) -> int:
    """Frame count assumed for a latent that does not say: the smallest that fits, i.e. 17 frames per 5 latents
    and 4r - 3 frames (full front padding) for a last chunk of r latents, so 1 latent frame is 1 image."""
    if latent_frames < 1:
        raise ValueError(f"latent_frames must be >= 1, got {latent_frames}")
    full, rest = divmod(latent_frames, -(-chunk_frames // factor))
    return full * chunk_frames + (rest * factor - (factor - 1) if rest else 0)


@dataclass(frozen=True)
class Tiling:
    """Overlapping spatial tiles, sizes in latent pixels (x8 in the image); `temporal` tiles the 3-D part too."""

    tile: int = 64
    overlap: int = 16
    temporal: bool = False

    def __post_init__(self) -> None:
        if self.tile < 8:
            raise ValueError(f"tile must be >= 8 latent pixels, got {self.tile}")
        if not 0 <= self.overlap < self.tile:
            raise ValueError(f"overlap must be in [0, tile), got {self.overlap} for tile {self.tile}")


def tile_starts(size: int, tile: int, overlap: int) -> list[int]:
    """Start offsets of tiles of `tile` covering `size` with at least `overlap` shared; the last is end-aligned."""
    if size <= tile:
        return [0]
    starts = list(range(0, size - tile, tile - overlap))
    return starts + [size - tile]


def _ramp(length: int, start: int, size: int, overlap: int, up: int, device: torch.device) -> Tensor:
    """1-D blending weights for one tile: linear ramps over the overlap where a neighbour exists."""
    w = torch.ones(length * up, device=device)
    n = min(overlap * up, length * up)
    if n == 0:
        return w
    ramp = (torch.arange(n, device=device, dtype=torch.float32) + 0.5) / n
    if start > 0:
        w[:n] = torch.minimum(w[:n], ramp)
    if start + length < size:
        w[-n:] = torch.minimum(w[-n:], ramp.flip(0))
    return w


def tiled_apply(fn: Callable[[Tensor], Tensor], x: Tensor, tile: int, overlap: int, up: int,
                out_device: torch.device | str | None = None) -> Tensor:
    """Apply `fn` (which scales the last two dims by `up`) tile by tile over x's last two dims and blend the tiles."""
    h, w = x.shape[-2:]
    out_device = torch.device(out_device) if out_device is not None else x.device
    out: Tensor | None = None
    weight: Tensor | None = None
    for top in tile_starts(h, tile, overlap):
        for left in tile_starts(w, tile, overlap):
            th, tw = min(tile, h), min(tile, w)
            y = fn(x[..., top:top + th, left:left + tw]).to(out_device, torch.float32)
            if out is None or weight is None:
                out = torch.zeros(*y.shape[:-2], h * up, w * up, device=out_device)
                weight = torch.zeros(h * up, w * up, device=out_device)
            mask = (_ramp(th, top, h, overlap, up, out_device)[:, None]
                    * _ramp(tw, left, w, overlap, up, out_device)[None, :])
            rows, cols = slice(top * up, (top + th) * up), slice(left * up, (left + tw) * up)
            out[..., rows, cols] += y * mask
            weight[rows, cols] += mask
    if out is None or weight is None:
        raise ValueError(f"no tiles cover a {h}x{w} input (tile {tile}, overlap {overlap})")
    return out / weight


class OpenSoraVAE:
    """Encode videos to OpenSora 1.2 latents and decode them back, with Open-Sora's chunking and normalisation."""

    def __init__(self, temporal: TemporalPart, spatial: SpatialVAE, *, micro_batch: int = MICRO_BATCH_FRAMES,
                 chunk_frames: int = VAE_CHUNK_FRAMES, spatial_scale: float = SPATIAL_SCALE,
                 tiling: Tiling | None = None, output_device: torch.device | str = "cpu") -> None:
        if micro_batch < 1:
            raise ValueError(f"micro_batch must be >= 1, got {micro_batch}")
        if chunk_frames < 1:
            raise ValueError(f"chunk_frames must be >= 1, got {chunk_frames}")
        self.temporal = temporal
        self.spatial = spatial
        self.micro_batch = micro_batch
        self.chunk_frames = chunk_frames
        self.spatial_scale = spatial_scale
        self.tiling = tiling
        self.output_device = torch.device(output_device)

    # ------------------------------------------------------------------------------------------ arithmetic

    @property
    def time_factor(self) -> int:
        """Frames per latent frame inside a chunk (4)."""
        return self.temporal.config.time_downsample_factor

    @property
    def latent_channels(self) -> int:
        """Channels of the video latent (4)."""
        return self.temporal.config.embed_dim

    def plan(self, num_frames: int) -> list[Chunk]:
        """Chunks for `num_frames` frames with this pipeline's chunk size and time factor."""
        return chunk_plan(num_frames, self.chunk_frames, self.time_factor)

    def latent_frames(self, num_frames: int) -> int:
        """Latent frame count for `num_frames` frames."""
        return sum(c.latents for c in self.plan(num_frames))

    def default_num_frames(self, latent_frames: int) -> int:
        """Frames assumed when a latent does not record its frame count (see `default_num_frames`)."""
        return default_num_frames(latent_frames, self.chunk_frames, self.time_factor)

    def latent_shape(self, num_frames: int, height: int, width: int, batch: int = 1) -> tuple[int, ...]:
        """[B, 4, T, H // 8, W // 8] for a video of that size."""
        return (batch, self.latent_channels, self.latent_frames(num_frames), *latent_hw(height, width))

    def _temporal_device_dtype(self) -> tuple[torch.device, torch.dtype]:
        p = next(self.temporal.parameters())
        return p.device, p.dtype

    # ------------------------------------------------------------------------------------------ encode

    def _spatial_encode(self, frames: Tensor, sample: bool, generator: torch.Generator | None) -> Tensor:
        """[N, 3, H, W] -> scaled 2-D latents [N, 4, h, w] (float32), `micro_batch` frames at a time."""
        parts = []
        for i in range(0, frames.shape[0], self.micro_batch):
            batch = frames[i:i + self.micro_batch]
            if sample and hasattr(self.spatial, "encode_moments"):
                lat = gaussian_sample(self.spatial.encode_moments(batch).float(), generator)
            else:
                lat = self.spatial.encode(batch).float()
            parts.append(lat * self.spatial_scale)
        return torch.cat(parts)

    @torch.no_grad()
    def encode(self, video: Tensor, *, sample: bool = False, seed: int | None = None,
               generator: torch.Generator | None = None, normalize: bool = True,
               progress: Progress | None = None) -> Tensor:
        """[B, 3, N, H, W] pixels in [-1, 1] -> [B, 4, T, H // 8, W // 8] latents (float32, on output_device).

        `sample` draws from both posteriors as Open-Sora does (the 2-D one only if the spatial VAE has
        `encode_moments`), reproducibly from `seed` or `generator`; otherwise the posterior means are used.
        `normalize` returns model-space latents (z - shift) / scale, else the raw temporal latents.
        """
        if video.ndim != 5 or video.shape[1] != 3:
            raise ValueError(f"expected a video [B, 3, N, H, W], got {list(video.shape)}")
        if sample and generator is None:
            generator = torch.Generator("cpu")
            if seed is not None:
                generator.manual_seed(int(seed))
            else:
                generator.seed()
        b, _, n, h, w = video.shape
        plan = self.plan(n)
        out = torch.empty(b, self.latent_channels, plan[-1].latent_start + plan[-1].latents, *latent_hw(h, w),
                          device=self.output_device)
        device, dtype = self._temporal_device_dtype()
        for index, chunk in enumerate(plan):
            clip = video[:, :, chunk.frame_start:chunk.frame_start + chunk.frames]
            frames = clip.permute(0, 2, 1, 3, 4).reshape(b * chunk.frames, 3, h, w)
            lat2d = self._spatial_encode(frames, sample, generator)
            lat2d = lat2d.reshape(b, chunk.frames, *lat2d.shape[1:]).permute(0, 2, 1, 3, 4)
            moments = self._temporal_encode(lat2d.to(device, dtype))
            z = gaussian_sample(moments, generator) if sample else gaussian_mean(moments)
            z = z.float()
            if normalize:
                z = self.temporal.normalize(z)
            out[:, :, chunk.latent_start:chunk.latent_start + chunk.latents] = z.to(self.output_device)
            if progress is not None:
                progress(index + 1, len(plan))
        return out

    def _temporal_encode(self, lat2d: Tensor) -> Tensor:
        """Moments of one chunk, tiled spatially when tiling.temporal is set."""
        vae = self.temporal.temporal_vae
        tiling = self.tiling
        if tiling is None or not tiling.temporal:
            return vae.encode_moments(lat2d)
        return tiled_apply(vae.encode_moments, lat2d, tiling.tile, tiling.overlap, 1).to(lat2d.dtype)

    # ------------------------------------------------------------------------------------------ decode

    def _spatial_decode(self, lat2d: Tensor, tiling: Tiling | None) -> Tensor:
        """[N, 4, h, w] scaled 2-D latents -> [N, 3, 8h, 8w] float32 on output_device, in micro-batches."""
        n, _, h, w = lat2d.shape
        out = torch.empty(n, 3, h * SPATIAL_COMPRESSION, w * SPATIAL_COMPRESSION, device=self.output_device)
        for i in range(0, n, self.micro_batch):
            batch = lat2d[i:i + self.micro_batch] / self.spatial_scale
            if tiling is not None and (h > tiling.tile or w > tiling.tile):
                pix = tiled_apply(self.spatial.decode, batch, tiling.tile, tiling.overlap, SPATIAL_COMPRESSION,
                                  self.output_device)
            else:
                pix = self.spatial.decode(batch)
            out[i:i + batch.shape[0]] = pix.to(self.output_device, torch.float32)
        return out

    def _temporal_decode(self, z: Tensor, frames: int, tiling: Tiling | None) -> Tensor:
        """One chunk of latents -> its 2-D latents [B, 4, frames, h, w], tiled when tiling.temporal is set."""
        vae = self.temporal.temporal_vae
        if tiling is None or not tiling.temporal:
            return vae.decode(z, frames)
        return tiled_apply(lambda t: vae.decode(t, frames), z, tiling.tile, tiling.overlap, 1).to(z.dtype)

    @torch.no_grad()
    def iter_decode(self, z: Tensor, num_frames: int | None = None, *, normalized: bool = True,
                    tiling: Tiling | None = None) -> Iterator[tuple[int, Tensor]]:
        """Yield (first frame index, pixels [B, 3, n, 8h, 8w] in about [-1, 1]) chunk by chunk."""
        if z.ndim != 5 or z.shape[1] != self.latent_channels:
            raise ValueError(f"expected latents [B, {self.latent_channels}, T, h, w], got {list(z.shape)}")
        latent_frames = z.shape[2]
        if num_frames is None:
            num_frames = self.default_num_frames(latent_frames)
        if num_frames < 1 or self.latent_frames(num_frames) != latent_frames:
            raise ValueError(f"a latent with {latent_frames} frames cannot decode to {num_frames} frames "
                             f"({num_frames} frames give {self.latent_frames(max(num_frames, 1))} latent frames); "
                             f"e.g. {self.default_num_frames(latent_frames)} frames fit")
        plan = self.plan(num_frames)
        tiling = tiling if tiling is not None else self.tiling
        device, dtype = self._temporal_device_dtype()
        b = z.shape[0]
        for chunk in plan:
            zc = z[:, :, chunk.latent_start:chunk.latent_start + chunk.latents].float()
            if normalized:
                zc = self.temporal.denormalize(zc.to(self.temporal.scale.device))
            lat2d = self._temporal_decode(zc.to(device, dtype), chunk.frames, tiling).float()
            _, c, n, h, w = lat2d.shape
            frames = self._spatial_decode(lat2d.permute(0, 2, 1, 3, 4).reshape(b * n, c, h, w), tiling)
            yield chunk.frame_start, frames.reshape(b, n, *frames.shape[1:]).permute(0, 2, 1, 3, 4)

    def decode(self, z: Tensor, num_frames: int | None = None, *, normalized: bool = True,
               tiling: Tiling | None = None, progress: Progress | None = None) -> Tensor:
        """[B, 4, T, h, w] latents -> [B, 3, num_frames, 8h, 8w] pixels (float32, unclamped, on output_device).

        `num_frames` defaults to `default_num_frames(T)` (exact for 1 and 17k frames); `normalized` says whether z
        is in model space ((z - shift) / scale, what `encode` returns by default).
        """
        frames = num_frames if num_frames is not None else self.default_num_frames(z.shape[2])
        total = len(self.plan(frames))
        out = torch.empty(z.shape[0], 3, frames, z.shape[3] * SPATIAL_COMPRESSION, z.shape[4] * SPATIAL_COMPRESSION,
                          device=self.output_device)
        for index, (start, pixels) in enumerate(self.iter_decode(z, frames, normalized=normalized, tiling=tiling)):
            out[:, :, start:start + pixels.shape[2]] = pixels
            if progress is not None:
                progress(index + 1, total)
        return out


__all__ = [
    "SPATIAL_SCALE", "MICRO_BATCH_FRAMES", "CHUNK_LATENT_FRAMES", "SpatialVAE", "Chunk", "chunk_plan",
    "default_num_frames", "Tiling", "tile_starts", "tiled_apply", "OpenSoraVAE",
]
