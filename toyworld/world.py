"""The toy world: procedural scenes, coloured object shapes and motions rendered as small RGB clips (numpy).

A clip is one object of one colour moving in one way over one static background, `FRAMES` frames of `SIZE` x
`SIZE` pixels, float32 RGB in [0, 1], layout [T, H, W, 3]. The world is built to be learnable by a tiny video
transformer with 2x2 patches: every object spans several patches, every moving object moves exactly one pixel
per frame along its axis (bouncing: two hops of 4 pixels), and objects never leave the frame.

Colour design (what the detectors rely on): every background colour has saturation (max - min of RGB) at most
`BACKGROUND_MAX_SAT`, every object colour at least `OBJECT_MIN_SAT`; so the object's pixels are the saturated
ones. Car wheels are dark and unsaturated (part of the look, not of the silhouette the detectors match).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .detail import backdrop

WORLD_VERSION = 2  # 2: seeded detail (grain, clouds, waves, props; `detail.py`); 1: plain backgrounds
SIZE = 16  # frame height and width in pixels
FRAMES = 8  # frames per clip

SCENES = ("beach", "forest", "snowfield", "night sky", "city street", "desert")
OBJECTS = ("ball", "car", "kite", "bird", "box")
COLOURS = ("red", "blue", "green", "yellow", "purple")
MOTIONS = ("left", "right", "up", "down", "bouncing", "still")

PALETTE: dict[str, tuple[float, float, float]] = {
    "red": (0.92, 0.12, 0.10),
    "blue": (0.12, 0.25, 0.95),
    "green": (0.10, 0.82, 0.18),
    "yellow": (0.96, 0.86, 0.08),
    "purple": (0.66, 0.12, 0.88),
}
BACKGROUND_MAX_SAT = 0.42
OBJECT_MIN_SAT = 0.70
WHEEL = (0.08, 0.08, 0.09)

# Object silhouettes: "X" = object colour, "o" = dark detail (wheels), "." = background.
SHAPE_ROWS: dict[str, tuple[str, ...]] = {
    "ball": ("..XX..",
             ".XXXX.",
             "XXXXXX",
             "XXXXXX",
             ".XXXX.",
             "..XX.."),
    "car": ("..XXXX..",
            ".XXXXXX.",
            "XXXXXXXX",
            "XXXXXXXX",
            ".oo..oo."),
    "kite": ("..X..",
             ".XXX.",
             "XXXXX",
             ".XXX.",
             "..X..",
             "..X..",
             ".X..."),
    "bird": ("XX....XX",
             ".XX..XX.",
             "..XXXX..",
             "...XX..."),
    "box": ("XXXXXX",
            "XXXXXX",
            "XXXXXX",
            "XXXXXX",
            "XXXXXX",
            "XXXXXX"),
}

BOUNCE_HEIGHT = 4  # pixels; the bounce is two hops, offset -round(4 |sin(pi t / 4)|)


def shape_masks(name: str) -> tuple[np.ndarray, np.ndarray]:
    """(colour mask, dark-detail mask) bool arrays of an object's silhouette."""
    rows = SHAPE_ROWS[name]
    grid = np.array([list(r) for r in rows])
    return grid == "X", grid == "o"


def shape_size(name: str) -> tuple[int, int]:
    """(height, width) of an object's bounding box, dark details included."""
    rows = SHAPE_ROWS[name]
    return len(rows), len(rows[0])


def motion_offsets(motion: str, frames: int = FRAMES) -> np.ndarray:
    """Integer (dy, dx) offset of the object in each frame relative to frame 0: int array [frames, 2]."""
    t = np.arange(frames)
    zero = np.zeros(frames, dtype=int)
    if motion == "left":
        return np.stack([zero, -t], 1)
    if motion == "right":
        return np.stack([zero, t], 1)
    if motion == "up":
        return np.stack([-t, zero], 1)
    if motion == "down":
        return np.stack([t, zero], 1)
    if motion == "bouncing":
        hop = np.rint(BOUNCE_HEIGHT * np.abs(np.sin(np.pi * t / 4))).astype(int)
        return np.stack([-hop, zero], 1)
    if motion == "still":
        return np.stack([zero, zero], 1)
    raise ValueError(f"unknown motion {motion!r}; expected one of {MOTIONS}")


def start_range(obj: str, motion: str, size: int = SIZE, frames: int = FRAMES) -> tuple[range, range]:
    """Allowed top-left (rows, cols) at frame 0 so the whole object stays inside the frame for the whole clip."""
    h, w = shape_size(obj)
    off = motion_offsets(motion, frames)
    dy_min, dy_max = int(off[:, 0].min()), int(off[:, 0].max())
    dx_min, dx_max = int(off[:, 1].min()), int(off[:, 1].max())
    # Keep a one-pixel margin where the motion leaves room for it, so objects do not hug the border.
    margin_y = 1 if size - h - (dy_max - dy_min) >= 2 else 0
    margin_x = 1 if size - w - (dx_max - dx_min) >= 2 else 0
    rows = range(-dy_min + margin_y, size - h - dy_max - margin_y + 1)
    cols = range(-dx_min + margin_x, size - w - dx_max - margin_x + 1)
    if len(rows) == 0 or len(cols) == 0:
        raise ValueError(f"a {obj} moving {motion} does not fit a {size}x{size} frame")
    return rows, cols


@dataclass(frozen=True)
class ClipSpec:
    """Everything that determines one clip: the four attributes, the start position and the background seed."""

    scene: str
    obj: str
    colour: str
    motion: str
    top: int  # object bounding-box row at frame 0
    left: int  # object bounding-box column at frame 0
    bg_seed: int = 0

    def __post_init__(self) -> None:
        for value, allowed, name in ((self.scene, SCENES, "scene"), (self.obj, OBJECTS, "obj"),
                                     (self.colour, COLOURS, "colour"), (self.motion, MOTIONS, "motion")):
            if value not in allowed:
                raise ValueError(f"unknown {name} {value!r}; expected one of {allowed}")
        rows, cols = start_range(self.obj, self.motion)
        if self.top not in rows or self.left not in cols:
            raise ValueError(f"start ({self.top}, {self.left}) of a {self.obj} moving {self.motion} leaves the frame")

    @property
    def combo(self) -> tuple[str, str, str, str]:
        """(scene, obj, colour, motion)."""
        return self.scene, self.obj, self.colour, self.motion


# How far the start may vary around the centred track: along the motion's axis, and across it (both axes for a
# still object). Zero: every (object, motion) has one track, so the layout is the caption's, not a coin flip the
# sampler must settle at high noise; seeds still vary the backgrounds (sun, stars, buildings, dunes, drifts).
ALONG_JITTER = 0
ACROSS_JITTER = 0


def _around_middle(allowed: range, jitter: int) -> list[int]:
    """The allowed starts within `jitter` of the middle of the allowed range."""
    mid = allowed[len(allowed) // 2]
    return [v for v in allowed if abs(v - mid) <= jitter]


def random_spec(scene: str, obj: str, colour: str, motion: str, rng: np.random.Generator) -> ClipSpec:
    """A clip of the given attributes at a random start near the centred track, with a random background seed."""
    # Positions vary a little around a centred track rather than over the whole frame: the world stays a
    # generative task (seeds differ) while a tiny model can learn coherent objects and motion in CPU hours.
    rows, cols = start_range(obj, motion)
    row_jitter = ALONG_JITTER if motion in ("up", "down", "bouncing") else ACROSS_JITTER
    col_jitter = ALONG_JITTER if motion in ("left", "right") else ACROSS_JITTER
    top = int(rng.choice(_around_middle(rows, row_jitter)))
    left = int(rng.choice(_around_middle(cols, col_jitter)))
    return ClipSpec(scene, obj, colour, motion, top, left, int(rng.integers(0, 2**31 - 1)))


# ---------------------------------------------------------------------------------------------- backgrounds

def _fill(img: np.ndarray, rows: slice, colour: tuple[float, float, float]) -> None:
    img[rows] = colour


def _beach(rng: np.random.Generator, s: int) -> np.ndarray:
    img = np.empty((s, s, 3), np.float32)
    sea_top = 6 + int(rng.integers(-1, 2))
    sand_top = sea_top + 3 + int(rng.integers(0, 2))
    _fill(img, slice(0, sea_top), (0.62, 0.82, 0.94))
    _fill(img, slice(sea_top, sand_top), (0.22, 0.50, 0.62))
    img[sand_top - 1, :] = (0.80, 0.90, 0.92)  # surf line
    _fill(img, slice(sand_top, s), (0.93, 0.86, 0.64))
    sun = int(rng.integers(1, s - 3))
    img[1:3, sun:sun + 2] = (1.0, 0.98, 0.82)
    return img


def _forest(rng: np.random.Generator, s: int) -> np.ndarray:
    img = np.empty((s, s, 3), np.float32)
    ground = s - 3
    _fill(img, slice(0, ground), (0.07, 0.22, 0.10))
    _fill(img, slice(ground, s), (0.26, 0.30, 0.14))
    canopy = 4 + int(rng.integers(0, 2))
    img[:canopy] = (0.13, 0.36, 0.15)
    cols = np.arange(int(rng.integers(0, 3)), s, 4)
    for c in cols:
        img[canopy:ground, c] = (0.36, 0.23, 0.13)
    return img


def _snowfield(rng: np.random.Generator, s: int) -> np.ndarray:
    img = np.empty((s, s, 3), np.float32)
    horizon = 5 + int(rng.integers(0, 2))
    _fill(img, slice(0, horizon), (0.70, 0.77, 0.86))
    img[horizon - 1, :] = (0.62, 0.66, 0.72)  # distant hills
    _fill(img, slice(horizon, s), (0.97, 0.97, 0.99))
    for r in range(horizon + 3, s, 4):
        start = int(rng.integers(0, s // 2))
        img[r, start:start + s // 2] = (0.84, 0.87, 0.93)  # drift lines
    return img


def _night_sky(rng: np.random.Generator, s: int) -> np.ndarray:
    img = np.empty((s, s, 3), np.float32)
    _fill(img, slice(0, s), (0.04, 0.05, 0.17))
    img[s - 2:] = (0.02, 0.03, 0.08)  # dark treeline
    ys = rng.integers(0, s - 3, size=7)
    xs = rng.integers(0, s, size=7)
    img[ys, xs] = (0.95, 0.95, 0.88)
    moon = int(rng.integers(1, s - 3))
    img[1:3, moon:moon + 2] = (0.88, 0.88, 0.80)
    return img


def _city_street(rng: np.random.Generator, s: int) -> np.ndarray:
    img = np.empty((s, s, 3), np.float32)
    road = s - 4
    _fill(img, slice(0, road), (0.72, 0.74, 0.80))
    col = 0
    while col < s:
        width = int(rng.integers(3, 6))
        top = int(rng.integers(1, 6))
        shade = 0.36 + 0.08 * float(rng.integers(0, 3))
        img[top:road, col:col + width] = (shade, shade, shade + 0.05)
        img[top + 1:road - 1:2, col + 1:col + width - 1:2] = (0.86, 0.84, 0.66)  # windows
        col += width + 1
    _fill(img, slice(road, s), (0.24, 0.24, 0.26))
    img[road + 2, ::3] = (0.90, 0.90, 0.90)  # lane dashes
    img[road + 2, 1::3] = (0.90, 0.90, 0.90)
    return img


def _desert(rng: np.random.Generator, s: int) -> np.ndarray:
    img = np.empty((s, s, 3), np.float32)
    _fill(img, slice(0, s), (0.96, 0.91, 0.76))
    base = 6 + int(rng.integers(0, 2))
    phase = float(rng.uniform(0, 2 * math.pi))
    cols = np.arange(s)
    dune = base + np.rint(1.5 * np.sin(cols * 2 * math.pi / s + phase)).astype(int)
    rows = np.arange(s)[:, None]
    img[rows >= dune[None, :]] = (0.86, 0.68, 0.46)
    img[rows >= dune[None, :] + 5] = (0.76, 0.57, 0.36)
    return img


BACKGROUNDS = {"beach": _beach, "forest": _forest, "snowfield": _snowfield, "night sky": _night_sky,
               "city street": _city_street, "desert": _desert}


def render_background(scene: str, seed: int, size: int = SIZE) -> np.ndarray:
    """The static background of a scene: float32 [size, size, 3] in [0, 1], varied by the seed."""
    if scene not in BACKGROUNDS:
        raise ValueError(f"unknown scene {scene!r}; expected one of {SCENES}")
    return BACKGROUNDS[scene](np.random.default_rng(seed), size)


def render_backdrop(scene: str, seed: int, size: int = SIZE, frames: int = FRAMES) -> np.ndarray:
    """The detailed backdrop of a scene, object-free: float32 [frames, size, size, 3] (see `detail.py`)."""
    return backdrop(render_background(scene, seed, size), scene, seed, frames)


def object_track(spec: ClipSpec, frames: int = FRAMES) -> np.ndarray:
    """Top-left (row, col) of the object in every frame: int array [frames, 2]."""
    return np.array([spec.top, spec.left]) + motion_offsets(spec.motion, frames)


def render(spec: ClipSpec, size: int = SIZE, frames: int = FRAMES) -> np.ndarray:
    """The clip of a spec: float32 [frames, size, size, 3] RGB in [0, 1]."""
    video = render_backdrop(spec.scene, spec.bg_seed, size, frames)
    colour_mask, dark_mask = shape_masks(spec.obj)
    h, w = colour_mask.shape
    for t, (r, c) in enumerate(object_track(spec, frames)):
        window = video[t, r:r + h, c:c + w]
        window[colour_mask] = PALETTE[spec.colour]
        window[dark_mask] = WHEEL
    return video


def object_masks(spec: ClipSpec, size: int = SIZE, frames: int = FRAMES) -> np.ndarray:
    """Ground-truth bool masks [frames, size, size] of the object's coloured pixels."""
    colour_mask, _ = shape_masks(spec.obj)
    h, w = colour_mask.shape
    out = np.zeros((frames, size, size), bool)
    for t, (r, c) in enumerate(object_track(spec, frames)):
        out[t, r:r + h, c:c + w] = colour_mask
    return out


def saturation(video: np.ndarray) -> np.ndarray:
    """Per-pixel saturation max(RGB) - min(RGB) of [..., 3] colours."""
    return video.max(-1) - video.min(-1)
