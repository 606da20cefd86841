"""What a request's CONDITIONING carries into the model besides the text: the entries that hold an image or video.

Adapters read it to refuse what their family cannot serve (`conditioning_keys`); `identity.conditioning_digest`
digests the entries named by IMAGE_KEYS, so an image-to-video donor serves only a request made from the very same
conditioning (docs/cache-attention.md, "Image-to-video"). Plain Python; nothing here imports ComfyUI.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

# Conditioning entries (ComfyUI conditioning dict keys) that carry an image or a video into the model. The
# conditioning digest reads them in this order: changing it changes the fingerprint of every stored entry.
IMAGE_KEYS: tuple[str, ...] = ("concat_latent_image", "concat_mask", "concat_image", "clip_vision_output",
                               "reference_latents", "time_dim_concat")


def conditioning_keys(conditionings: Sequence[Any], keys: Sequence[str]) -> list[str]:
    """Which of `keys` some entry of the CONDITIONING lists sets (to anything but None)."""
    found: list[str] = []
    for conditioning in conditionings:
        for entry in conditioning or ():
            options = entry[1] if isinstance(entry, (list, tuple)) and len(entry) > 1 else None
            if isinstance(options, Mapping):
                found += [k for k in keys if options.get(k) is not None and k not in found]
    return found


__all__ = ["IMAGE_KEYS", "conditioning_keys"]
