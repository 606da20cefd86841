"""Cache Attention for ComfyUI's HunyuanVideo text-to-video (`comfy.ldm.hunyuan_video.model.HunyuanVideo`).

Through the public hooks only (`chai_attention.hooks`): the model's own forward on the donor latent is stopped in
`double_blocks[0]`'s attention, and the live call of that attention gets the donor's keys and values. HunyuanVideo's
double blocks attend *jointly*: one attention over the image tokens followed by the text tokens (q/k/v
[B, heads, L_img + L_txt, head_dim], RoPE applied, the text-padding mask over the same L_img + L_txt keys). Only
the image rows of K/V come from the donor; the text rows stay the live call's, so the request's own prompt keeps
conditioning the video (docs/cache-attention.md says why and what each K/V mode does with them).
"""
from __future__ import annotations

from typing import Any, ClassVar, Mapping, Sequence, cast

import torch
from torch import Tensor, nn

from ..attention_call import AttentionCall, DonorKV
from ..conditioning import conditioning_keys
from ..kv import combine_kv
from ..run import CacheAttentionRun
from .base import ModelAdapter, UnsupportedModelError
from .video_latents import check_video_donors, has_modules, tokens_of

SUPPORTED_TEXT = "HunyuanVideo T2V (ComfyUI's native HunyuanVideo, 16-channel latent, CLIP-L + LLaVA-Llama-3 text)"
# Conditioning entries (and so model-call extra arguments) with which HunyuanImageToVideo makes the T2V model animate
# an image: the donor's video was not made from that image.
IMAGE_TO_VIDEO = {"guiding_frame_index": "a guiding frame: HunyuanImageToVideo 'v2 (replace)'",
                  "ref_latent": "a reference image latent: HunyuanImageToVideo 'custom'"}


def refuse_image_to_video(keys: Sequence[str]) -> None:
    """ValueError naming why, when any image-to-video key is set."""
    if keys:
        raise ValueError(f"this HunyuanVideo request is image-to-video ({'; '.join(IMAGE_TO_VIDEO[k] for k in keys)})"
                         "; CHAI Cache Attention supports HunyuanVideo text-to-video only")


class HunyuanVideoAdapter(ModelAdapter):
    """HunyuanVideo: block 0 is `double_blocks[0]`; its one attention call is the joint image + text attention."""

    family = "hunyuan_video"
    description = "HunyuanVideo T2V (ComfyUI HunyuanVideo), double_blocks[0] joint attention, image keys/values"
    block_key: ClassVar[tuple[Any, ...]] = ("double_block", 0)
    attention_index: ClassVar[int] = 0
    firing_kind: ClassVar[str] = "joint_attn"
    shape_hint: ClassVar[str] = "the live latent's shape"

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        reason = self.unsupported_reason(self.model)
        if reason:
            raise UnsupportedModelError(f"CHAI Cache Attention does not support this HunyuanVideo model: {reason}. "
                                        f"Supported: {SUPPORTED_TEXT}")

    @classmethod
    def recognise(cls, model: Any) -> bool:
        """A HunyuanVideo-structured network (by structure, no ComfyUI import): image patch embedding, a token
        refiner for the text, double blocks with image and text attention, single blocks."""
        if not isinstance(model, nn.Module) or not has_modules(model, ("img_in", "txt_in", "time_in")):
            return False
        if not isinstance(getattr(model.txt_in, "individual_token_refiner", None), nn.Module):
            return False  # Flux and its relatives embed the text with a plain linear layer
        blocks = getattr(model, "double_blocks", None)
        return (isinstance(blocks, nn.ModuleList) and len(blocks) > 0
                and has_modules(blocks[0], ("img_attn", "txt_attn", "img_mod", "txt_mod"))
                and isinstance(getattr(model, "single_blocks", None), nn.ModuleList))

    @staticmethod
    def unsupported_reason(model: nn.Module) -> str | None:
        """Why a recognised HunyuanVideo-structured network cannot use Cache Attention, or None when it can."""
        patch = tuple(getattr(model, "patch_size", ()))
        if len(patch) != 3:
            return f"its patch size {list(patch)} is not a video patch (HunyuanImage 2.1 is an image model)"
        if getattr(model, "vector_in", None) is None:
            return "it has no CLIP-L pooled-text input (vector_in), as the HunyuanImage models"
        in_channels, out_channels = getattr(model, "in_channels", None), getattr(model, "out_channels", None)
        if in_channels != out_channels:
            return (f"its input takes {in_channels} channels for a {out_channels}-channel latent (the image is "
                    "concatenated: HunyuanVideo image-to-video or SkyReels I2V), so a donor latent alone cannot be "
                    "its input")
        first = cast(nn.ModuleList, model.double_blocks)[0]  # a ModuleList, as recognise() checked
        if not getattr(first, "flipped_img_txt", False):
            return "its double blocks put the text tokens before the image tokens (not HunyuanVideo's layout)"
        return None

    def check_run(self, run: CacheAttentionRun, latent_shape: Sequence[int] | None = None) -> None:
        """Donors must be 16-channel latents of the sampled latent's shape."""
        check_video_donors(run, int(self.model.in_channels), "HunyuanVideo", latent_shape)

    def check_request(self, latent: Mapping[str, Any] | None, conditionings: Sequence[Any] = ()) -> None:
        """Refuse HunyuanImageToVideo's guiding frame or reference latent before sampling."""
        refuse_image_to_video(conditioning_keys(conditionings, tuple(IMAGE_TO_VIDEO)))

    def check_call(self, extra: Mapping[str, Any]) -> None:
        """The same, from a model call's extra arguments (a CHAI Apply whose positive was not connected)."""
        refuse_image_to_video([k for k in IMAGE_TO_VIDEO if extra.get(k) is not None])

    # --------------------------------------------------------------------------------------- the live call

    def check_donor(self, donor: DonorKV, live_block_args: Mapping[str, Any]) -> None:
        """Same token positions (the block's RoPE table) and same image-token count; no image-to-video call."""
        if live_block_args.get("modulation_dims_img") is not None:
            raise ValueError("this HunyuanVideo call is image-to-video (a guiding frame: HunyuanImageToVideo "
                             "'v2 (replace)'); CHAI Cache Attention supports HunyuanVideo text-to-video only")
        super().check_donor(donor, live_block_args)
        if tokens_of(donor.block_args.get("img")) != tokens_of(live_block_args.get("img")):
            raise ValueError("the donor latent gives another number of image tokens than the live latent: "
                             f"Cache Attention needs the donor latent to have {self.shape_hint}")

    def splice_kv(self, live: AttentionCall, donor: DonorKV, mode: str,
                  block_args: Mapping[str, Any]) -> AttentionCall:
        """The image rows of K/V from the donor, the text rows the live call's own ("replace"); or the live K/V
        followed by the donor's image rows, the joint mask extended to them ("concat")."""
        img = tokens_of(block_args.get("img"))
        axis = live.token_dim
        if img is None or img > live.k.shape[axis]:
            raise ValueError("the HunyuanVideo block-0 call carries no image tokens ('img') to tell them from the "
                             "text tokens in its joint attention")
        if tuple(donor.k.shape) != tuple(live.k.shape) or tuple(donor.v.shape) != tuple(live.v.shape):
            raise ValueError(f"donor keys {tuple(donor.k.shape)} do not match the live keys {tuple(live.k.shape)}: "
                             f"Cache Attention needs the donor latent to have {self.shape_hint}")
        k_img, v_img = donor.k.narrow(axis, 0, img), donor.v.narrow(axis, 0, img)
        if mode == "replace":  # the donor's K/V for the joint call: its image rows, then the live text rows
            text = live.k.shape[axis] - img
            k_img = torch.cat([k_img.to(live.k.dtype), live.k.narrow(axis, img, text)], dim=axis)
            v_img = torch.cat([v_img.to(live.v.dtype), live.v.narrow(axis, img, text)], dim=axis)
        k, v = combine_kv(live.k, live.v, k_img, v_img, mode, dim=axis)
        changes: dict[str, Tensor | None] = {"k": k, "v": v}
        if mode == "concat" and isinstance(live.mask, Tensor):
            changes["mask"] = extend_key_mask(live.mask, img)
        return live.replace(**changes)


def extend_key_mask(mask: Tensor, extra: int) -> Tensor:
    """A key mask [..., L] widened by `extra` keys that every query may attend to (0 added, or True)."""
    pad = (torch.ones if mask.dtype == torch.bool else torch.zeros)(
        *mask.shape[:-1], extra, dtype=mask.dtype, device=mask.device)
    return torch.cat([mask, pad], dim=-1)
