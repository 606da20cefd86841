"""ComfyUI glue for the OpenSora VAE v1.2: ComfyUI's own VAE runs the 2-D part, `TemporalPart` the temporal part.

ComfyUI is imported lazily inside the functions, so importing this module needs only torch.

`OpenSoraComfyVAE` carries the `OpenSoraVAE` pipeline and also offers the methods ComfyUI's VAEDecode, VAEDecodeTiled,
VAEEncode and VAEEncodeTiled nodes call (`decode`, `decode_tiled`, `encode`, `encode_tiled` and the compression
queries), so the loader's VAE output works with those nodes too. They see only the latent tensor, not the LATENT
dict, so they decode `default_num_frames(T)` frames (exact for images and 17k-frame videos: 1, 51, 102, 204, 408);
the CHAI decode node reads the frame count the empty-latent node recorded.

LATENT convention: `latent["samples"]` holds OpenSora model-space latents [B, 4, T, H/8, W/8], i.e. the temporal
VAE's output already normalised as (z - shift) / scale, exactly what Open-Sora's VAE `encode` returns and STDiT3
samples in (so the model's ComfyUI latent format must be the identity). Nominal video facts, when known, are in
`latent["opensora"]` (LATENT_INFO_KEY): {"height": int, "width": int (nominal pixels, e.g. 240 x 426),
"num_frames": int, "fps": float}.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Mapping

import torch
from torch import Tensor

from .loading import CheckpointError
from .presets import DEFAULT_FPS, vae_latent_frames
from .vae import MICRO_BATCH_FRAMES, OpenSoraVAE, Tiling, default_num_frames
from .vae_loading import load_opensora_vae_file
from .vae_temporal import TemporalPart

log = logging.getLogger(__name__)

LATENT_INFO_KEY = "opensora"
DIFFUSERS_SIGNATURE = "decoder.up_blocks.0.resnets.0.norm1.weight"
TEMPORAL_DTYPES = ("auto", "fp32", "bf16", "fp16")


# ---------------------------------------------------------------------------------------------- LATENT dict

def latent_info(latent: Mapping[str, Any]) -> dict[str, Any]:
    """The `opensora` facts recorded in a LATENT dict ({} when absent), values type-checked."""
    info = latent.get(LATENT_INFO_KEY) or {}
    if not isinstance(info, Mapping):
        return {}
    out: dict[str, Any] = {}
    for key, kind in (("height", int), ("width", int), ("num_frames", int), ("fps", float)):
        value = info.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            out[key] = kind(value)
    return out


def make_latent_info(height: int, width: int, num_frames: int, fps: float = DEFAULT_FPS) -> dict[str, Any]:
    """The `latent["opensora"]` dict for a video of that nominal size."""
    return {"height": int(height), "width": int(width), "num_frames": int(num_frames), "fps": float(fps)}


def frames_for_latent(latent: Mapping[str, Any], override: int = 0) -> int:
    """Frame count to decode: `override` if > 0, else the recorded num_frames, else default_num_frames(T)."""
    t = latent["samples"].shape[2]
    frames = override if override > 0 else latent_info(latent).get("num_frames") or default_num_frames(t)
    if vae_latent_frames(frames) != t:
        source = "num_frames input" if override > 0 else f"latent[{LATENT_INFO_KEY!r}]['num_frames']"
        raise ValueError(f"the {source} says {frames} frames, which encode to {vae_latent_frames(frames)} latent "
                         f"frames, but the latent has {t}; use 0 for the default ({default_num_frames(t)} frames)")
    return frames


# ---------------------------------------------------------------------------------------------- 2-D part

def infer_ldm_vae_config(sd: Mapping[str, Tensor]) -> tuple[dict[str, Any], int]:
    """(ddconfig, embed_dim) for ComfyUI's AutoencoderKL from an LDM-named 2-D VAE state dict's shapes."""
    def need(key: str) -> tuple[int, ...]:
        if key not in sd:
            raise CheckpointError(f"the 2-D VAE part has no {key!r}; it is not an SD/SDXL-style AutoencoderKL")
        return tuple(sd[key].shape)

    ch, in_channels = need("encoder.conv_in.weight")[:2]
    levels = sorted({int(k.split(".")[2]) for k in sd if k.startswith("encoder.down.")})
    blocks = sorted({int(k.split(".")[4]) for k in sd if k.startswith("encoder.down.0.block.")})
    if not levels or not blocks:
        raise CheckpointError("the 2-D VAE part has no encoder.down.* blocks")
    mult = [need(f"encoder.down.{i}.block.0.conv2.weight")[0] // ch for i in levels]
    z_channels = need("decoder.conv_in.weight")[1]
    double_z = need("encoder.conv_out.weight")[0] == 2 * z_channels
    resolution = 256
    attn = [resolution >> i for i in levels if f"encoder.down.{i}.attn.0.q.weight" in sd]
    ddconfig = {"double_z": double_z, "z_channels": z_channels, "resolution": resolution,
                "in_channels": in_channels, "out_ch": need("decoder.conv_out.weight")[0], "ch": ch, "ch_mult": mult,
                "num_res_blocks": len(blocks), "attn_resolutions": attn, "dropout": 0.0}
    embed_dim = need("post_quant_conv.weight")[1]
    return ddconfig, embed_dim


def build_spatial_vae(spatial_sd: Mapping[str, Tensor], device: Any = None, dtype: Any = None) -> Any:
    """ComfyUI's `comfy.sd.VAE` for the 2-D part (diffusers or LDM names), its shape read from the tensors."""
    import comfy.diffusers_convert
    import comfy.sd

    sd = dict(spatial_sd)
    if DIFFUSERS_SIGNATURE in sd:
        sd = comfy.diffusers_convert.convert_vae_state_dict(sd)
    left = sorted(k for k in sd if "down_blocks." in k or "up_blocks." in k or "mid_block." in k)
    if left:
        raise CheckpointError(f"ComfyUI's VAE converter left {len(left)} diffusers names unconverted (e.g. "
                              f"{left[0]}); it handles the SD/SDXL layout of 4 levels with 2 res blocks")
    ddconfig, embed_dim = infer_ldm_vae_config(sd)
    if ddconfig["z_channels"] != 4 or len(ddconfig["ch_mult"]) != 4:
        raise CheckpointError(f"the 2-D VAE part has {ddconfig['z_channels']} latent channels and "
                              f"{len(ddconfig['ch_mult'])} levels; OpenSora's is an 8x, 4-channel SDXL VAE")
    vae = comfy.sd.VAE(sd=sd, device=device, dtype=dtype,
                       config={"params": {"ddconfig": ddconfig, "embed_dim": embed_dim}})
    missing = sorted(set(vae.first_stage_model.state_dict()) - set(sd))
    if missing:
        raise CheckpointError(f"the 2-D VAE part lacks {len(missing)} tensors ComfyUI's VAE needs, e.g. "
                              f"{', '.join(missing[:5])}")
    return vae


class ComfySpatialVAE:
    """`SpatialVAE` over a `comfy.sd.VAE`: calls its AutoencoderKL directly on [-1, 1] frames, raw latents.

    The model is not cropped to multiples of 8 first (ComfyUI's VAE.encode would centre-crop): the SDXL encoder
    itself floors, as in Open-Sora (426 columns -> 53 latents from all 426).
    """

    def __init__(self, vae: Any) -> None:
        self.vae = vae

    def _model_input(self, x: Tensor) -> Tensor:
        return x.to(self.vae.device, self.vae.vae_dtype)

    def encode(self, frames: Tensor) -> Tensor:
        """[N, 3, H, W] -> posterior mean [N, 4, H // 8, W // 8]."""
        return self.vae.first_stage_model.encode(self._model_input(frames)).float()

    def encode_moments(self, frames: Tensor) -> Tensor:
        """[N, 3, H, W] -> [mean | logvar] [N, 8, H // 8, W // 8]."""
        model = self.vae.first_stage_model
        return model.quant_conv(model.encoder(self._model_input(frames))).float()

    def decode(self, latents: Tensor) -> Tensor:
        """[N, 4, h, w] raw latents -> [N, 3, 8h, 8w] in about [-1, 1]."""
        return self.vae.first_stage_model.decode(self._model_input(latents)).float()


# ---------------------------------------------------------------------------------------------- the VAE object

def resolve_temporal_dtype(choice: str, device: torch.device) -> torch.dtype:
    """torch dtype for the loader's dtype choice; 'auto' asks ComfyUI (bf16 where it is fast, else fp32)."""
    if choice not in TEMPORAL_DTYPES:
        raise ValueError(f"unknown dtype {choice!r}; choose one of {', '.join(TEMPORAL_DTYPES)}")
    if choice == "auto":
        import comfy.model_management as mm

        return mm.vae_dtype(device, [torch.bfloat16, torch.float32])
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[choice]


def pixels_to_images(pixels: Tensor) -> Tensor:
    """[B, 3, n, H, W] in [-1, 1] -> [B, n, H, W, 3] in [0, 1] (Open-Sora clamps the same way)."""
    return ((pixels.clamp(-1.0, 1.0) + 1.0) / 2.0).permute(0, 2, 3, 4, 1)


def images_to_pixels(images: Tensor) -> Tensor:
    """ComfyUI IMAGE [N, H, W, C] (one video) or [B, N, H, W, C] -> [B, 3, N, H, W] in [-1, 1]."""
    if images.ndim == 4:
        images = images.unsqueeze(0)
    if images.ndim != 5 or images.shape[-1] < 3:
        raise ValueError(f"expected IMAGE frames [N, H, W, 3], got {list(images.shape)}")
    return images[..., :3].permute(0, 4, 1, 2, 3).float() * 2.0 - 1.0


class OpenSoraComfyVAE:
    """The OpenSora VAE v1.2 as a ComfyUI VAE object: 2-D part in ComfyUI's VAE, temporal part in `TemporalPart`."""

    latent_dim = 3
    latent_channels = 4
    output_channels = 3
    not_video = False
    crop_input = False

    def __init__(self, spatial: Any, temporal: TemporalPart, name: str = "OpenSora VAE v1.2") -> None:
        import comfy.model_management as mm
        import comfy.model_patcher

        self.name = name
        self.spatial_vae = spatial
        self.temporal = temporal
        self.device = spatial.device
        self.vae_dtype = spatial.vae_dtype
        self.temporal_dtype = next(temporal.parameters()).dtype
        self.output_device = mm.intermediate_device()
        self.temporal_patcher = comfy.model_patcher.ModelPatcher(temporal, load_device=mm.vae_device(),
                                                                 offload_device=mm.vae_offload_device())
        self.patcher = spatial.patcher
        self.pipeline = OpenSoraVAE(temporal, ComfySpatialVAE(spatial), micro_batch=MICRO_BATCH_FRAMES,
                                    output_device=self.output_device)
        self.downscale_ratio = (lambda frames: vae_latent_frames(max(1, int(frames))), 8, 8)
        self.upscale_ratio = (lambda latents: default_num_frames(max(1, int(latents))), 8, 8)
        self.downscale_index_formula = None
        self.upscale_index_formula = None
        self.extra_1d_channel = None

    # -- memory -------------------------------------------------------------------------------------

    def memory_used_decode(self, shape: tuple[int, ...], dtype: torch.dtype) -> float:
        """Bytes one chunk needs: a 4-frame 2-D decode micro-batch plus the temporal decoder's widest activation."""
        h, w = shape[-2], shape[-1]
        spatial = self.spatial_vae.memory_used_decode((MICRO_BATCH_FRAMES, 4, h, w), self.vae_dtype)
        size = torch.finfo(self.temporal_dtype).bits // 8
        temporal = 3 * 1024 * 10 * h * w * size  # conv_blocks.2 output: 1024 channels x 10 frames, plus in/out
        return spatial + temporal

    def memory_used_encode(self, shape: tuple[int, ...], dtype: torch.dtype) -> float:
        """Bytes one chunk needs: a 4-frame 2-D encode micro-batch plus the temporal encoder's first level."""
        h, w = shape[-2], shape[-1]
        spatial = self.spatial_vae.memory_used_encode((MICRO_BATCH_FRAMES, 3, h, w), self.vae_dtype)
        size = torch.finfo(self.temporal_dtype).bits // 8
        return spatial + 3 * 256 * 20 * (h // 8) * (w // 8) * size

    def _load(self, memory: float) -> None:
        """Ask ComfyUI to make room and put both parts on the VAE device."""
        import comfy.model_management as mm

        mm.load_models_gpu([self.spatial_vae.patcher, self.temporal_patcher], memory_required=memory,
                           force_full_load=True)

    # -- pipeline with ComfyUI progress and interruption --------------------------------------------

    def decode_video(self, samples: Tensor, num_frames: int | None = None, tiling: Tiling | None = None) -> Tensor:
        """[B, 4, T, h, w] model-space latents -> IMAGE frames [B, N, 8h, 8w, 3] in [0, 1]."""
        import comfy.model_management as mm
        import comfy.utils

        if samples.ndim != 5 or samples.shape[1] != self.latent_channels:
            raise ValueError(f"an OpenSora latent is [B, 4, T, H/8, W/8]; got {list(samples.shape)}")
        frames = num_frames or default_num_frames(samples.shape[2])
        tile_hw = (tiling.tile, tiling.tile) if tiling else samples.shape[-2:]
        self._load(self.memory_used_decode(tuple(tile_hw), self.vae_dtype))
        b, _, _, h, w = samples.shape
        out = torch.empty(b, frames, h * 8, w * 8, 3, device=self.output_device)
        plan = self.pipeline.plan(frames)
        pbar = comfy.utils.ProgressBar(len(plan))
        for start, pixels in self.pipeline.iter_decode(samples, frames, tiling=tiling):
            out[:, start:start + pixels.shape[2]] = pixels_to_images(pixels).to(self.output_device)
            pbar.update(1)
            mm.throw_exception_if_processing_interrupted()
        return out

    def encode_video(self, images: Tensor, sample: bool = False, seed: int | None = None) -> Tensor:
        """IMAGE frames [N, H, W, 3] (or [B, N, H, W, 3]) in [0, 1] -> model-space latents [B, 4, T, H/8, W/8]."""
        import comfy.model_management as mm
        import comfy.utils

        pixels = images_to_pixels(images)
        self._load(self.memory_used_encode(tuple(pixels.shape[-2:]), self.vae_dtype))
        plan = self.pipeline.plan(pixels.shape[2])
        pbar = comfy.utils.ProgressBar(len(plan))

        def progress(done: int, total: int) -> None:
            pbar.update_absolute(done, total)
            mm.throw_exception_if_processing_interrupted()

        return self.pipeline.encode(pixels, sample=sample, seed=seed, progress=progress)

    # -- what ComfyUI's own VAE nodes call ----------------------------------------------------------

    def throw_exception_if_invalid(self) -> None:
        """Always valid once built (ComfyUI's VAE API)."""

    def decode(self, samples_in: Tensor, vae_options: Mapping[str, Any] | None = None) -> Tensor:
        """ComfyUI VAE API: latents -> [B, N, H, W, 3] with the default frame count for T latent frames."""
        return self.decode_video(samples_in)

    def decode_tiled(self, samples: Tensor, tile_x: int | None = None, tile_y: int | None = None,
                     overlap: int | None = None, tile_t: int | None = None, overlap_t: int | None = None) -> Tensor:
        """ComfyUI VAE API: spatially tiled decode (tile sizes in latent pixels; temporal tiling is by chunks)."""
        tile = max(8, min(tile_x or 64, tile_y or 64))
        tiling = Tiling(tile=tile, overlap=max(0, min(overlap if overlap is not None else 16, tile - 1)))
        return self.decode_video(samples, tiling=tiling)

    def encode(self, pixel_samples: Tensor) -> Tensor:
        """ComfyUI VAE API: IMAGE frames -> [1, 4, T, H/8, W/8] posterior-mean model-space latents."""
        return self.encode_video(pixel_samples)

    def encode_tiled(self, pixel_samples: Tensor, tile_x: int | None = None, tile_y: int | None = None,
                     overlap: int | None = None, tile_t: int | None = None, overlap_t: int | None = None) -> Tensor:
        """ComfyUI VAE API: same as encode (chunks and micro-batches already bound the memory)."""
        return self.encode_video(pixel_samples)

    def spacial_compression_decode(self) -> int:
        """Pixels per latent pixel (ComfyUI's spelling)."""
        return 8

    def spacial_compression_encode(self) -> int:
        """Pixels per latent pixel (ComfyUI's spelling)."""
        return 8

    def temporal_compression_decode(self) -> int:
        """Frames per latent frame inside a chunk."""
        return self.pipeline.time_factor

    def get_sd(self) -> dict[str, Tensor]:
        """Combined state dict with the checkpoint's prefixes (2-D part in ComfyUI's LDM names)."""
        sd = {"spatial_vae.module." + k: v for k, v in self.spatial_vae.get_sd().items()}
        sd.update(self.temporal.state_dict())
        return sd


def load_opensora_vae(path: str | os.PathLike, temporal_dtype: str = "auto") -> OpenSoraComfyVAE:
    """Load an OpenSora VAE v1.2 .safetensors for ComfyUI (wrong kinds of file are refused with a description)."""
    import comfy.model_management as mm

    device = mm.vae_device()
    dtype = resolve_temporal_dtype(temporal_dtype, device)
    temporal, spatial_sd = load_opensora_vae_file(path, dtype=dtype, device=mm.vae_offload_device())
    spatial = build_spatial_vae(spatial_sd)
    del spatial_sd
    name = os.path.basename(str(path))
    log.info("[CHAI] OpenSora VAE %s: temporal part %s (%.1f M params), 2-D part %s", name, dtype,
             sum(p.numel() for p in temporal.parameters()) / 1e6, spatial.vae_dtype)
    return OpenSoraComfyVAE(spatial, temporal, name)


__all__ = [
    "LATENT_INFO_KEY", "TEMPORAL_DTYPES", "latent_info", "make_latent_info", "frames_for_latent",
    "infer_ldm_vae_config", "build_spatial_vae", "ComfySpatialVAE", "resolve_temporal_dtype", "pixels_to_images",
    "images_to_pixels", "OpenSoraComfyVAE", "load_opensora_vae",
]
