"""Seeded detail the caption does not determine: grain, drifting clouds, rolling waves and props at random places.

A caption fixes a clip's scene, object, colour and motion; everything here comes from the clip's background seed
only, so a good model must commit to one of many outcomes per prompt, and a sampler that averages outcomes (few
large steps) shows it as blur: less grain, smeared clouds, washed-out waves. Every colour stays below the world's
background saturation bound, so the detectors still find the object as the saturated pixels.

Layers, in order: props (static, random columns), clouds (drift one pixel per frame, wrapping), waves (the beach's
sea rows shift their pattern one pixel per frame) and grain (static per-pixel luminance texture).
"""
from __future__ import annotations

import numpy as np

GRAIN = 0.05  # standard deviation of the static per-pixel luminance grain (clipped at 2 sigma)
CLOUD_ROWS = {"beach": 4, "snowfield": 4, "desert": 5, "city street": 2, "night sky": 9}  # rows clouds may use
CLOUD_COLOUR = {"night sky": (0.20, 0.22, 0.30)}
CLOUD_DEFAULT = (0.98, 0.98, 0.99)
CLOUD_SHAPE = np.array([[0, 1, 1, 0], [1, 1, 1, 1]], bool)
PROPS = {  # scene -> (colour, rows from the bottom where the prop's base sits, silhouettes)
    "beach": ((0.55, 0.50, 0.44), 1, (np.array([[1, 1]], bool), np.array([[0, 1, 0], [1, 1, 1]], bool))),
    "desert": ((0.42, 0.46, 0.34), 2, (np.array([[1, 0, 1], [1, 1, 1], [0, 1, 0]], bool),
                                       np.array([[0, 1, 0], [1, 1, 1]], bool))),
    "snowfield": ((0.22, 0.30, 0.27), 2, (np.array([[0, 1, 0], [1, 1, 1], [0, 1, 0]], bool),)),
    "forest": ((0.30, 0.36, 0.20), 1, (np.array([[1, 1, 1]], bool), np.array([[0, 1, 0], [1, 1, 1]], bool))),
}
WAVE_LIGHT = (0.36, 0.62, 0.74)


def _stamp(frame: np.ndarray, shape: np.ndarray, top: int, left: int, colour: tuple[float, float, float],
           wrap: bool = False) -> None:
    """Paint a bool silhouette onto one frame at (top, left); columns wrap around when `wrap`."""
    h, w = frame.shape[:2]
    for r, c in zip(*np.nonzero(shape)):
        rr, cc = top + r, left + c
        if wrap:
            cc %= w
        if 0 <= rr < h and 0 <= cc < w:
            frame[rr, cc] = colour


def add_props(bg: np.ndarray, scene: str, rng: np.random.Generator) -> None:
    """Two or three static props of the scene at random columns near the bottom (in place)."""
    if scene not in PROPS:
        return
    colour, lift, shapes = PROPS[scene]
    size = bg.shape[0]
    for _ in range(int(rng.integers(2, 4))):
        shape = shapes[int(rng.integers(len(shapes)))]
        top = size - lift - shape.shape[0] - int(rng.integers(0, 3))
        _stamp(bg, shape, top, int(rng.integers(0, size - shape.shape[1] + 1)), colour)


def add_clouds(video: np.ndarray, scene: str, rng: np.random.Generator) -> None:
    """One or two clouds drifting one pixel per frame, left or right, wrapping (in place, [T, H, W, 3])."""
    if scene not in CLOUD_ROWS:
        return
    rows = CLOUD_ROWS[scene]
    colour = CLOUD_COLOUR.get(scene, CLOUD_DEFAULT)
    size = video.shape[2]
    for _ in range(int(rng.integers(1, 3))):
        top = int(rng.integers(0, max(rows - 1, 1)))
        left = int(rng.integers(0, size))
        step = 1 if rng.random() < 0.5 else -1
        for t in range(video.shape[0]):
            _stamp(video[t], CLOUD_SHAPE, top, left + step * t, colour, wrap=True)


def add_waves(video: np.ndarray, scene: str, rng: np.random.Generator, sea_rows: tuple[int, int] | None) -> None:
    """Light wave crests on the beach's sea rows, rolling one pixel per frame (in place)."""
    if scene != "beach" or sea_rows is None:
        return
    top, bottom = sea_rows
    size = video.shape[2]
    period = int(rng.integers(3, 6))
    phase = int(rng.integers(0, period))
    step = 1 if rng.random() < 0.5 else -1
    cols = np.arange(size)
    for t in range(video.shape[0]):
        for k, r in enumerate(range(top, bottom)):
            crest = ((cols + phase + step * t + 2 * k) % period) == 0
            video[t, r, crest] = WAVE_LIGHT


def add_grain(video: np.ndarray, rng: np.random.Generator, amount: float = GRAIN) -> np.ndarray:
    """Static per-pixel luminance grain (the same on all channels, so saturation is unchanged before clipping)."""
    g = np.clip(rng.standard_normal(video.shape[1:3]), -2.0, 2.0).astype(np.float32) * amount
    return np.clip(video + g[None, :, :, None], 0.0, 1.0)


def sea_rows(bg: np.ndarray) -> tuple[int, int] | None:
    """Rows of the beach's sea band (its exact colour), or None."""
    sea = np.all(np.isclose(bg, (0.22, 0.50, 0.62), atol=1e-6), axis=-1).all(axis=1)
    rows = np.nonzero(sea)[0]
    return (int(rows.min()), int(rows.max()) + 1) if rows.size else None


def backdrop(bg: np.ndarray, scene: str, seed: int, frames: int) -> np.ndarray:
    """A scene's static background [H, W, 3] grown into a detailed backdrop [frames, H, W, 3]."""
    rng = np.random.default_rng([int(seed), 7])
    bg = bg.copy()
    waves = sea_rows(bg)
    add_props(bg, scene, rng)
    video = np.repeat(bg[None], frames, axis=0)
    add_clouds(video, scene, rng)
    add_waves(video, scene, rng, waves)
    return add_grain(video, rng).astype(np.float32)
