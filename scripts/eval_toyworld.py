"""Score a trained toy-world model: generate the held-out (or training) combinations and read them back.

    python scripts/eval_toyworld.py WEIGHTS.safetensors --steps 30 --limit 90 --png grid.png   # at cfg 2, the default

Prints the detector accuracy (scene, object, colour, motion, all together) and optionally writes a PNG grid
(one row per clip: the frames side by side, the prompt in the JSON) and a JSON with every prompt and detection.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from comfyui_chai.opensora.loading import load_stdit3  # noqa: E402
from comfyui_chai.toyworld.prompts import make_split  # noqa: E402
from lab.evaluate import DEFAULT_CFG, DEFAULT_STEPS, evaluate  # noqa: E402


def save_grid(videos: np.ndarray, path: Path, scale: int = 4) -> None:
    """Write clips [N, T, H, W, 3] as one PNG, a row per clip, frames left to right, nearest-neighbour upscaled."""
    from PIL import Image

    rows = [np.concatenate(list(v), axis=1) for v in videos]
    grid = (np.concatenate(rows, axis=0) * 255).round().astype(np.uint8)
    img = Image.fromarray(grid)
    img.resize((img.width * scale, img.height * scale), Image.NEAREST).save(path)


def main(argv: list[str] | None = None) -> int:
    """Evaluate and print the accuracy."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("weights")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    p.add_argument("--cfg", type=float, default=DEFAULT_CFG)
    p.add_argument("--set", choices=["held_out", "train"], default="held_out")
    p.add_argument("--limit", type=int, default=None, help="first N combinations of the set")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--png", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    model = load_stdit3(a.weights)
    split = make_split()
    combos = list(split.held_out if a.set == "held_out" else split.train)
    if a.set == "train":
        combos = [combos[i] for i in np.random.default_rng(a.seed).permutation(len(combos))]
    combos = combos[: a.limit] if a.limit else combos
    start = time.perf_counter()
    result = evaluate(model, combos, steps=a.steps, cfg=a.cfg, seed=a.seed)
    seconds = time.perf_counter() - start
    acc = {k: round(v, 4) for k, v in result.accuracy.items()}
    print(f"{len(combos)} {a.set} clips, {a.steps} steps, cfg {a.cfg}: {acc} ({seconds / len(combos):.2f} s/clip)")
    if a.png:
        save_grid(result.videos, a.png)
    if a.json:
        rows = [{"prompt": pr, "truth": list(c), "read": list(d.as_tuple())}
                for pr, c, d in zip(result.prompts, result.combos, result.detections)]
        a.json.write_text(json.dumps({"accuracy": acc, "steps": a.steps, "cfg": a.cfg, "clips": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
