"""Write toy-world clips as animated GIFs (Pillow), nearest-upscaled so 16x16 frames are visible."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def to_uint8_frames(video: np.ndarray, upscale: int = 8) -> np.ndarray:
    """RGB clip [T, H, W, 3] in [0, 1] -> uint8 frames [T, H * upscale, W * upscale, 3] (nearest neighbour)."""
    v = np.asarray(video, dtype=np.float32)
    if v.ndim != 4 or v.shape[-1] != 3:
        raise ValueError(f"expected an RGB clip [T, H, W, 3], got shape {list(v.shape)}")
    if not isinstance(upscale, int) or upscale < 1:
        raise ValueError(f"upscale must be a positive int, got {upscale!r}")
    frames = np.rint(np.clip(v, 0.0, 1.0) * 255.0).astype(np.uint8)
    return frames.repeat(upscale, axis=1).repeat(upscale, axis=2)


def save_gif(video: np.ndarray, path: str | Path, upscale: int = 8, fps: float = 8.0) -> Path:
    """Save a clip as a looping GIF (written to a temporary name, then renamed) and return its path."""
    from PIL import Image

    if fps <= 0:
        raise ValueError(f"fps must be > 0, got {fps}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    images = [Image.fromarray(f) for f in to_uint8_frames(video, upscale)]
    tmp = path.with_name(path.name + ".tmp")
    images[0].save(tmp, format="GIF", save_all=True, append_images=images[1:], duration=round(1000 / fps),
                   loop=0, disposal=1)
    tmp.replace(path)
    return path
