"""Cache Attention for ComfyUI's Wan 2.1 / 2.2 models (`comfy.ldm.wan.model.WanModel`), through public hooks only.

Wan has no spatial-only block: `blocks[0].self_attn` is a full 3-D attention, so donor and live latents are aligned
token by token and a hit needs the same latent shape. Everything on the donor's path (patch embedding, time
embedding, adaLN modulation, q/k/v, RoPE) is computed by the model itself in a capture pass (chai_attention.hooks);
this adapter only says where to hook: block 0 (`patches_replace["dit"][("double_block", 0)]`) and its first
attention call (the self-attention; the cross-attention follows). Supported and refused variants and why:
docs/cache-attention.md.
"""
from __future__ import annotations

from typing import Any, Sequence, cast

from torch import Tensor, nn

from ..run import CacheAttentionRun
from .base import ModelAdapter, UnsupportedModelError
from .video_latents import check_video_donors, has_modules

# ComfyUI Wan classes whose forward adds streams to the tokens before block 0 or calls blocks differently.
_UNSUPPORTED_CLASSES = {
    "VaceWanModel": "VACE", "CameraWanModel": "Camera", "HumoWanModel": "HuMo", "WanModel_S2V": "S2V",
    "AnimateWanModel": "Animate",
}
_VARIANT_MARKERS = {  # attribute -> variant, for subclasses under other names
    "vace_patch_embedding": "VACE", "control_adapter": "Camera", "audio_proj": "HuMo",
    "casual_audio_encoder": "S2V", "pose_patch_embedding": "Animate",
}
SUPPORTED_TEXT = ("Wan 2.1 T2V (1.3B, 14B) and I2V / FLF2V (14B), Wan 2.2 T2V and I2V A14B (both experts) and "
                  "Wan 2.2 TI2V 5B (text- and image-to-video); image-conditioned requests hit only donors made from "
                  "the same image")
IMAGE_CHANNELS = 20  # Wan image-to-video input: the latent plus a 4-channel mask and a 16-channel image latent


class WanAdapter(ModelAdapter):
    """ComfyUI's Wan 2.1 / 2.2: the hooked attention is block 0's first one, `blocks[0].self_attn`."""

    family = "wan"
    description = "Wan 2.1 / 2.2 text- and image-to-video (ComfyUI WanModel), blocks[0].self_attn"
    block_key = ("double_block", 0)
    attention_index = 0  # WanAttentionBlock attends self first, then cross (text, and image for i2v)
    firing_kind = "self_attn"
    shape_hint = "the live latent's shape (same resolution and frame count, no extra reference frames)"

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        reason = self.unsupported_reason(self.model)
        if reason:
            raise UnsupportedModelError(f"CHAI Cache Attention does not support this Wan model: {reason}. "
                                        f"Supported: {SUPPORTED_TEXT}")

    @classmethod
    def recognise(cls, model: Any) -> bool:
        """A Wan-structured network: Conv3d patch_embedding, blocks[0] with norm1, modulation and a self_attn
        with q/k/v/o (by structure, so no ComfyUI import is needed)."""
        if not isinstance(model, nn.Module) or not isinstance(getattr(model, "patch_embedding", None), nn.Conv3d):
            return False
        blocks = getattr(model, "blocks", None)
        if not isinstance(blocks, nn.ModuleList) or len(blocks) == 0:
            return False
        block = blocks[0]
        attn = getattr(block, "self_attn", None)
        return (has_modules(block, ("norm1",)) and isinstance(getattr(block, "modulation", None), Tensor)
                and attn is not None and has_modules(attn, ("q", "k", "v", "o")))

    @staticmethod
    def unsupported_reason(model: nn.Module) -> str | None:
        """Why a recognised Wan network cannot use Cache Attention, or None when it can."""
        name = type(model).__name__
        if name in _UNSUPPORTED_CLASSES:
            return f"{name} is a Wan {_UNSUPPORTED_CLASSES[name]} model"
        for attr, variant in _VARIANT_MARKERS.items():
            if getattr(model, attr, None) is not None:
                return f"{name} has `{attr}`, i.e. it is a Wan {variant} model"
        model_type = getattr(model, "model_type", "t2v")
        if model_type not in ("t2v", "i2v"):
            return f"{name} is a Wan {model_type!r} model"
        in_channels = cast(nn.Conv3d, model.patch_embedding).in_channels  # a Conv3d, as recognise() checked
        out_dim = getattr(model, "out_dim", None) or in_channels
        extra = in_channels - out_dim
        if extra not in (0, IMAGE_CHANNELS):
            return (f"its input takes {in_channels} channels for a {out_dim}-channel latent: "
                    f"{extra} concatenated channels are not an image-to-video mask and image (Fun-Control and "
                    "other control-video models are not supported)")
        return None

    def latent_channels(self) -> int:
        """Channels of the latent the sampler works on (the model's output channels)."""
        return int(getattr(self.model, "out_dim", None) or self.model.patch_embedding.in_channels)

    def check_run(self, run: CacheAttentionRun, latent_shape: Sequence[int] | None = None) -> None:
        """Donors must be [C, T, H, W] / [B, C, T, H, W] latents of the model's channels and, when the sampled
        latent's shape is given, of its shape: Wan Cache Attention aligns tokens by position."""
        check_video_donors(run, self.latent_channels(), "Wan", latent_shape)
