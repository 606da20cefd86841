"""The picture of what a hit gives (docs/quality_restart.png): for a few held-out lab prompts, frames of ground truth,
the full run and the hits on the 30-step lab model, then on the distilled 4-step student.

    OMP_NUM_THREADS=1 python bench/restart_picture.py            # 3 prompts, about 2 minutes on one core

Each clip comes from the restart lab's own conditions (`lab/restart_lab.py`, the product's restart arithmetic), on
the lab's first held-out combinations and their donors, with the lab's usual seed. Rows marked "(not taken)" are
donors the pack refuses for that mode; they show why.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from comfyui_chai.toyworld.latent import decode  # noqa: E402
from comfyui_chai.toyworld.model import DEFAULT_CFG, lab_weights, load_toy_model, toy_text_encoder  # noqa: E402
from comfyui_chai.toyworld.prompts import make_split  # noqa: E402
from comfyui_chai.toyworld.world import random_spec, render  # noqa: E402
from lab.lab import LabSampler, make_lab_items  # noqa: E402
from lab.lab_plots import write_grid  # noqa: E402
from lab.restart_lab import Condition, run_condition  # noqa: E402

STUDENT = Path(__file__).resolve().parents[1] / "toyworld" / "weights" / "toyworld_detail_stdit3_4step.safetensors"
FULL_STEP = [("plain 30 (the miss)", Condition("reference", 30)), ("plain 8", Condition("plain", 8)),
             ("CA 8, scene", Condition("chai", 8, "scene")), ("restart 8, scene", Condition("restart", 8, "scene", 0.8)),
             ("restart 8, other scene (not taken)", Condition("restart", 8, "object", 0.8))]
DISTILLED = [("4 Euler (the miss)", Condition("reference", 4)), ("dpmpp_2m 3", Condition("solver", 3, solver="dpmpp_2m")),
             ("re-roll 3, resumed", Condition("restart", 3, "same", 0.75, solver="dpmpp_2m", history=True)),
             ("scene 3, resumed (not taken)", Condition("restart", 3, "scene", 0.75, solver="dpmpp_2m", history=True))]


def clips(sampler: LabSampler, item, conditions) -> list[tuple[str, np.ndarray]]:
    """(label, RGB clip) of each condition on one lab item."""
    relations = sorted({c.relation for _, c in conditions if c.relation != "-"})
    donors = {rel: sampler.donor(item.donors[rel]) for rel in relations}
    out = []
    for label, cond in conditions:
        latent, _, _ = run_condition(sampler, cond, item.request, donors)
        out.append((label, decode(latent)[0].numpy()))
    return out


def main(argv: list[str] | None = None) -> int:
    """Render the picture."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs" / "quality_restart.png")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    split = make_split(0, 0.1)
    items = make_lab_items(split.held_out, split.train, a.prompts)
    teacher = LabSampler(load_toy_model(lab_weights()), toy_text_encoder(), cfg=DEFAULT_CFG, full_steps=30)
    student = LabSampler(load_toy_model(STUDENT), toy_text_encoder(), cfg=1.0, full_steps=4)
    rows = []
    for item in items:
        truth = render(random_spec(*item.request.combo, np.random.default_rng(item.request.seed)))
        rows.append((f"30-step lab model: {item.request.prompt}", [("ground truth", truth)]
                     + clips(teacher, item, FULL_STEP)))
        rows.append(("the same request on the distilled 4-step student (cfg 1)", clips(student, item, DISTILLED)))
    print(f"wrote {write_grid(a.out, rows)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
