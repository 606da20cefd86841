"""Cache Attention for Open-Sora 1.2's STDiT3 (`opensora.stdit3.STDiT3`, the pack's own plain-torch model).

The same hooks as every family (chai_attention.hooks): STDiT3 honours ComfyUI's DiT contract, so the capture pass
runs the model's own forward on the donor latent (patch embedding, position table, timestep and fps embedding,
block 0's adaLN modulation, its qkv projection and k-norm) and stops in spatial block 0's self-attention, reached
through `patches_replace["dit"][("spatial_block", 0)]` and the attention override, the block's only override
call. Spatial attention runs per frame (q/k/v [(B*T), heads, S, head_dim]), so live frame i attends to donor
frame i. Nothing before that attention depends on the text, so a step's donor K/V serve every call of the step
with the same shape (split cond/uncond calls; `shares_donor_kv`).
"""
from __future__ import annotations

from typing import Any, ClassVar, Sequence

from torch import nn

from ...opensora.stdit3 import SPATIAL_BLOCK, STDiT3
from ..run import CacheAttentionRun
from .base import ModelAdapter


class STDiT3Adapter(ModelAdapter):
    """Open-Sora 1.2 STDiT3: the hooked attention is `spatial_blocks[0]`'s self-attention."""

    family = "stdit3"
    description = "Open-Sora 1.2 STDiT3, spatial_blocks[0]"
    block_key: ClassVar[tuple[Any, ...]] = (SPATIAL_BLOCK, 0)
    attention_index: ClassVar[int] = 0  # the self-attention; the cross-attention never calls the override
    firing_kind: ClassVar[str] = "spatial"
    shape_hint: ClassVar[str] = "the same shape as the live latent"
    shares_donor_kv: ClassVar[bool] = True

    @classmethod
    def recognise(cls, model: Any) -> bool:
        """An STDiT3 instance, or a module with STDiT3's blocks and input hooks."""
        if isinstance(model, STDiT3):
            return True
        return isinstance(model, nn.Module) and all(
            hasattr(model, name) for name in ("spatial_blocks", "temporal_blocks", "embed_video", "embed_timestep"))

    def check_run(self, run: CacheAttentionRun, latent_shape: Sequence[int] | None = None) -> None:
        """Donor latents must be 4-D or 5-D STDiT3 latents with the model's channel count."""
        shape = run.donors.shape
        channels = self.model.config.in_channels
        if len(shape) not in (4, 5) or shape[-4] != channels:
            raise ValueError(f"donor latents of shape {shape} are not {channels}-channel STDiT3 latents")
