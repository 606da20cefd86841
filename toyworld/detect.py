"""Detectors that read a toy-world clip back: scene, object colour, object shape and motion, from pixels only.

They score generated clips, so they never use the generator's hidden state: the object is the set of
saturated pixels (the world keeps backgrounds below `BACKGROUND_MAX_SAT` and objects above `OBJECT_MIN_SAT`),
restricted per frame to its largest 8-connected component (stray saturated specks in a generated frame do not
pull the centroid), and
  * colour: the mean RGB of the object pixels of all frames, nearest palette colour;
  * shape: for each silhouette the best IoU over every placement in each frame, summed over frames, highest;
  * motion: the per-frame centroid track, centred, nearest to each motion's centred track (squared error);
  * scene: the time-averaged background (object pixels left out), nearest per-scene mean background (the mean
    of `SCENE_REFERENCE_SEEDS` renders, so random details such as stars average out).
A clip with no saturated pixel in any frame gets "none" for colour, shape and motion.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .world import (BACKGROUND_MAX_SAT, COLOURS, FRAMES, MOTIONS, OBJECT_MIN_SAT, OBJECTS, PALETTE, SCENES, SIZE,
                    motion_offsets, render_backdrop, saturation, shape_masks)

SAT_THRESHOLD = 0.5 * (BACKGROUND_MAX_SAT + OBJECT_MIN_SAT)
SCENE_REFERENCE_SEEDS = 64
NONE = "none"
ATTRIBUTES = ("scene", "obj", "colour", "motion")


@dataclass(frozen=True)
class Detection:
    """What the detectors read from one clip."""

    scene: str
    obj: str
    colour: str
    motion: str

    def as_tuple(self) -> tuple[str, str, str, str]:
        """(scene, obj, colour, motion), the order of a world combination."""
        return self.scene, self.obj, self.colour, self.motion


def largest_component(mask: np.ndarray) -> np.ndarray:
    """The largest 8-connected component of a 2-D bool mask (ties: the first found in row-major order)."""
    h, w = mask.shape
    labels = np.zeros((h, w), np.int32)
    best_label, best_size, current = 0, 0, 0
    for r0, c0 in zip(*np.nonzero(mask)):
        if labels[r0, c0]:
            continue
        current += 1
        labels[r0, c0] = current
        queue, size = deque([(r0, c0)]), 0
        while queue:
            r, c = queue.popleft()
            size += 1
            for dr in (-1, 0, 1):
                for dc in (-1, 0, 1):
                    rr, cc = r + dr, c + dc
                    if 0 <= rr < h and 0 <= cc < w and mask[rr, cc] and not labels[rr, cc]:
                        labels[rr, cc] = current
                        queue.append((rr, cc))
        if size > best_size:
            best_label, best_size = current, size
    return labels == best_label if best_size else np.zeros_like(mask)


def object_pixels(video: np.ndarray) -> np.ndarray:
    """Per-frame bool masks [T, H, W] of the detected object (largest saturated component of each frame)."""
    sat = saturation(np.asarray(video, np.float32)) >= SAT_THRESHOLD
    return np.stack([largest_component(m) for m in sat])


@lru_cache(maxsize=None)
def scene_references(size: int = SIZE) -> np.ndarray:
    """Mean background of each scene over fixed seeds: float32 [len(SCENES), size, size, 3]."""
    return np.stack([np.mean([render_backdrop(s, 10_000 + k, size).mean(0) for k in range(SCENE_REFERENCE_SEEDS)], 0)
                     for s in SCENES]).astype(np.float32)


def detect_scene(video: np.ndarray, masks: np.ndarray) -> str:
    """Nearest scene reference by squared colour difference over the pixels the object left uncovered at least once."""
    keep = ~masks
    counts = keep.sum(0)
    bg = (video * keep[..., None]).sum(0) / np.maximum(counts, 1)[..., None]
    valid = counts > 0
    refs = scene_references(video.shape[1])
    if not valid.any():
        valid = np.ones_like(valid)
        bg = video.mean(0)
    dists = (((refs - bg[None]) ** 2).sum(-1) * valid[None]).sum((1, 2))
    return SCENES[int(np.argmin(dists))]


def detect_colour(video: np.ndarray, masks: np.ndarray) -> str:
    """Nearest palette colour to the mean object colour, or "none"."""
    if not masks.any():
        return NONE
    mean = video[masks].mean(0)
    names = list(COLOURS)
    dists = [float(((mean - np.asarray(PALETTE[n])) ** 2).sum()) for n in names]
    return names[int(np.argmin(dists))]


@lru_cache(maxsize=None)
def _silhouettes() -> tuple[np.ndarray, ...]:
    return tuple(shape_masks(o)[0] for o in OBJECTS)


def best_iou(mask: np.ndarray, template: np.ndarray) -> float:
    """Highest IoU between a frame mask and the template placed anywhere fully inside the frame."""
    th, tw = template.shape
    h, w = mask.shape
    if th > h or tw > w:
        return 0.0
    windows = np.lib.stride_tricks.sliding_window_view(mask, (th, tw))  # [h-th+1, w-tw+1, th, tw]
    inter = (windows & template).sum((-1, -2))
    union = mask.sum() + template.sum() - inter
    return float((inter / np.maximum(union, 1)).max())


def detect_shape(masks: np.ndarray) -> str:
    """Object whose silhouette has the highest IoU summed over the frames that show something, or "none"."""
    frames = [m for m in masks if m.any()]
    if not frames:
        return NONE
    scores = [sum(best_iou(m, sil) for m in frames) for sil in _silhouettes()]
    return OBJECTS[int(np.argmax(scores))]


def centroid_track(masks: np.ndarray) -> np.ndarray:
    """Per-frame (row, col) centroid of the mask, NaN for empty frames: float [T, 2]."""
    out = np.full((len(masks), 2), np.nan)
    for t, m in enumerate(masks):
        rows, cols = np.nonzero(m)
        if rows.size:
            out[t] = rows.mean(), cols.mean()
    return out


def detect_motion(masks: np.ndarray) -> str:
    """Motion whose centred offset track is nearest (squared error over the frames that show the object)."""
    track = centroid_track(masks)
    seen = ~np.isnan(track[:, 0])
    if seen.sum() < 2:
        return NONE
    obs = track[seen] - track[seen].mean(0)
    best, best_err = NONE, np.inf
    for motion in MOTIONS:
        ref = motion_offsets(motion, len(masks))[seen].astype(float)
        ref -= ref.mean(0)
        err = float(((obs - ref) ** 2).sum())
        if err < best_err:
            best, best_err = motion, err
    return best


def detect(video: np.ndarray) -> Detection:
    """All four attributes of one RGB clip [T, H, W, 3] in [0, 1]."""
    video = np.asarray(video, np.float32)
    if video.ndim != 4 or video.shape[-1] != 3:
        raise ValueError(f"expected one RGB clip [T, H, W, 3], got shape {video.shape}")
    masks = object_pixels(video)
    return Detection(detect_scene(video, masks), detect_shape(masks), detect_colour(video, masks),
                     detect_motion(masks))


def accuracy(detections: list[Detection], truths: list[tuple[str, str, str, str]]) -> dict[str, float]:
    """Fraction right per attribute and for all four together ("all")."""
    if len(detections) != len(truths) or not truths:
        raise ValueError("need as many detections as truths, at least one")
    out = {}
    for i, name in enumerate(ATTRIBUTES):
        out[name] = float(np.mean([d.as_tuple()[i] == t[i] for d, t in zip(detections, truths)]))
    out["all"] = float(np.mean([d.as_tuple() == tuple(t) for d, t in zip(detections, truths)]))
    return out


__all__ = ["Detection", "detect", "accuracy", "object_pixels", "detect_scene", "detect_colour", "detect_shape",
           "detect_motion", "FRAMES"]
