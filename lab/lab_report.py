"""Scoring and tables of the quality lab: per-clip scores, cells with bootstrap intervals, the verdict lines."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from comfyui_chai.toyworld.detect import ATTRIBUTES, detect
from comfyui_chai.toyworld.prompts import Combo
from comfyui_chai.toyworld.world import random_spec, render
from lab import features as feats
from lab.measures import bootstrap, bootstrap_frechet, frechet, measure, standardiser

if TYPE_CHECKING:
    from lab.intervals import ClusterBootstrap, Clustered
from lab.quality import count_leakage, psnr, ssim

# The Frechet distance on learned features uses the reference set's top principal components: ~90 clips per cell
# cannot estimate a 32-d covariance (the distance would be dominated by estimation noise).
PCA_DIMS = 12
CellKey = tuple[str, str, int, str]  # (kind: gt / reference / plain / chai, relation, steps, variant)
GT_SET = 640  # clips of the ground-truth set every Frechet distance is measured against


def ground_truth_set(combos: Sequence[Combo], n: int = GT_SET, seed: int = 77) -> np.ndarray:
    """n ground-truth clips [n, T, H, W, 3] of the combinations (cycled), fresh seeds."""
    if not combos or n < 1:
        raise ValueError(f"need at least one combination and one clip, got {len(combos)} and {n}")
    rng = np.random.default_rng(seed)
    return np.stack([render(random_spec(*combos[k % len(combos)], rng)) for k in range(n)])


@dataclass
class Clip:
    """One generated (or ground-truth) clip of one lab item under one condition."""

    item: int
    key: CellKey
    video: np.ndarray
    truth: Combo
    donors: list[Combo] = field(default_factory=list)
    fired: list[int] = field(default_factory=list)
    seed: int = 0  # which of the combination's seeds (0 .. K - 1)
    evals: int = 0  # model evaluations per CFG branch (0: not counted)


@dataclass
class Scored:
    """Per-clip scores."""

    correct: np.ndarray  # bool [5]: scene, obj, colour, motion, all four
    leak: tuple[int, int]  # (leaked, pairs) against the clip's donors
    flicker: float
    hf: float
    palette: float
    layout: float
    summary: np.ndarray
    psnr: float = math.nan
    ssim: float = math.nan


def score(clip: Clip, reference: np.ndarray | None) -> Scored:
    """Detectors, leakage, pixel measures and (given the same-seed 30-step clip) PSNR / SSIM of one clip."""
    d = detect(clip.video).as_tuple()
    correct = np.array([d[i] == clip.truth[i] for i in range(len(ATTRIBUTES))] + [d == tuple(clip.truth)])
    leak = count_leakage([d], [clip.truth], [clip.donors]) if clip.donors else None
    m = measure(clip.video, clip.truth[0])
    out = Scored(correct, (leak.leaked, leak.pairs) if leak else (0, 0), m.flicker, m.hf, m.palette, m.layout,
                 m.summary)
    if reference is not None:
        out.psnr, out.ssim = psnr(clip.video, reference), ssim(clip.video, reference)
    return out


@dataclass
class Cell:
    """Every clip of one condition, with its scores and learned features, in item order."""

    key: CellKey
    clips: list[Clip]
    scores: list[Scored]
    features: np.ndarray


def build_cells(clips: Sequence[Clip], references: dict[Any, np.ndarray]) -> dict[CellKey, Cell]:
    """Score every clip and group them by condition (references: (item, seed) or item -> its full-run clip)."""
    groups: dict[CellKey, list[Clip]] = {}
    for c in clips:
        groups.setdefault(c.key, []).append(c)
    cells = {}
    for key, group in groups.items():
        group.sort(key=lambda c: (c.item, c.seed))
        ref = (lambda c: None) if key[0] in ("gt", "reference") else (
            lambda c: references.get((c.item, c.seed), references.get(c.item)))
        cells[key] = Cell(key, group, [score(c, ref(c)) for c in group],
                          feats.features(np.stack([c.video for c in group])))
    return cells


@dataclass
class Baselines:
    """Ground-truth statistics every row is read against."""

    reference_features: np.ndarray  # learned features of the big ground-truth set
    reference_summary: np.ndarray  # summary features of the same set
    gt_flicker: float
    gt_hf: float
    components: np.ndarray  # [D, PCA_DIMS] principal directions of the reference features
    centre: np.ndarray
    reference_groups: np.ndarray | None = None  # the lab item (held-out combination) of each reference clip

    def project(self, f: np.ndarray) -> np.ndarray:
        """Learned features reduced to the reference set's top principal components."""
        return (np.asarray(f) - self.centre) @ self.components


def baselines(gt_set: np.ndarray, gt_cell: Cell, groups: np.ndarray | None = None) -> Baselines:
    """From a large ground-truth clip set [N, T, H, W, 3] (each clip's lab item in `groups`) and the ground-truth
    cell of the lab's own prompts."""
    from lab.measures import summary_features

    ref = feats.features(gt_set)
    centre = ref.mean(0)
    _, _, vt = np.linalg.svd(ref - centre, full_matrices=False)
    return Baselines(ref, np.stack([summary_features(v) for v in gt_set]),
                     float(np.mean([s.flicker for s in gt_cell.scores])),
                     float(np.mean([s.hf for s in gt_cell.scores])), vt[:PCA_DIMS].T, centre,
                     None if groups is None else np.asarray(groups))


def reference_groups(n_clips: int, n_items: int) -> np.ndarray:
    """The lab item of each clip of `ground_truth_set(combos of the items, n_clips)` (it cycles the items)."""
    return np.arange(n_clips) % n_items


def cluster_bootstrap(base: Baselines, n_items: int, reps: int, seed: int = 0,
                      redraw: bool = True) -> "ClusterBootstrap":
    """The lab's interval method on the projected reference features (see `lab/intervals.py`)."""
    from lab.intervals import ClusterBootstrap, Clustered

    if base.reference_groups is None:
        raise ValueError("the baselines know no reference groups")
    return ClusterBootstrap(Clustered(base.project(base.reference_features), base.reference_groups), n_items,
                            reps, seed, redraw)


def clustered(cell: Cell, base: Baselines, keep: Sequence[bool] | None = None, name: str = "") -> "Clustered":
    """A cell's projected features grouped by lab item (optionally only the clips marked in `keep`)."""
    from lab.intervals import Clustered

    out = Clustered(base.project(cell.features), np.array([c.item for c in cell.clips]), name)
    return out if keep is None else out.subset(np.asarray(keep, bool), name)


def row(cell: Cell, base: Baselines, paired: Cell | None = None, reps: int = 200,
        boot: "ClusterBootstrap | None" = None) -> dict[str, Any]:
    """The figures of one cell (means, and 95% bootstrap intervals over prompts for the headline ones); with
    `boot`, the paired FD difference comes from the lab's cluster bootstrap that redraws the reference."""
    s = cell.scores
    z = standardiser(base.reference_summary)
    leaked, pairs = sum(x.leak[0] for x in s), sum(x.leak[1] for x in s)
    out: dict[str, Any] = {
        "key": list(cell.key), "n": len(s),
        "attrs": bootstrap([x.correct[4] for x in s], reps),
        "attr_each": [float(np.mean([x.correct[i] for x in s])) for i in range(4)],
        "leak": leaked / pairs if pairs else math.nan,
        "flicker_ratio": float(np.mean([x.flicker for x in s])) / max(base.gt_flicker, 1e-9),
        "hf_ratio": float(np.mean([x.hf for x in s])) / max(base.gt_hf, 1e-9),
        "palette": float(np.mean([x.palette for x in s])),
        "layout": float(np.mean([x.layout for x in s])),
        "fd_summary": frechet(z(np.stack([x.summary for x in s])), z(base.reference_summary)),
        "fd_net": bootstrap_frechet(base.project(cell.features), base.project(base.reference_features), reps),
        "psnr": float(np.mean([x.psnr for x in s if math.isfinite(x.psnr)] or [math.nan])),
        "ssim": float(np.mean([x.ssim for x in s if math.isfinite(x.ssim)] or [math.nan])),
        "fired": sorted({tuple(c.fired) for c in cell.clips}),
    }
    if paired is not None and boot is not None:
        out["d_fd_net"] = boot.difference(clustered(cell, base, name=repr(cell.key)),
                                          clustered(paired, base, name=repr(paired.key)))[:3]
    elif paired is not None:
        out["d_fd_net"] = bootstrap_frechet(base.project(cell.features), base.project(base.reference_features), reps,
                                            paired=base.project(paired.features))
    if paired is not None:
        # paired per-prompt differences of two pixel measures: flicker (in ground truth's units) and palette
        out["d_flicker"] = bootstrap([(a.flicker - b.flicker) / max(base.gt_flicker, 1e-9)
                                      for a, b in zip(s, paired.scores)], reps)
        out["d_palette"] = bootstrap([a.palette - b.palette for a, b in zip(s, paired.scores)], reps)
    return out


def fmt_ci(t: tuple[float, float, float], scale: float = 1.0, digits: int = 2) -> str:
    """'point [lo, hi]'."""
    p, lo, hi = (x * scale for x in t)
    return f"{p:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def label(key: CellKey) -> str:
    """Readable condition name."""
    kind, rel, n, var = key
    if kind == "gt":
        return "ground truth"
    if kind == "reference":
        return f"plain {n} (reference)"
    if kind == "plain":
        return f"plain {n}"
    if kind == "solver":
        return f"{var} {n}"
    if kind == "restart":
        sigma, *flags = var.split()
        return f"restart {sigma} x{n} {rel}" + "".join(f" {f}" for f in flags)
    return f"CHAI {n} {rel}" + ("" if var == "default" else f" {var}")


def table_rows(rows: Sequence[dict[str, Any]], with_delta: bool = True,
               delta_label: str = "FD - plain N") -> tuple[list[str], list[list[str]]]:
    """(header, body) of a results table (the Frechet distances as points: a bootstrap of one distance resamples
    clips with repeats, which inflates it, so only the paired difference to plain N carries an interval)."""
    head = ["condition", "all 4 attrs %", "leak %", "flicker x", "HF x", "palette", "layout", "FD summary",
            "FD features", "PSNR", "SSIM"]
    if with_delta:
        head.insert(9, delta_label)
    body = []
    for r in rows:
        cells = [label(tuple(r["key"])), fmt_ci(r["attrs"], 100, 1),
                 "-" if math.isnan(r["leak"]) else f"{100 * r['leak']:.1f}", f"{r['flicker_ratio']:.2f}",
                 f"{r['hf_ratio']:.2f}", f"{r['palette']:.4f}", f"{r['layout']:.4f}", f"{r['fd_summary']:.2f}",
                 f"{r['fd_net'][0]:.1f}", "-" if math.isnan(r["psnr"]) else f"{r['psnr']:.1f}",
                 "-" if math.isnan(r["ssim"]) else f"{r['ssim']:.3f}"]
        if with_delta:
            cells.insert(9, fmt_ci(r["d_fd_net"]) if "d_fd_net" in r else "-")
        body.append(cells)
    return head, body
