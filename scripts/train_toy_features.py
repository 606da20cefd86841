"""Train the toy world's video feature extractor (`lab/features.py`) and write its weights.

    python scripts/train_toy_features.py                  # lab/measure_weights/toyworld_features.safetensors
    python scripts/train_toy_features.py --out f.safetensors --steps 300

Seeded and deterministic for a given thread count; a few minutes on one CPU thread.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from lab import features  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Train, print held-out accuracies, save."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=features.WEIGHTS)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--batch", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    net, acc = features.train(a.steps, a.batch, a.seed)
    facts = {"steps": a.steps, "batch": a.batch, "seed": a.seed, "seconds": round(time.perf_counter() - t0, 1),
             "held_out_accuracy": acc}
    features.save(net, a.out, facts)
    print("held-out accuracy per head:", {k: round(v, 3) for k, v in acc.items()})
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
