"""Widget choices of the OpenSora nodes (resolution, aspect ratio, frame presets) and their parsing; no ComfyUI.

OpenSora writes aspect ratios as height:width, so "9:16" is the *landscape* 240x426 (height x width) size. The
aspect-ratio labels therefore spell out the 240p pixel size as HxW and the orientation.
"""
from __future__ import annotations

from .presets import ASPECT_RATIOS, DEFAULT_FPS, FRAME_PRESETS, IMAGE_SIZES, RESOLUTIONS, VideoSpec

CUSTOM = "custom"
LABEL_RESOLUTION = "240p"  # the resolution whose pixel sizes the aspect-ratio labels show
# Menu order: landscape to portrait.
ASPECT_ORDER = ("9:16", "3:4", "1:1", "4:3", "16:9")
MAX_SIDE = 4096
MAX_FRAMES = 2048


def orientation(height: int, width: int) -> str:
    """'landscape', 'portrait' or 'square'."""
    return "landscape" if width > height else "portrait" if width < height else "square"


def aspect_label(ratio: str) -> str:
    """Menu label of an OpenSora H:W ratio, e.g. '9:16 (240x426 HxW at 240p, landscape)'."""
    height, width = IMAGE_SIZES[LABEL_RESOLUTION][ratio]
    return f"{ratio} ({height}x{width} HxW at {LABEL_RESOLUTION}, {orientation(height, width)})"


def frames_label(name: str) -> str:
    """Menu label of a frame preset, e.g. '2s (51 frames)'."""
    count = FRAME_PRESETS[name]
    return f"{name} ({count} frame{'s' if count != 1 else ''})"


RESOLUTION_CHOICES: list[str] = [*RESOLUTIONS, CUSTOM]
ASPECT_CHOICES: list[str] = [aspect_label(r) for r in ASPECT_ORDER]
FRAME_CHOICES: list[str] = [*(frames_label(n) for n in FRAME_PRESETS), CUSTOM]
DEFAULT_RESOLUTION = "240p"
DEFAULT_ASPECT = aspect_label("9:16")
DEFAULT_FRAMES = frames_label("2s")

_RATIO_BY_LABEL = {aspect_label(r): r for r in ASPECT_ORDER}
_FRAMES_BY_LABEL = {frames_label(n): FRAME_PRESETS[n] for n in FRAME_PRESETS}


def ratio_of(label: str) -> str:
    """OpenSora ratio key ('9:16') of an aspect label; the bare key is accepted too."""
    if label in _RATIO_BY_LABEL:
        return _RATIO_BY_LABEL[label]
    if label in ASPECT_RATIOS:
        return label
    raise ValueError(f"unknown aspect ratio {label!r}; choose one of: {'; '.join(ASPECT_CHOICES)}")


def frames_of(label: str, custom_frames: int) -> int:
    """Frame count of a frame label ('custom' gives custom_frames); preset names like '2s' are accepted too."""
    if label == CUSTOM:
        if not 1 <= int(custom_frames) <= MAX_FRAMES:
            raise ValueError(f"num_frames must be in 1..{MAX_FRAMES}, got {custom_frames}")
        return int(custom_frames)
    if label in _FRAMES_BY_LABEL:
        return _FRAMES_BY_LABEL[label]
    if label in FRAME_PRESETS:
        return FRAME_PRESETS[label]
    raise ValueError(f"unknown frame preset {label!r}; choose one of: {', '.join(FRAME_CHOICES)}")


def video_for_choices(resolution: str, aspect_ratio: str, frames: str, custom_height: int = 240,
                      custom_width: int = 426, custom_frames: int = 51, fps: float = DEFAULT_FPS) -> VideoSpec:
    """Nominal video of the empty-latent widgets (custom_* are used only when their combo says 'custom')."""
    if resolution == CUSTOM:
        for name, side in (("height", custom_height), ("width", custom_width)):
            if not 8 <= int(side) <= MAX_SIDE:
                raise ValueError(f"custom {name} must be in 8..{MAX_SIDE} pixels, got {side}")
        height, width = int(custom_height), int(custom_width)
    elif resolution in IMAGE_SIZES:
        height, width = IMAGE_SIZES[resolution][ratio_of(aspect_ratio)]
    else:
        raise ValueError(f"unknown resolution {resolution!r}; choose one of {', '.join(RESOLUTION_CHOICES)}")
    if fps <= 0:
        raise ValueError(f"fps must be > 0, got {fps}")
    return VideoSpec(height, width, frames_of(frames, custom_frames), float(fps))


__all__ = [
    "CUSTOM", "RESOLUTION_CHOICES", "ASPECT_CHOICES", "FRAME_CHOICES", "DEFAULT_RESOLUTION", "DEFAULT_ASPECT",
    "DEFAULT_FRAMES", "MAX_SIDE", "MAX_FRAMES", "orientation", "aspect_label", "frames_label", "ratio_of",
    "frames_of", "video_for_choices",
]
