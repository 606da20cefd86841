"""Summaries of the toy-world quality experiment (`experiment`): per-condition rows (detector accuracy, PSNR /
SSIM against the reference, donor leakage, seconds), the printed tables, the verdicts against the targets, and a
PNG grid of frame strips.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from comfyui_chai.toyworld.detect import ATTRIBUTES, Detection, accuracy
from comfyui_chai.toyworld.prompts import Combo
from comfyui_chai.toyworld.text_table import table
from lab.experiment import FULL_STEPS, Item, Record
from lab.quality import DONOR_KINDS, count_leakage, differing_attributes

TARGETS = {"reference_all": 0.90, "within_points": 0.02, "leakage": 0.05}
GRID_FRAMES = (0, 2, 5, 7)
GRID_SCALE = 4


# ---------------------------------------------------------------------------------------------- summaries

@dataclass
class Row:
    """Scores of one condition over the prompts it ran on."""

    label: str
    n: int
    acc: dict[str, float]
    psnr: float
    ssim: float
    leakage: float
    seconds: float
    leak_pairs: int = 0


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def summarise(label: str, recs: Sequence[Record], items: Sequence[Item], donors: Callable[[Record], Any],
              truth: Callable[[Record], Combo] | None = None, extra_seconds: Callable[[Record], float] | None = None
              ) -> Row:
    """A row from records: accuracy vs truth (default the prompt's), mean PSNR / SSIM / seconds, leakage."""
    if not recs:
        return Row(label, 0, {a: math.nan for a in (*ATTRIBUTES, "all")}, math.nan, math.nan, math.nan, math.nan)
    truth = truth or (lambda r: items[r.item].combo)
    truths = [truth(r) for r in recs]
    acc = accuracy([Detection(*r.detected) for r in recs], truths)
    leak = count_leakage([r.detected for r in recs], truths, [donors(r) for r in recs])
    seconds = [r.seconds + (extra_seconds(r) if extra_seconds else 0.0) for r in recs]
    return Row(label, len(recs), acc, _mean([r.psnr for r in recs]), _mean([r.ssim for r in recs]), leak.rate,
               _mean(seconds), leak.pairs)


def build_rows(records: Sequence[Record], items: Sequence[Item], steps: int, full_steps: int = FULL_STEPS
               ) -> list[Row]:
    """The condition rows at one step budget, the reference first."""
    both = lambda r: [d.combo for d in items[r.item].donors.values()]  # noqa: E731
    own = lambda r: items[r.item].donors[r.kind].combo  # noqa: E731
    picked = lambda r: items[r.item].donors[items[r.item].pick].combo  # noqa: E731

    def sel(condition: str, n: int, kind: str | None = None, hits_only: bool = False) -> list[Record]:
        return [r for r in records if r.condition == condition and r.steps == n and (kind is None or r.kind == kind)
                and (not hits_only or r.info.get("hit"))]

    rows = [summarise(f"{full_steps} steps (reference)", sel("reference", full_steps), items, both),
            summarise(f"plain {steps}", sel("plain", steps), items, both)]
    for kind in DONOR_KINDS:
        rows.append(summarise(f"CHAI {steps}, {kind} donor", sel("chai", steps, kind, True), items, own))
    for kind in DONOR_KINDS:
        rows.append(summarise(f"NIRVANA {steps}, {kind} donor", sel("nirvana", steps, kind), items, own))
    pick = [r for r in sel("nirvana", steps) if r.kind == items[r.item].pick]
    rows.append(summarise(f"NIRVANA {steps}, whole-prompt pick", pick, items, picked,
                          extra_seconds=lambda r: items[r.item].pick_seconds))
    return rows


def donor_row(records: Sequence[Record], items: Sequence[Item], full_steps: int = FULL_STEPS) -> Row:
    """The donors' own clips scored against the donors' attributes (no PSNR: they have no reference)."""
    recs = [r for r in records if r.condition == "donor"]
    return summarise(f"donors ({full_steps} steps, vs own prompt)", recs, items, lambda r: [],
                     truth=lambda r: items[r.item].donors[r.kind].combo)


def pct(x: float) -> str:
    """A share as a percentage with one decimal ('-' for nan)."""
    return "-" if math.isnan(x) else f"{100 * x:.1f}"


def num(x: float, digits: int) -> str:
    """A number with `digits` decimals ('-' for nan, 'inf' for infinity)."""
    return "-" if math.isnan(x) else ("inf" if math.isinf(x) else f"{x:.{digits}f}")


def main_table(rows: Sequence[Row]) -> str:
    """The per-condition table."""
    head = ["condition", "n", "scene %", "shape %", "colour %", "motion %", "all %", "PSNR dB", "SSIM", "leak %",
            "s/clip"]
    body = [[r.label, r.n, *(pct(r.acc[a]) for a in ATTRIBUTES), pct(r.acc["all"]),
             "-" if r.label.endswith("(reference)") else num(r.psnr, 2),
             "-" if r.label.endswith("(reference)") else num(r.ssim, 4), pct(r.leakage), num(r.seconds, 3)]
            for r in rows]
    return table(head, body)


def sweep_table(by_steps: dict[int, list[Row]]) -> str:
    """PSNR / SSIM drift against the reference for every condition at every step budget."""
    head = ["condition", "steps", "n", "all %", "PSNR dB", "SSIM", "PSNR - plain", "SSIM - plain", "leak %"]
    body = []
    for steps, rows in by_steps.items():
        plain = next(r for r in rows if r.label.startswith("plain"))
        for r in rows[1:]:
            name = r.label.split(",", 1)[1].strip() if "," in r.label else ""
            cond = r.label.split()[0] + (f" ({name})" if name else "")
            body.append([cond, steps, r.n, pct(r.acc["all"]), num(r.psnr, 2), num(r.ssim, 4),
                         "" if r is plain else num(r.psnr - plain.psnr, 2),
                         "" if r is plain else num(r.ssim - plain.ssim, 4), pct(r.leakage)])
    return table(head, body)


def verdicts(rows: Sequence[Row]) -> list[list[str]]:
    """The issue's targets against the headline rows."""
    ref, plain = rows[0], rows[1]
    chai = [r for r in rows if r.label.startswith("CHAI")]

    def ok(flag: bool) -> str:
        return "ok" if flag else "MISSED"

    out = [["30-step all-together accuracy", pct(ref.acc["all"]), f">= {pct(TARGETS['reference_all'])}",
            ok(ref.acc["all"] >= TARGETS["reference_all"])]]
    for r in chai:
        out.append([f"{r.label}: all vs plain", f"{pct(r.acc['all'])} vs {pct(plain.acc['all'])}", ">= plain",
                    ok(r.acc["all"] >= plain.acc["all"])])
        out.append([f"{r.label}: all vs 30 steps", f"{pct(r.acc['all'])} vs {pct(ref.acc['all'])}",
                    f"within {100 * TARGETS['within_points']:.0f} points",
                    ok(r.acc["all"] >= ref.acc["all"] - TARGETS["within_points"])])
        out.append([f"{r.label}: PSNR / SSIM vs plain", f"{num(r.psnr, 2)} / {num(r.ssim, 4)} vs "
                    f"{num(plain.psnr, 2)} / {num(plain.ssim, 4)}", "(reported)",
                    "better" if r.psnr > plain.psnr and r.ssim > plain.ssim else
                    ("worse" if r.psnr < plain.psnr and r.ssim < plain.ssim else "mixed")])
        out.append([f"{r.label}: leakage", pct(r.leakage), f"<= {pct(TARGETS['leakage'])}",
                    ok(r.leakage <= TARGETS["leakage"])])
    return out


# ---------------------------------------------------------------------------------------------- PNG grid

def strip(video: np.ndarray, frames: Sequence[int] = GRID_FRAMES, scale: int = GRID_SCALE, gap: int = 2
          ) -> np.ndarray:
    """Chosen frames side by side, nearest-upscaled, uint8 [H * scale, ..., 3]."""
    tiles = []
    for f in frames:
        img = np.rint(np.clip(video[f], 0, 1) * 255).astype(np.uint8).repeat(scale, 0).repeat(scale, 1)
        tiles += [img, np.full((img.shape[0], gap, 3), 255, np.uint8)]
    return np.concatenate(tiles[:-1], axis=1)


def write_grid(path: Path, records: Sequence[Record], items: Sequence[Item], prompts: int, steps: int,
               full_steps: int = FULL_STEPS) -> Path:
    """PNG: per prompt and donor kind a labelled row of donor, reference, plain, CHAI and NIRVANA frame strips."""
    from PIL import Image, ImageDraw, ImageFont

    try:
        font = ImageFont.load_default(size=13)
    except TypeError:  # Pillow < 10.1
        font = ImageFont.load_default()
    columns = ["donor (30 steps)", f"{full_steps} steps", f"plain {steps}", f"CHAI {steps}", f"NIRVANA {steps}"]
    cell_w = strip(records[0].video).shape[1]
    cell_h = strip(records[0].video).shape[0]
    pad, line, head = 10, 18, 44
    rows = [(i, kind) for i in range(min(prompts, len(items))) for kind in items[i].donors]
    width = pad + len(columns) * (cell_w + pad)
    height = head + len(rows) * (2 * line + cell_h + pad) + pad
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    frames = ", ".join(str(f) for f in GRID_FRAMES)
    draw.text((pad, 4), f"frames {frames} of each clip; same prompt and noise seed across a row (NIRVANA starts from "
              f"the donor's latent instead)", fill="dimgray", font=font)
    for c, name in enumerate(columns):
        draw.text((pad + c * (cell_w + pad), 4 + line), name, fill="black", font=font)

    def find(i: int, condition: str, n: int, kind: str | None) -> Record:
        return next(r for r in records if r.item == i and r.condition == condition and r.steps == n
                    and (kind is None or r.kind == kind))

    y = head
    for i, kind in rows:
        item, donor = items[i], items[i].donors[kind]
        differs = ", ".join(differing_attributes(item.combo, donor.combo)).replace("obj", "shape")
        draw.text((pad, y), f"prompt: {item.prompt}", fill="black", font=font)
        draw.text((pad, y + line), f"{kind} donor: {donor.prompt}  (differs in {differs})", fill="dimgray",
                  font=font)
        y += 2 * line
        clips = [find(i, "donor", full_steps, kind), find(i, "reference", full_steps, None),
                 find(i, "plain", steps, None), find(i, "chai", steps, kind), find(i, "nirvana", steps, kind)]
        for c, rec in enumerate(clips):
            img.paste(Image.fromarray(strip(rec.video)), (pad + c * (cell_w + pad), y))
        y += cell_h + pad
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)
    return path
