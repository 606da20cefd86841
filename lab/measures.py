"""Quality measures that do not penalise borrowing: each compares a clip with what ground truth looks like, not with
one same-seed reference, so a sample pulled toward a donor is judged only on whether it looks real and right.

All pixel measures read the background (every pixel outside the detected object, grown by one pixel):
  * flicker: mean absolute change between consecutive frames (ground truth moves only clouds and waves);
  * high-frequency energy: mean squared 4-neighbour Laplacian per frame (grain, edges; blur lowers it, speckle
    raises it); reported as a ratio to the ground truth of the same prompts;
  * palette distance: mean distance of each pixel's colour to the nearest colour the scene's ground truth uses;
  * layout error: mean absolute difference of the time-averaged per-row colour profile from the scene's mean
    ground-truth profile (where the horizon, the sea, the road are).
Set-level measures: the Frechet distance between Gaussian fits of feature sets, on summary features (the above
plus per-band colour statistics) and on the toy world's learned video features (`features.py`).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Sequence

import numpy as np

from comfyui_chai.toyworld.detect import object_pixels
from comfyui_chai.toyworld.world import SCENES, SIZE, render_backdrop

PALETTE_SEEDS = 24
PALETTE_SAMPLES = 2048
BANDS = 4  # horizontal bands of the summary features


def background_masks(video: np.ndarray) -> np.ndarray:
    """Bool [T, H, W]: pixels outside the detected object grown by one pixel (8-neighbourhood)."""
    obj = object_pixels(np.asarray(video, np.float32))
    grown = obj.copy()
    for dr in (-1, 0, 1):
        for dc in (-1, 0, 1):
            grown |= np.roll(np.roll(obj, dr, axis=1), dc, axis=2)
    return ~grown


def flicker(video: np.ndarray, keep: np.ndarray | None = None) -> float:
    """Mean absolute frame-to-frame change over pixels that are background in both frames."""
    v = np.asarray(video, np.float32)
    keep = background_masks(v) if keep is None else keep
    both = keep[1:] & keep[:-1]
    if not both.any():
        return 0.0
    return float(np.abs(v[1:] - v[:-1]).mean(-1)[both].mean())


def hf_energy(video: np.ndarray, keep: np.ndarray | None = None) -> float:
    """Mean squared 4-neighbour Laplacian (per channel) over interior background pixels of every frame."""
    v = np.asarray(video, np.float32)
    keep = background_masks(v) if keep is None else keep
    lap = 4 * v[:, 1:-1, 1:-1] - v[:, :-2, 1:-1] - v[:, 2:, 1:-1] - v[:, 1:-1, :-2] - v[:, 1:-1, 2:]
    inner = keep[:, 1:-1, 1:-1]
    return float((lap ** 2).mean(-1)[inner].mean()) if inner.any() else 0.0


@lru_cache(maxsize=None)
def scene_palette(scene: str) -> np.ndarray:
    """Colours [PALETTE_SAMPLES, 3] drawn from the scene's ground-truth backdrops (fixed seeds)."""
    pixels = np.concatenate([render_backdrop(scene, 20_000 + k).reshape(-1, 3) for k in range(PALETTE_SEEDS)])
    pick = np.random.default_rng(0).choice(len(pixels), PALETTE_SAMPLES, replace=False)
    return pixels[pick]


def palette_distance(video: np.ndarray, scene: str, keep: np.ndarray | None = None) -> float:
    """Mean Euclidean distance of background colours to the nearest colour of the scene's palette."""
    v = np.asarray(video, np.float32)
    keep = background_masks(v) if keep is None else keep
    colours = v[keep]
    if not len(colours):
        return 0.0
    pal = scene_palette(scene)
    d2 = (colours ** 2).sum(1)[:, None] - 2 * colours @ pal.T + (pal ** 2).sum(1)[None]
    return float(np.sqrt(np.maximum(d2.min(1), 0.0)).mean())


def row_profile(video: np.ndarray, keep: np.ndarray | None = None) -> np.ndarray:
    """Time-averaged mean colour of each row's background pixels: [H, 3] (NaN rows where all is object)."""
    v = np.asarray(video, np.float32)
    keep = background_masks(v) if keep is None else keep
    w = keep[..., None].astype(np.float32)
    total = w.sum((0, 2))
    with np.errstate(invalid="ignore", divide="ignore"):
        return (v * w).sum((0, 2)) / total


@lru_cache(maxsize=None)
def scene_profile(scene: str, size: int = SIZE) -> np.ndarray:
    """The scene's mean ground-truth row profile [H, 3] over fixed seeds."""
    return np.mean([render_backdrop(scene, 30_000 + k, size).mean((0, 2)) for k in range(64)], 0)


def layout_error(video: np.ndarray, scene: str, keep: np.ndarray | None = None) -> float:
    """Mean absolute difference between the clip's row profile and the scene's ground-truth profile."""
    prof = row_profile(video, keep)
    ok = ~np.isnan(prof).any(-1)
    return float(np.abs(prof[ok] - scene_profile(scene, prof.shape[0])[ok]).mean()) if ok.any() else 0.0


def summary_features(video: np.ndarray, keep: np.ndarray | None = None) -> np.ndarray:
    """[2 + 2 * BANDS * 3]: flicker, HF energy, and per horizontal band the background's mean and std colour."""
    v = np.asarray(video, np.float32)
    keep = background_masks(v) if keep is None else keep
    out = [flicker(v, keep), hf_energy(v, keep)]
    for rows in np.array_split(np.arange(v.shape[1]), BANDS):
        px = v[:, rows][keep[:, rows]]
        out += (px.mean(0).tolist() + px.std(0).tolist()) if len(px) else [0.0] * 6
    return np.asarray(out, np.float64)


@dataclass(frozen=True)
class ClipMeasures:
    """Every per-clip measure of one clip."""

    flicker: float
    hf: float
    palette: float
    layout: float
    summary: np.ndarray


def measure(video: np.ndarray, scene: str) -> ClipMeasures:
    """Per-clip measures of a clip whose prompt names `scene` (the prompt's, not the detected scene)."""
    if scene not in SCENES:
        raise ValueError(f"unknown scene {scene!r}")
    v = np.asarray(video, np.float32)
    keep = background_masks(v)
    return ClipMeasures(flicker(v, keep), hf_energy(v, keep), palette_distance(v, scene, keep),
                        layout_error(v, scene, keep), summary_features(v, keep))


# ---------------------------------------------------------------------------------------------- sets

def _sqrtm_psd(m: np.ndarray) -> np.ndarray:
    w, u = np.linalg.eigh((m + m.T) / 2)
    return (u * np.sqrt(np.clip(w, 0, None))) @ u.T


def gaussian(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, covariance) of a feature set [N, D]."""
    x = np.asarray(x, np.float64)
    return x.mean(0), np.cov(x, rowvar=False)


def frechet_stats(mu_a: np.ndarray, ca: np.ndarray, mu_b: np.ndarray, cb: np.ndarray) -> float:
    """Frechet distance between two Gaussians given by mean and covariance."""
    mu = mu_a - mu_b
    root = _sqrtm_psd(ca)
    cross = _sqrtm_psd(root @ cb @ root)
    return float(mu @ mu + np.trace(ca) + np.trace(cb) - 2 * np.trace(cross))


def frechet(a: np.ndarray, b: np.ndarray) -> float:
    """Frechet distance between Gaussian fits of two feature sets [N, D] (the FID formula)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or min(len(a), len(b)) < 2:
        raise ValueError(f"need two [N >= 2, D] feature sets of equal D, got {a.shape} and {b.shape}")
    return frechet_stats(*gaussian(a), *gaussian(b))


def standardiser(reference: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """z-scores by the reference set's mean and std (so summary features of unequal scale weigh alike)."""
    mean, std = reference.mean(0), reference.std(0) + 1e-8
    return lambda x: (np.asarray(x, np.float64) - mean) / std


def bootstrap(values: Sequence[float] | np.ndarray, reps: int = 1000, seed: int = 0,
              stat: Callable[[np.ndarray], float] = np.mean) -> tuple[float, float, float]:
    """(statistic, 2.5th, 97.5th percentile) of a per-prompt statistic under resampling of the prompts."""
    x = np.asarray(values, np.float64)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(x), size=(reps, len(x)))
    boot = np.array([stat(x[i]) for i in idx])
    return float(stat(x)), float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))


def bootstrap_frechet(features: np.ndarray, reference: np.ndarray, reps: int = 200, seed: int = 0,
                      paired: np.ndarray | None = None) -> tuple[float, float, float]:
    """Frechet distance of a cell's features to the reference set with a 95% interval over resampled prompts;
    with `paired` (another cell's features for the same prompts), of the difference FD(features) - FD(paired)."""
    rng = np.random.default_rng(seed)
    n = len(features)

    def stat(i: np.ndarray) -> float:
        d = frechet(features[i], reference)
        return d - frechet(paired[i], reference) if paired is not None else d

    point = stat(np.arange(n))
    boot = np.array([stat(rng.integers(0, n, size=n)) for _ in range(reps)])
    return float(point), float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))
