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
from ..conditioning import conditioning_keys
from ..run import CacheAttentionRun
from .base import ModelAdapter
from .video_latents import check_video_donors, has_modules

PER_TOKEN_TIMESTEPS = ("image-to-video or guide frames: LTXVImgToVideo, LTXVAddGuide; LTXV then gives each token its "
                       "own timestep and the donor's frames are not the request's image")
# Model-call extra arguments (from the LATENT's noise mask and the conditioning) that give tokens their own timesteps.
CALL_KEYS = {"denoise_mask": "a denoise mask", "keyframe_idxs": "guide frames (keyframe_idxs)"}
CONDITIONING_KEYS = {"keyframe_idxs": "guide frames (keyframe_idxs)", "concat_mask": "a denoise mask (concat_mask)"}


def refuse_per_token_timesteps(found: Sequence[str]) -> None:
    """ValueError naming what was found, when anything was."""
    if found:
        raise ValueError(f"this LTXV request has {', '.join(found)} ({PER_TOKEN_TIMESTEPS}); CHAI Cache Attention "
                         "supports LTXV text-to-video only")


class LTXVAdapter(ModelAdapter):
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

    def latent_channels(self) -> int:
        """Channels of the latent the patch projection takes (LTXV patches are one latent voxel)."""
        return int(self.model.patchify_proj.in_features)

    def check_run(self, run: CacheAttentionRun, latent_shape: Sequence[int] | None = None) -> None:
        """Donors must be 128-channel latents of the sampled latent's shape."""
        check_video_donors(run, self.latent_channels(), "LTXV", latent_shape)

    def check_request(self, latent: Mapping[str, Any] | None, conditionings: Sequence[Any] = ()) -> None:
        """Refuse, before sampling, a noise mask on the LATENT or guide frames / a mask in the conditioning."""
        found = ["a noise mask on the latent"] if (latent or {}).get("noise_mask") is not None else []
        found += [CONDITIONING_KEYS[k] for k in conditioning_keys(conditionings, tuple(CONDITIONING_KEYS))]
        refuse_per_token_timesteps(found)

    def check_call(self, extra: Mapping[str, Any]) -> None:
        """The same, from a model call's extra arguments."""
        refuse_per_token_timesteps([what for k, what in CALL_KEYS.items() if extra.get(k) is not None])

    def check_donor(self, donor: DonorKV, live_block_args: Mapping[str, Any]) -> None:
        """Same token positions (the block's RoPE table); no per-token timesteps (image-to-video, guides)."""
        vec = live_block_args.get("vec")
        if isinstance(vec, Tensor) and vec.dim() == 3 and vec.shape[1] > 1:
            raise ValueError(f"this LTXV call gives its tokens their own timesteps ({PER_TOKEN_TIMESTEPS}); CHAI "
                             "Cache Attention supports LTXV text-to-video only")
        super().check_donor(donor, live_block_args)
