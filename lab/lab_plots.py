"""Pictures of the quality lab: a frame grid per prompt and a plot of quality against steps per condition (Pillow)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

GRID_FRAMES = (0, 3, 7)
SCALE = 4
COLOURS = {"plain": (40, 40, 40), "scene": (31, 119, 180), "object": (214, 39, 40), "none": (150, 150, 150),
           "same": (44, 160, 44), "fusion": (148, 103, 189), "scene, pack steps": (23, 190, 207),
           "none, pack steps": (255, 127, 14)}


def _font(size: int = 13) -> Any:
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1
        return ImageFont.load_default()


def strip(video: np.ndarray) -> np.ndarray:
    """uint8 [16 * SCALE, 3 * (16 * SCALE + 2), 3]: frames GRID_FRAMES side by side, enlarged."""
    frames = []
    for f in GRID_FRAMES:
        img = (np.clip(video[f], 0, 1) * 255).astype(np.uint8).repeat(SCALE, 0).repeat(SCALE, 1)
        frames += [img, np.full((img.shape[0], 2, 3), 255, np.uint8)]
    return np.concatenate(frames[:-1], 1)


def write_grid(path: Path, rows: Sequence[tuple[str, Sequence[tuple[str, np.ndarray]]]]) -> Path:
    """PNG: for each (title, [(column label, clip)]) a titled row of frame strips."""
    from PIL import Image, ImageDraw

    font = _font()
    pad, line = 8, 16
    cols = max(len(r[1]) for r in rows)
    sample = strip(rows[0][1][0][1])
    cw, ch = sample.shape[1], sample.shape[0]
    img = Image.new("RGB", (pad + cols * (cw + pad), pad + len(rows) * (2 * line + ch + pad)), "white")
    draw = ImageDraw.Draw(img)
    y = pad
    for title, clips in rows:
        draw.text((pad, y), title, fill="black", font=font)
        for c, (name, video) in enumerate(clips):
            draw.text((pad + c * (cw + pad), y + line), name, fill="dimgray", font=font)
            img.paste(Image.fromarray(strip(video)), (pad + c * (cw + pad), y + 2 * line))
        y += 2 * line + ch + pad
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)
    return path


def write_steps_plot(path: Path, series: dict[str, list[tuple[int, float, float, float]]], floor: float,
                     reference: float, title: str) -> Path:
    """Line plot: per condition (steps, value, lo, hi) points with interval bars; floor and 30-step lines."""
    from PIL import Image, ImageDraw

    font = _font(12)
    w, h, left, right, top, bottom = 640, 400, 60, 150, 30, 40
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    steps = sorted({p[0] for pts in series.values() for p in pts})
    values = [v for pts in series.values() for p in pts for v in p[1:]] + [floor, reference]
    lo, hi = 0.0, max(values) * 1.05
    x_of = lambda s: left + (steps.index(s) + 0.5) * (w - left - right) / len(steps)  # noqa: E731
    y_of = lambda v: top + (hi - v) / (hi - lo) * (h - top - bottom)  # noqa: E731
    d.text((left, 8), title, fill="black", font=font)
    d.line([(left, top), (left, h - bottom), (w - right, h - bottom)], fill="black")
    for k in range(5):
        v = lo + k * (hi - lo) / 4
        d.text((8, y_of(v) - 6), f"{v:.2f}", fill="black", font=font)
    for s in steps:
        d.text((x_of(s) - 10, h - bottom + 6), f"{s} steps", fill="black", font=font)
    for value, name, colour in ((floor, "ground truth floor", (120, 120, 120)), (reference, "30 steps", (0, 0, 0))):
        d.line([(left, y_of(value)), (w - right, y_of(value))], fill=colour, width=1)
        d.text((w - right + 4, y_of(value) - 6), name, fill=colour, font=font)
    for i, (name, pts) in enumerate(series.items()):
        colour = COLOURS.get(name, (0, 0, 0))
        pts = sorted(pts)
        off = (i - len(series) / 2) * 3
        d.line([(x_of(s) + off, y_of(v)) for s, v, _, _ in pts], fill=colour, width=2)
        for s, v, a, b in pts:
            d.line([(x_of(s) + off, y_of(a)), (x_of(s) + off, y_of(b))], fill=colour, width=1)
        d.line([(w - right + 4, h - bottom - 30 - 16 * (len(series) - i) + 7), (w - right + 18, h - bottom - 30 - 16 * (len(series) - i) + 7)],
               fill=colour, width=2)
        d.text((w - right + 22, h - bottom - 30 - 16 * (len(series) - i)), name, fill=colour, font=font)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)
    return path
