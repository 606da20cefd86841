"""Nodes that load the OpenSora VAE v1.2 and turn OpenSora latents into video frames and back."""
from __future__ import annotations

import logging
from typing import Any

from comfy_api.v0_0_2 import io

from ..opensora.comfy_vae import (LATENT_INFO_KEY, OpenSoraComfyVAE, frames_for_latent, latent_info, load_opensora_vae,
                                  make_latent_info)
from ..opensora.vae import Tiling
from .errors import ChaiNodeError, user_errors
from .widgets import combo

log = logging.getLogger(__name__)

CATEGORY = "CHAI/OpenSora"
MODES = ["mean", "sample"]
DTYPES = ["auto", "fp32", "bf16", "fp16"]  # mirrors opensora.comfy_vae.TEMPORAL_DTYPES
DEFAULT_FPS = 24.0


def _vae_files() -> list[str]:
    """Files in ComfyUI's `vae` model folders."""
    import folder_paths

    return folder_paths.get_filename_list("vae")


def _require_opensora_vae(vae: Any, node: str) -> Any:
    """The VAE if it came from the OpenSora VAE loader, else a clear error."""
    if not isinstance(vae, OpenSoraComfyVAE):
        raise ChaiNodeError(f"{node}: this VAE is not the OpenSora VAE v1.2; load OpenSora-VAE-v1.2 "
                            f"(model.safetensors) with the CHAI OpenSora VAE Loader node and connect that")
    return vae


class OpenSoraVAELoader(io.ComfyNode):
    """Load OpenSora-VAE-v1.2: ComfyUI's VAE for the 2-D SDXL part plus the CHAI temporal VAE."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="CHAI_OpenSoraVAELoader",
            display_name="CHAI OpenSora VAE Loader",
            category=CATEGORY,
            description="Loads hpcai-tech/OpenSora-VAE-v1.2 model.safetensors from models/vae. The output also "
                        "works with ComfyUI's VAE Decode / VAE Encode nodes (which assume 1 or 17k frames).",
            inputs=[
                combo(
                    "vae_name", options=_vae_files(),
                    tooltip="The OpenSora VAE v1.2 file in models/vae (the 1.57 GB model.safetensors from "
                            "hpcai-tech/OpenSora-VAE-v1.2, renamed as you like). Other VAEs are refused."),
                combo(
                    "temporal_dtype", options=DTYPES, default="auto",
                    tooltip="Precision of the temporal (3-D) part. 'auto' picks bf16 where the device runs it "
                            "fast, else fp32; Open-Sora itself decodes in bf16. The 2-D part follows ComfyUI's "
                            "VAE precision settings."),
            ],
            outputs=[io.Vae.Output("vae", display_name="vae",
                                   tooltip="The OpenSora VAE; connect it to the CHAI OpenSora VAE Decode/Encode "
                                           "nodes (or ComfyUI's VAE Decode for 1 or 17k-frame latents).")],
        )

    @classmethod
    def execute(cls, vae_name: str, temporal_dtype: str) -> io.NodeOutput:
        if temporal_dtype not in DTYPES:
            raise ChaiNodeError(f"CHAI OpenSora VAE Loader: unknown dtype {temporal_dtype!r}; choose one of "
                                f"{', '.join(DTYPES)}")
        with user_errors("CHAI OpenSora VAE Loader"):
            import folder_paths

            path = folder_paths.get_full_path_or_raise("vae", vae_name)
            vae = load_opensora_vae(path, temporal_dtype)
        return io.NodeOutput(vae)


class OpenSoraVAEDecode(io.ComfyNode):
    """Decode an OpenSora latent into video frames (IMAGE) plus the fps for CreateVideo."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="CHAI_OpenSoraVAEDecode",
            display_name="CHAI OpenSora VAE Decode",
            category=CATEGORY,
            description="Decodes an OpenSora 1.2 latent chunk by chunk (5 latent frames -> 17 video frames) into "
                        "IMAGE frames for CreateVideo / SaveVideo; 240x426 decodes to 240x424 as in Open-Sora.",
            inputs=[
                io.Latent.Input("samples", tooltip="OpenSora latent [B, 4, T, H/8, W/8] (model space), e.g. from "
                                                   "the sampler; the frame count and fps it records are used."),
                io.Vae.Input("vae", tooltip="The VAE from the CHAI OpenSora VAE Loader."),
                io.Int.Input(
                    "num_frames", default=0, min=0, max=100000,
                    tooltip="Frames to decode. 0 uses the count recorded in the latent by the OpenSora empty "
                            "latent node, else the smallest count that fits (17 frames per 5 latent frames, 1 for an image)."),
                io.Float.Input(
                    "fps", default=DEFAULT_FPS, min=1.0, max=240.0, step=1.0,
                    tooltip="Frame rate passed on to CreateVideo when the latent does not record one "
                            "(Open-Sora's default is 24)."),
                io.Int.Input(
                    "tile_size", default=0, min=0, max=8192, step=64,
                    tooltip="0 decodes whole frames (Open-Sora's way). Otherwise the 2-D decode runs on "
                            "overlapping tiles of this many pixels to cap memory at 720p and above."),
                io.Int.Input(
                    "tile_overlap", default=64, min=0, max=4096, step=8,
                    tooltip="Pixels shared by neighbouring tiles, blended linearly (used only with tile_size)."),
            ],
            outputs=[
                io.Image.Output("images", display_name="images",
                                tooltip="Decoded frames [frames, H, W, 3] in 0..1 (videos of a batch one after "
                                        "another)."),
                io.Float.Output("frame_rate", display_name="fps",
                                tooltip="Frame rate for CreateVideo: recorded in the latent, else the fps input."),
            ],
        )

    @classmethod
    def execute(cls, samples: dict, vae: Any, num_frames: int, fps: float, tile_size: int,
                tile_overlap: int) -> io.NodeOutput:
        node = "CHAI OpenSora VAE Decode"
        vae = _require_opensora_vae(vae, node)
        with user_errors(node):
            latent = samples["samples"]
            if getattr(latent, "is_nested", False):
                latent = latent.unbind()[0]
            if latent.ndim != 5 or latent.shape[1] != 4:
                raise ValueError(f"this is not an OpenSora latent: expected [B, 4, T, H/8, W/8], got "
                                 f"{list(latent.shape)}")
            frames = frames_for_latent({**samples, "samples": latent}, num_frames)
            tiling = None
            if tile_size > 0:
                tile = max(8, tile_size // 8)
                tiling = Tiling(tile=tile, overlap=min(max(0, tile_overlap // 8), tile - 1))
            images = vae.decode_video(latent, frames, tiling)
            images = images.reshape(-1, *images.shape[-3:])
            out_fps = latent_info(samples).get("fps", float(fps))
        log.info("[CHAI] OpenSora decode: %d frames %dx%d at %.3g fps", images.shape[0], images.shape[1],
                 images.shape[2], out_fps)
        return io.NodeOutput(images, out_fps)


class OpenSoraVAEEncode(io.ComfyNode):
    """Encode video frames (IMAGE) into an OpenSora latent, for video-to-video and image-to-video."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="CHAI_OpenSoraVAEEncode",
            display_name="CHAI OpenSora VAE Encode",
            category=CATEGORY,
            description="Encodes frames with the OpenSora VAE v1.2 (17-frame chunks, 17 -> 5 latent frames) and "
                        "records size, frame count and fps in the latent.",
            inputs=[
                io.Image.Input("pixels", tooltip="The frames of one video [frames, H, W, 3], e.g. from Load Video "
                                                 "or one image for image-to-video; sizes are floored to 8."),
                io.Vae.Input("vae", tooltip="The VAE from the CHAI OpenSora VAE Loader."),
                combo(
                    "mode", options=MODES, default="mean",
                    tooltip="'mean' takes the posterior means (deterministic). 'sample' draws from both posteriors "
                            "like Open-Sora's training-time encode, reproducibly from the seed."),
                io.Int.Input("seed", default=0, min=0, max=0xFFFFFFFFFFFFFFFF,
                             tooltip="Seed for mode 'sample' (ignored for 'mean')."),
                io.Float.Input("fps", default=DEFAULT_FPS, min=1.0, max=240.0, step=1.0,
                               tooltip="Frame rate of the frames, recorded in the latent for the model and for "
                                       "decoding."),
            ],
            outputs=[io.Latent.Output("latent", display_name="latent",
                                      tooltip="OpenSora latent (model space) with latent['opensora'] = height, "
                                              "width, num_frames, fps.")],
        )

    @classmethod
    def execute(cls, pixels: Any, vae: Any, mode: str, seed: int, fps: float) -> io.NodeOutput:
        node = "CHAI OpenSora VAE Encode"
        if mode not in MODES:
            raise ChaiNodeError(f"{node}: unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        vae = _require_opensora_vae(vae, node)
        with user_errors(node):
            if pixels.ndim != 4 or pixels.shape[1] < 8 or pixels.shape[2] < 8:
                raise ValueError(f"expected IMAGE frames [N, H, W, 3] of at least 8x8 pixels, got "
                                 f"{list(pixels.shape)}")
            latent = vae.encode_video(pixels, sample=mode == "sample", seed=seed)
            info = make_latent_info(pixels.shape[1], pixels.shape[2], pixels.shape[0], fps)
        return io.NodeOutput({"samples": latent, LATENT_INFO_KEY: info})


NODES = [OpenSoraVAELoader, OpenSoraVAEDecode, OpenSoraVAEEncode]
