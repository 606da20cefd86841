"""Captions for toy-world clips (several phrasings per combination) and the seeded train / held-out split."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .world import COLOURS, MOTIONS, OBJECTS, SCENES

Combo = tuple[str, str, str, str]  # (scene, obj, colour, motion)

# Each scene phrase ends in the noun the entity extractor files as a scene ("snowfield" alone parses as an
# object, so that scene is always a field). Prepositions follow each phrase's natural use.
SCENE_PHRASES: dict[str, tuple[str, ...]] = {
    "beach": ("beach", "sunny beach", "sandy beach"),
    "forest": ("forest", "dense forest", "green forest", "pine forest"),
    "snowfield": ("snowy field", "snow-covered field", "white snowy field"),
    "night sky": ("night sky", "starry night sky", "dark night sky"),
    "city street": ("city street", "busy city street", "quiet city street"),
    "desert": ("desert", "sandy desert", "hot desert"),
}
SCENE_PREPOSITIONS: dict[str, tuple[str, ...]] = {
    "beach": ("on", "across", "along"),
    "forest": ("in", "through"),
    "snowfield": ("on", "across"),
    "night sky": ("in", "across"),
    "city street": ("on", "along"),
    "desert": ("in", "across"),
}
SCENE_HEAD = {"beach": "beach", "forest": "forest", "snowfield": "field", "night sky": "sky",
              "city street": "street", "desert": "desert"}
MOTION_PHRASES: dict[str, tuple[str, ...]] = {
    "left": ("moving to the left", "drifting left", "sliding to the left", "travelling left"),
    "right": ("moving to the right", "drifting right", "sliding to the right", "travelling right"),
    "up": ("rising upward", "moving up", "floating upward"),
    "down": ("falling down", "moving down", "sinking downward"),
    "bouncing": ("bouncing", "bouncing up and down", "hopping"),
    "still": ("standing still", "sitting still", "staying still"),
}
# {c} colour, {o} object, {m} motion phrase, {p} preposition, {s} scene phrase.
TEMPLATES: tuple[str, ...] = (
    "a {c} {o} {m} {p} a {s}",
    "a {c} {o} {m} {p} the {s}",
    "a {s} with a {c} {o} {m}",
    "a {c} {o} is {m} {p} the {s}",
    "the {s}, where a {c} {o} is {m}",
)


def caption(combo: Combo, rng: np.random.Generator) -> str:
    """One random phrasing of a combination."""
    scene, obj, colour, motion = combo
    template = TEMPLATES[int(rng.integers(len(TEMPLATES)))]
    pick = lambda options: options[int(rng.integers(len(options)))]  # noqa: E731
    return template.format(c=colour, o=obj, m=pick(MOTION_PHRASES[motion]), p=pick(SCENE_PREPOSITIONS[scene]),
                           s=pick(SCENE_PHRASES[scene]))


def canonical_caption(combo: Combo) -> str:
    """The fixed first phrasing of a combination (e.g. for demos and benchmark tables)."""
    scene, obj, colour, motion = combo
    return TEMPLATES[0].format(c=colour, o=obj, m=MOTION_PHRASES[motion][0], p=SCENE_PREPOSITIONS[scene][0],
                               s=SCENE_PHRASES[scene][0])


def all_combos() -> list[Combo]:
    """Every (scene, obj, colour, motion) combination, in a fixed order."""
    return list(itertools.product(SCENES, OBJECTS, COLOURS, MOTIONS))


@dataclass(frozen=True)
class Split:
    """Seeded partition of the combinations into training and held-out sets."""

    train: tuple[Combo, ...]
    held_out: tuple[Combo, ...]


def make_split(seed: int = 0, held_out_fraction: float = 0.1) -> Split:
    """Hold out a seeded fraction of the combinations; every attribute value still occurs in training."""
    if not 0.0 < held_out_fraction < 0.5:
        raise ValueError(f"held_out_fraction must be in (0, 0.5), got {held_out_fraction}")
    combos = all_combos()
    order = np.random.default_rng(seed).permutation(len(combos))
    n_held = int(round(len(combos) * held_out_fraction))
    held = sorted(combos[i] for i in order[:n_held])
    train = sorted(combos[i] for i in order[n_held:])
    return Split(tuple(train), tuple(held))


def seeded_prefix(held_out: Sequence[Combo], n: int | None, rng: np.random.Generator) -> list[Combo]:
    """The first n combinations (all when None) of a permutation drawn from `rng`: a smaller run is a prefix."""
    order = rng.permutation(len(held_out))
    n = len(held_out) if n is None else min(n, len(held_out))
    return [tuple(held_out[int(j)]) for j in order[:n]]  # type: ignore[misc]
