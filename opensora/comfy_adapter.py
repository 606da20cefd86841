"""How STDiT3 meets ComfyUI, without importing ComfyUI: call mapping, sign, nominal video size, patches, memory.

ComfyUI's flow models (model type FLOW: CONST sampling with ModelSamplingDiscreteFlow, multiplier 1000) call the
network as ``diffusion_model(x, timestep, context=..., transformer_options=..., **extra_conds)`` with
``timestep = 1000 * sigma`` and read the output as ``out`` in ``denoised = x - sigma * out``. STDiT3 returns the
OpenSora velocity ``v = x0 - noise`` in its first 4 channels, so `comfy_forward` returns ``-v``; then
``denoised = x + sigma * v = x0`` and ComfyUI's Euler step equals OpenSora's (see opensora/sampler.py).

The nominal pixel size and fps, which STDiT3 needs for its position-embedding scale and fps embedding, do not
travel with ComfyUI's latent tensor. They come from ``transformer_options["opensora"]`` (a dict with the
`VIDEO_FIELDS`, set by the "OpenSora Model Sampling" node or any patch) when it fits the latent, otherwise
they are inferred from the latent shape (`infer_video`): an OpenSora preset size whose latent matches, else 8x
the latent size; fps 24 (the model sees 120 for a single frame, as in OpenSora).

A checkpoint trained at one fixed size (the toy-world model, see `toyworld/`) declares its own flow shift and
nominal video in its safetensors metadata under `FIXED_METADATA_KEY` ("toyworld": {"shift", "size", "frames",
...}). `fixed_sampling_from_metadata` turns that into a `FixedSampling`: the loader gives the model that shift
(instead of OpenSora's size-dependent one) and attaches it to the network as `fixed_sampling`, and
`comfy_forward` then passes that nominal size and frame count (the toy's latent has no temporal compression)
for every latent of the trained shape (`call_video`).

Block patches and the attention override reach STDiT3 as ComfyUI's DiTs get them: `comfy_forward` hands the
call's transformer_options to `STDiT3.forward` (keys `("spatial_block", i)` / `("temporal_block", i)` of
``patches_replace["dit"]``, and ``optimized_attention_override``; see `opensora.stdit3`). CHAI's Cache Attention
uses exactly these.

Attention patches: a callable stored with ``model_patcher.set_model_patch_replace(fn, "dit", "spatial_attn", i)``
(i.e. ``transformer_options["patches_replace"]["dit"][("spatial_attn", i)]``; ``"temporal_attn"`` for the
temporal blocks) becomes ``STDiT3.forward(..., attn_replace={("spatial_attn", i): fn})``: ``fn(call)`` gets an
`opensora.stdit3.SelfAttnCall` (q, k, v, the modulated input, the block ...) and returns the projected attention
output. ``call.info["transformer_options"]`` holds the options of the current model call (sigmas,
cond_or_uncond, sample_sigmas, per-clone state...).
"""
from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from .loading import CheckpointError
from .presets import (DEFAULT_FPS, IMAGE_SIZES, SPATIAL_COMPRESSION, VideoSpec, latent_hw, model_fps,
                      vae_latent_frames)
from .schedule import opensora_shift
from .stdit3 import STDiT3, STDiT3Config

log = logging.getLogger(__name__)

PATCH_GROUP = "dit"  # patches_replace group our attention keys live in (ComfyUI's DiT convention)
ATTN_KINDS = ("spatial_attn", "temporal_attn")
VIDEO_KEY = "opensora"  # LATENT dict key and transformer_options key holding the nominal video
VIDEO_FIELDS = ("height", "width", "num_frames", "fps")
DEFAULT_VIDEO = VideoSpec(240, 426, 51, DEFAULT_FPS)  # OpenSora 1.2 sample.py: 240p 9:16, "2s"
DEFAULT_SHIFT = opensora_shift(DEFAULT_VIDEO.height, DEFAULT_VIDEO.width, DEFAULT_VIDEO.num_frames)
MULTIPLIER = 1000.0  # ComfyUI model timestep = 1000 * sigma, OpenSora's timestep unit
FIXED_METADATA_KEY = "toyworld"  # safetensors metadata of a fixed-size checkpoint (JSON: shift, size, frames)

# Activation elements per token and hidden unit that one STDiT3 block keeps alive at its peak (residual, modulated
# input, fused qkv, normed q/k, attention output, projections: ~10, plus the MLP hidden and its GELU: 2 x ratio).
_ACTIVATION_WIDTHS = 10.0
# ComfyUI's memory_required with flash/SDPA attention: area * dtype_size * 0.01 * factor MiB (area = B*T*H*W).
_COMFY_MIB_PER_AREA_BYTE = 0.01


def attn_patch_key(kind: str, index: int) -> tuple[str, int]:
    """The patches_replace["dit"] key of one block's self-attention, e.g. ("spatial_attn", 0)."""
    if kind not in ATTN_KINDS:
        raise ValueError(f"attention kind must be one of {ATTN_KINDS}, got {kind!r}")
    if index < 0:
        raise ValueError(f"block index must be >= 0, got {index}")
    return kind, int(index)


def _with_options(fn: Callable[[Any], Tensor], options: Mapping[str, Any]) -> Callable[[Any], Tensor]:
    """Wrap an attention patch so that its call carries the model call's transformer_options."""

    def run(call: Any) -> Tensor:
        call.info["transformer_options"] = options
        return fn(call)

    return run


def attn_replace_from_options(transformer_options: Mapping[str, Any] | None) -> dict[tuple[str, int], Callable] | None:
    """STDiT3 `attn_replace` dict from transformer_options["patches_replace"]["dit"] (None when there is none)."""
    if not transformer_options:
        return None
    group = (transformer_options.get("patches_replace") or {}).get(PATCH_GROUP) or {}
    replace = {}
    for key, fn in group.items():
        # 3-tuple keys (with a transformer_index) and other block names belong to other models' conventions.
        if isinstance(key, tuple) and len(key) == 2 and key[0] in ATTN_KINDS:
            replace[(key[0], int(key[1]))] = _with_options(fn, transformer_options)
    return replace or None


def _preset_by_latent() -> dict[tuple[int, int], tuple[int, int]]:
    """Latent (rows, cols) -> nominal (height, width) of every OpenSora preset size."""
    table: dict[tuple[int, int], tuple[int, int]] = {}
    for sizes in IMAGE_SIZES.values():
        for height, width in sizes.values():
            table.setdefault(latent_hw(height, width), (height, width))
    return table


_PRESET_BY_LATENT = _preset_by_latent()


def nominal_size(latent_rows: int, latent_cols: int) -> tuple[int, int]:
    """Nominal pixel (height, width) for a latent size: the OpenSora preset that gives it, else 8x the latent."""
    key = (int(latent_rows), int(latent_cols))
    return _PRESET_BY_LATENT.get(key, (key[0] * SPATIAL_COMPRESSION, key[1] * SPATIAL_COMPRESSION))


def frames_for_latent(latent_frames: int) -> int:
    """Smallest pixel frame count whose VAE latent has `latent_frames` frames (15 -> 51, 1 -> 1)."""
    if latent_frames < 1:
        raise ValueError(f"latent frame count must be >= 1, got {latent_frames}")
    frames = max(1, (latent_frames - 1) * 17 // 5)  # a lower bound: 5 latent frames per 17 pixel frames
    while vae_latent_frames(frames) < latent_frames:
        frames += 1
    return frames


def infer_video(latent_shape: tuple[int, ...] | torch.Size, fps: float = DEFAULT_FPS) -> VideoSpec:
    """Nominal video for a latent [B, C, T, H, W] (or [B, C, H, W] for an image) recorded nowhere else."""
    if len(latent_shape) not in (4, 5):
        raise ValueError(f"an OpenSora latent is [B, C, T, H, W], got shape {list(latent_shape)}")
    t = latent_shape[2] if len(latent_shape) == 5 else 1
    height, width = nominal_size(latent_shape[-2], latent_shape[-1])
    return VideoSpec(height, width, frames_for_latent(int(t)), fps)


def video_from_dict(data: Mapping[str, Any]) -> VideoSpec:
    """VideoSpec from a {"height", "width", "num_frames", "fps"} dict (fps optional); ValueError when malformed."""
    if not isinstance(data, Mapping):
        raise ValueError(f"OpenSora video settings must be a dict with {VIDEO_FIELDS}, got {type(data).__name__}")
    missing = [k for k in VIDEO_FIELDS[:3] if k not in data]
    if missing:
        raise ValueError(f"OpenSora video settings lack {missing} (have {sorted(data)})")
    try:
        return VideoSpec(int(data["height"]), int(data["width"]), int(data["num_frames"]),
                         float(data.get("fps", DEFAULT_FPS)))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"bad OpenSora video settings {dict(data)}: {exc}") from exc


def video_to_dict(video: VideoSpec) -> dict[str, Any]:
    """The {"height", "width", "num_frames", "fps"} dict stored in LATENT["opensora"] and transformer_options."""
    return {k: v for k, v in asdict(video).items() if k in VIDEO_FIELDS}


def fits_latent(video: VideoSpec, latent_shape: tuple[int, ...] | torch.Size) -> bool:
    """True when the nominal video gives exactly this latent's T, H and W."""
    t = latent_shape[2] if len(latent_shape) == 5 else 1
    return (video.latent_frames, *latent_hw(video.height, video.width)) == (t, latent_shape[-2], latent_shape[-1])


_warned: set[tuple] = set()


def _warn_once(key: tuple, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message)


def video_for_latent(latent_shape: tuple[int, ...] | torch.Size, recorded: Any = None) -> VideoSpec:
    """The recorded nominal video when it fits the latent shape, otherwise the one inferred from the shape."""
    if recorded is not None:
        try:
            video = video_from_dict(recorded) if not isinstance(recorded, VideoSpec) else recorded
        except ValueError as exc:
            _warn_once(("bad", str(exc)), f"[CHAI] ignoring OpenSora video settings: {exc}")
        else:
            if fits_latent(video, latent_shape):
                return video
            _warn_once(("stale", video, tuple(latent_shape[2:])),
                       f"[CHAI] OpenSora video settings {video_to_dict(video)} do not fit the latent "
                       f"{list(latent_shape)}; using sizes inferred from the latent instead")
            return infer_video(latent_shape, video.fps)
    return infer_video(latent_shape)


def video_from_latent_dict(latent: Mapping[str, Any]) -> VideoSpec:
    """Nominal video of a ComfyUI LATENT dict: its "opensora" record if it fits "samples", else inferred."""
    return video_for_latent(tuple(latent["samples"].shape), latent.get(VIDEO_KEY))


@dataclass(frozen=True)
class FixedSampling:
    """What a checkpoint trained at one size declares: its flow shift and nominal video (latent frames = frames)."""

    shift: float
    height: int
    width: int
    num_frames: int
    fps: float = float(DEFAULT_FPS)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.shift) and self.shift > 0):
            raise ValueError(f"the flow shift must be a positive number, got {self.shift}")
        if min(self.height, self.width) < SPATIAL_COMPRESSION or self.num_frames < 1 or not self.fps > 0:
            raise ValueError(f"bad fixed video {self.height}x{self.width}, {self.num_frames} frames, {self.fps} fps")

    @property
    def latent_frames(self) -> int:
        """Latent frame count: the pixel-space latent has no temporal compression."""
        return self.num_frames


def fixed_sampling_from_metadata(metadata: Mapping[str, str] | None) -> FixedSampling | None:
    """The FixedSampling a checkpoint declares under FIXED_METADATA_KEY (None when it declares none)."""
    raw = (metadata or {}).get(FIXED_METADATA_KEY)
    if raw is None:
        return None
    try:
        facts = json.loads(raw)
        size, frames = int(facts["size"]), int(facts["frames"])
        return FixedSampling(shift=float(facts["shift"]), height=size * SPATIAL_COMPRESSION,
                             width=size * SPATIAL_COMPRESSION, num_frames=frames,
                             fps=float(facts.get("fps", DEFAULT_FPS)))
    except (TypeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"the checkpoint's {FIXED_METADATA_KEY!r} metadata is malformed ({exc}); it needs "
                              "JSON with a positive 'shift', 'size' (latent cells) and 'frames'") from exc


def call_video(model: STDiT3, latent_shape: tuple[int, ...] | torch.Size,
               transformer_options: Mapping[str, Any] | None = None) -> Any:
    """Nominal video of one model call: the model's fixed video when it fits the latent, else the record or shape."""
    fixed = getattr(model, "fixed_sampling", None)
    if fixed is not None and fits_latent(fixed, latent_shape):
        return fixed
    return video_for_latent(latent_shape, (transformer_options or {}).get(VIDEO_KEY))


def comfy_forward(model: STDiT3, x: Tensor, timestep: Tensor, context: Tensor | None,
                  transformer_options: Mapping[str, Any] | None = None) -> Tensor:
    """Run STDiT3 for a ComfyUI flow call and return the CONST-convention output -v = noise - x0 ([B, 4, T, H, W])."""
    if context is None:
        raise ValueError("STDiT3 needs text conditioning (T5 features); the CONDITIONING has no tensor")
    options = transformer_options or {}
    video = call_video(model, tuple(x.shape), options)
    out = STDiT3.forward(model, x, timestep, context, None, fps=model_fps(video.num_frames, video.fps),
                         height=video.height, width=video.width, attn_replace=attn_replace_from_options(options),
                         transformer_options=options)
    return -out[:, : model.config.in_channels]


def trim_padding(cross_attn: Tensor, attention_mask: Tensor | None) -> Tensor:
    """Drop padded T5 tokens (mask 0) from a [1, L, C] conditioning; OpenSora's model only sees valid tokens."""
    if attention_mask is None:
        return cross_attn
    mask = attention_mask.reshape(attention_mask.shape[0], -1).to(torch.bool)
    if cross_attn.shape[0] != 1 or mask.shape[0] != 1 or mask.shape[1] != cross_attn.shape[1]:
        return cross_attn  # a batched or foreign mask: leave it alone rather than guess
    keep = mask[0].to(cross_attn.device)
    if not bool(keep.any()):
        raise ValueError("the text conditioning's attention mask marks no valid token")
    return cross_attn[:, keep]


def memory_usage_factor(config: STDiT3Config) -> float:
    """ComfyUI memory_usage_factor for an STDiT3: peak block activations per latent cell, in ComfyUI's units."""
    per_token = config.hidden_size * (_ACTIVATION_WIDTHS + 2.0 * config.mlp_ratio)  # elements
    per_cell = per_token / math.prod(config.patch_size)
    return per_cell / (_COMFY_MIB_PER_AREA_BYTE * 2**20)


__all__ = [
    "PATCH_GROUP", "ATTN_KINDS", "VIDEO_KEY", "VIDEO_FIELDS", "DEFAULT_VIDEO", "DEFAULT_SHIFT", "MULTIPLIER",
    "FIXED_METADATA_KEY", "FixedSampling", "fixed_sampling_from_metadata", "call_video",
    "attn_patch_key", "attn_replace_from_options", "nominal_size", "frames_for_latent", "infer_video",
    "video_from_dict", "video_to_dict", "fits_latent", "video_for_latent", "video_from_latent_dict",
    "comfy_forward", "trim_padding", "memory_usage_factor",
]
