"""OpenSora 1.2 resolution, aspect-ratio and frame presets, and the latent shapes they produce."""

from __future__ import annotations

from dataclasses import dataclass

# Aspect ratios are written H:W, as OpenSora does: "9:16" is the landscape 240x426 (height x width) size and
# "16:9" the portrait 426x240 one.
RESOLUTIONS: tuple[str, ...] = ("144p", "240p", "360p", "480p", "720p")
ASPECT_RATIOS: tuple[str, ...] = ("9:16", "16:9", "1:1", "3:4", "4:3")

# (height, width) in pixels, from OpenSora 1.2's bucket tables (datasets/aspect.py in its repository). The odd sizes
# (166x221, 370x278, 740x555 ...) are the published values, not rounding mistakes.
IMAGE_SIZES: dict[str, dict[str, tuple[int, int]]] = {
    "144p": {"9:16": (144, 256), "3:4": (166, 221), "1:1": (192, 192), "4:3": (221, 165), "16:9": (256, 144)},
    "240p": {"9:16": (240, 426), "3:4": (276, 368), "1:1": (320, 320), "4:3": (370, 278), "16:9": (426, 240)},
    "360p": {"9:16": (360, 640), "3:4": (416, 554), "1:1": (480, 480), "4:3": (554, 416), "16:9": (640, 360)},
    "480p": {"9:16": (480, 854), "3:4": (554, 738), "1:1": (640, 640), "4:3": (740, 555), "16:9": (854, 480)},
    "720p": {"9:16": (720, 1280), "3:4": (832, 1110), "1:1": (960, 960), "4:3": (1108, 832), "16:9": (1280, 720)},
}

# OpenSora's NUM_FRAMES_MAP names ("2s" is 51 frames at 24 fps) plus "image".
FRAME_PRESETS: dict[str, int] = {"image": 1, "2s": 51, "4s": 102, "8s": 204, "16s": 408}

DEFAULT_FPS = 24
IMAGE_FPS = 120  # OpenSora feeds fps=120 to the model for single images
LATENT_CHANNELS = 4
SPATIAL_COMPRESSION = 8
VAE_CHUNK_FRAMES = 17  # the temporal VAE encodes 17-frame chunks independently
VAE_TIME_DOWNSAMPLE = 4  # each chunk is front-padded to a multiple of 4, then compressed 4x


def image_size(resolution: str, aspect_ratio: str) -> tuple[int, int]:
    """Nominal (height, width) in pixels of an OpenSora resolution/aspect-ratio preset."""
    if resolution not in IMAGE_SIZES:
        raise ValueError(f"unknown resolution {resolution!r}; expected one of {', '.join(RESOLUTIONS)}")
    table = IMAGE_SIZES[resolution]
    if aspect_ratio not in table:
        raise ValueError(f"unknown aspect ratio {aspect_ratio!r} (H:W); expected one of {', '.join(ASPECT_RATIOS)}")
    return table[aspect_ratio]


def num_frames_for(preset: str | int) -> int:
    """Frame count of a frame preset name ("image", "2s" ... "16s") or a free positive integer."""
    if isinstance(preset, str) and preset in FRAME_PRESETS:
        return FRAME_PRESETS[preset]
    try:
        frames = int(preset)
    except (TypeError, ValueError):
        raise ValueError(f"unknown frame preset {preset!r}; expected one of {', '.join(FRAME_PRESETS)} or an integer")
    if frames < 1:
        raise ValueError(f"num_frames must be >= 1, got {frames}")
    return frames


def vae_latent_frames(num_frames: int) -> int:
    """Latent frame count the OpenSora 1.2 VAE gives for num_frames pixel frames (17 -> 5, 51 -> 15, 1 -> 1)."""
    if num_frames < 1:
        raise ValueError(f"num_frames must be >= 1, got {num_frames}")
    full, rest = divmod(num_frames, VAE_CHUNK_FRAMES)
    per_chunk = -(-VAE_CHUNK_FRAMES // VAE_TIME_DOWNSAMPLE)
    return full * per_chunk + -(-rest // VAE_TIME_DOWNSAMPLE)


def latent_hw(height: int, width: int) -> tuple[int, int]:
    """Latent (rows, cols) for a nominal pixel size: floor division by 8 (426 -> 53)."""
    if height < SPATIAL_COMPRESSION or width < SPATIAL_COMPRESSION:
        raise ValueError(f"height and width must be >= {SPATIAL_COMPRESSION} pixels, got {height}x{width}")
    return height // SPATIAL_COMPRESSION, width // SPATIAL_COMPRESSION


def latent_shape(height: int, width: int, num_frames: int, batch_size: int = 1) -> tuple[int, int, int, int, int]:
    """Latent tensor shape [B, 4, T, H/8, W/8] for a nominal video size."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    rows, cols = latent_hw(height, width)
    return (batch_size, LATENT_CHANNELS, vae_latent_frames(num_frames), rows, cols)


def model_fps(num_frames: int, fps: float = DEFAULT_FPS) -> float:
    """The fps value OpenSora passes to the model: IMAGE_FPS for a single frame, fps otherwise."""
    return float(IMAGE_FPS if num_frames == 1 else fps)


@dataclass(frozen=True)
class VideoSpec:
    """Nominal size of one OpenSora generation: pixel height/width, frame count and fps."""

    height: int
    width: int
    num_frames: int
    fps: float = DEFAULT_FPS

    def __post_init__(self) -> None:
        if self.height < SPATIAL_COMPRESSION or self.width < SPATIAL_COMPRESSION:
            raise ValueError(f"height and width must be >= {SPATIAL_COMPRESSION}, got {self.height}x{self.width}")
        if self.num_frames < 1:
            raise ValueError(f"num_frames must be >= 1, got {self.num_frames}")
        if self.fps <= 0:
            raise ValueError(f"fps must be > 0, got {self.fps}")

    @classmethod
    def from_preset(
        cls, resolution: str = "240p", aspect_ratio: str = "9:16", frames: str | int = "2s", fps: float = DEFAULT_FPS
    ) -> "VideoSpec":
        """Spec for a resolution / aspect-ratio / frame preset (defaults: OpenSora's sample.py, 240p 9:16 51 f)."""
        height, width = image_size(resolution, aspect_ratio)
        return cls(height, width, num_frames_for(frames), fps)

    @property
    def latent_frames(self) -> int:
        """VAE latent frame count."""
        return vae_latent_frames(self.num_frames)

    @property
    def model_fps(self) -> float:
        """fps passed to the model (120 for an image)."""
        return model_fps(self.num_frames, self.fps)

    def latent_shape(self, batch_size: int = 1) -> tuple[int, int, int, int, int]:
        """Latent tensor shape [B, 4, T, H/8, W/8]."""
        return latent_shape(self.height, self.width, self.num_frames, batch_size)
