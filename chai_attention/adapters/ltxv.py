"""Cache Attention for ComfyUI's LTX-Video (`comfy.ldm.lightricks.model.LTXVModel`), text-to-video.

Through the public hooks only (`chai_attention.hooks`): `transformer_blocks[0]` calls ComfyUI's attention twice,
first its self-attention `attn1` over every latent token (a full 3-D attention, RoPE from the token coordinates and
the frame rate), then its cross-attention `attn2` to the text. The first call is stopped in the capture pass on the
donor latent and gets the donor's keys and values in the live pass; the cross-attention is left alone.
"""
from __future__ import annotations

from typing import Any, ClassVar, Mapping, Sequence

from torch import Tensor, nn

from ..attention_call import DonorKV
from ..hooks import HookAdapter
from ..run import CacheAttentionRun
from .base import ModelAdapter
from .video_latents import check_video_donors, has_modules


class LTXVAdapter(HookAdapter, ModelAdapter):
    """LTX-Video: block 0 is `transformer_blocks[0]`; its first attention call is the self-attention `attn1`."""

    family = "ltxv"
    description = "LTX-Video T2V (ComfyUI LTXVModel), transformer_blocks[0].attn1"
    block_key: ClassVar[tuple[Any, ...]] = ("double_block", 0)
    attention_index: ClassVar[int] = 0  # attn1; the block's second call (attn2) is the cross-attention
    firing_kind: ClassVar[str] = "self_attn"
    shape_hint: ClassVar[str] = "the live latent's shape"

    @classmethod
    def recognise(cls, model: Any) -> bool:
        """An LTXV-structured network (by structure, no ComfyUI import): per-token patch projection, adaLN-single,
        transformer blocks with a self-attention `attn1` and a cross-attention `attn2`."""
        if not isinstance(model, nn.Module) or not has_modules(model, ("patchify_proj", "adaln_single")):
            return False
        blocks = getattr(model, "transformer_blocks", None)
        return (isinstance(blocks, nn.ModuleList) and len(blocks) > 0
                and has_modules(blocks[0], ("attn1", "attn2", "ff"))
                and isinstance(getattr(blocks[0], "scale_shift_table", None), Tensor))

    def first_block(self) -> nn.Module:
        """`transformer_blocks[0]`."""
        return self.model.transformer_blocks[0]

    def block_self_attention(self) -> nn.Module:
        """`transformer_blocks[0].attn1`."""
        return self.first_block().attn1

    def latent_channels(self) -> int:
        """Channels of the latent the patch projection takes (LTXV patches are one latent voxel)."""
        return int(self.model.patchify_proj.in_features)

    def check_run(self, run: CacheAttentionRun, latent_shape: Sequence[int] | None = None) -> None:
        """Donors must be 128-channel latents of the sampled latent's shape."""
        check_video_donors(run, self.latent_channels(), "LTXV", latent_shape)

    def check_donor(self, donor: DonorKV, live_block_args: Mapping[str, Any]) -> None:
        """Same token positions (the block's RoPE table); no per-token timesteps (image-to-video, guides)."""
        vec = live_block_args.get("vec")
        if isinstance(vec, Tensor) and vec.dim() == 3 and vec.shape[1] > 1:
            raise ValueError("this LTXV call gives its tokens their own timesteps (image-to-video or guide frames: "
                             "LTXVImgToVideo, LTXVAddGuide); CHAI Cache Attention supports LTXV text-to-video only")
        super().check_donor(donor, live_block_args)
