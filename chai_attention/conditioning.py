"""What an image-conditioned request must share with its donor: the conditioning image(s), by digest.

Decision (docs/cache-attention.md, "Image-to-video"): a donor serves an image-to-video request only when it was
made from the very same conditioning: the same start (and end) image latents and mask, the same CLIP vision
features, the same reference latents, and, where the image lives in the latent itself (Wan 2.2 TI2V 5B:
Wan22ImageToVideoLatent writes it into the first latent frames and marks them kept with a noise mask), the same
latent and mask. Entities are matched as for text-to-video on top. Cache Attention pulls the early structure of the
donor's video into the new one; a donor that started from another image would pull it away from the frame the
request must keep. The digest is folded into the cache fingerprint (comfy_glue.request_fingerprint), so another
image is a miss, never a wrong hit. Plain torch; nothing here imports ComfyUI.
"""
from __future__ import annotations

import hashlib
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor

# Conditioning entries (ComfyUI conditioning dict keys) that carry an image or a video into the model.
IMAGE_KEYS: tuple[str, ...] = ("concat_latent_image", "concat_mask", "concat_image", "clip_vision_output",
                               "reference_latents", "time_dim_concat")


def _feed(value: Any, h: "hashlib._Hash", depth: int = 0) -> None:
    """Hash tensors (all of their values), nested sequences/mappings and objects holding tensors (CLIP outputs)."""
    if depth > 6 or value is None:
        h.update(b"-")
    elif isinstance(value, Tensor):
        t = value.detach().to("cpu", torch.float32).contiguous()
        h.update(f"{tuple(t.shape)}|".encode())
        h.update(t.numpy().tobytes())
    elif isinstance(value, (list, tuple)):
        h.update(f"[{len(value)}".encode())
        for item in value:
            _feed(item, h, depth + 1)
    elif isinstance(value, Mapping):
        for key in sorted(value, key=str):
            h.update(str(key).encode())
            _feed(value[key], h, depth + 1)
    elif isinstance(value, (bool, int, float, str)):
        h.update(repr(value).encode())
    else:  # e.g. comfy.clip_vision.Output: its tensor attributes
        fields = {k: v for k, v in sorted(vars(value).items()) if isinstance(v, (Tensor, list, tuple))}
        h.update(type(value).__name__.encode())
        _feed(fields, h, depth + 1)


def conditioning_keys(conditionings: Sequence[Any], keys: Sequence[str]) -> list[str]:
    """Which of `keys` some entry of the CONDITIONING lists sets (to anything but None)."""
    found: list[str] = []
    for conditioning in conditionings:
        for entry in conditioning or ():
            options = entry[1] if isinstance(entry, (list, tuple)) and len(entry) > 1 else None
            if isinstance(options, Mapping):
                found += [k for k in keys if options.get(k) is not None and k not in found]
    return found


def conditioning_digest(positive: Sequence[Any] | None, latent: Mapping[str, Any] | None = None) -> str | None:
    """'image:<16 hex>' over the image conditioning of `positive` (a CONDITIONING list) and an inpainting-style
    latent (samples plus noise_mask); None when the request has no image conditioning (text-to-video)."""
    h = hashlib.sha256()
    found = False
    for entry in positive or ():
        options = entry[1] if isinstance(entry, (list, tuple)) and len(entry) > 1 else None
        if not isinstance(options, Mapping):
            continue
        for key in IMAGE_KEYS:
            if options.get(key) is not None:
                found = True
                h.update(key.encode())
                _feed(options[key], h)
    mask = (latent or {}).get("noise_mask")
    if isinstance(mask, Tensor):
        found = True
        h.update(b"noise_mask")
        _feed(mask, h)
        _feed(latent["samples"], h)
    return f"image:{h.hexdigest()[:16]}" if found else None


__all__ = ["IMAGE_KEYS", "conditioning_keys", "conditioning_digest"]
