"""Draw the pack's Registry icon, docs/icon.png (400x400 PNG), from frames of the toy world.

    .venv/bin/python scripts/make_icon.py [--out docs/icon.png] [--size 400]

The picture is the idea of CHAI: four clips of the toy world (`toyworld/world.py`) that share one entity, the
same red ball, over four different scenes (one frame of each clip). Deterministic: fixed seeds, no fonts, only numpy and Pillow.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

from comfyui_chai.toyworld import world

ROOT = Path(__file__).resolve().parents[1]
TILES = (("beach", "bouncing", 3), ("night sky", "right", 11), ("forest", "left", 5), ("desert", "up", 8))
BACKDROP = (24, 26, 34)
FRAME = 4  # which of the clip's 8 frames is shown


def tile(scene: str, motion: str, seed: int) -> np.ndarray:
    """One 16x16 RGB frame in [0, 1] of a red ball's clip over a scene."""
    spec = world.random_spec(scene, "ball", "red", motion, np.random.default_rng(seed))
    return world.render(spec)[FRAME]


def draw(size: int = 400) -> Image.Image:
    """The icon: a 2x2 grid of tiles with rounded gaps on a dark square."""
    margin, gap = size // 16, size // 25
    cell = (size - 2 * margin - gap) // 2
    canvas = np.zeros((size, size, 3), np.uint8)
    canvas[:] = BACKDROP
    for i, (scene, motion, seed) in enumerate(TILES):
        pixels = (np.clip(tile(scene, motion, seed), 0, 1) * 255).round().astype(np.uint8)
        big = np.asarray(Image.fromarray(pixels).resize((cell, cell), Image.NEAREST))
        r = margin + (i // 2) * (cell + gap)
        c = margin + (i % 2) * (cell + gap)
        canvas[r:r + cell, c:c + cell] = big
    return Image.fromarray(canvas, "RGB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "icon.png")
    parser.add_argument("--size", type=int, default=400)
    args = parser.parse_args()
    draw(args.size).save(args.out, optimize=True)
    print(f"wrote {args.out} ({args.size}x{args.size})")


if __name__ == "__main__":
    main()
