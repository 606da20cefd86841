"""The decision's features, computed over plain lists and running sums for speed (issue 25), equal the numpy
formulation: exactly, and the two mean-vector similarities to float32 rounding."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest

from comfyui_chai.cache_store.entities.extract import Entity
from comfyui_chai.cache_store.entities.roles import GENERIC_PEOPLE, MAIN, SCENE, SECONDARY
from comfyui_chai.cache_store.lookup.decision import CONTEXT_WEIGHT, FEATURES, Side, _unit, features, side_of
from comfyui_chai.cache_store.lookup.rule import HitRule


def in_context(side: Side, i: int) -> np.ndarray:
    """Entity i's vector with half the mean of its prompt's other entities added, as first written."""
    others = [k for k in range(len(side.entities)) if k != i]
    if not others:
        return side.vectors[i]
    return _unit(side.vectors[i] + CONTEXT_WEIGHT * side.vectors[others].mean(axis=0))


ROUNDED = ("context_sim", "bag_sim")  # sums of float32 vectors in another order: equal to about 1e-7


def numpy_features(request: Side, donor: Side, rule) -> dict[str, float]:
    """The features as the refitted model's fit computed them: numpy masks over the similarity matrix."""
    out = dict.fromkeys(FEATURES, 0.0)
    n, m = len(request.entities), len(donor.entities)
    out["n_request"], out["n_donor"] = math.log1p(n), math.log1p(m)
    if not n or not m:
        return out
    sims = request.vectors @ donor.vectors.T
    best: dict[str, tuple[float, int, int]] = {}
    found = np.zeros((n, m), dtype=bool)
    same = np.full((n, m), -1.0)
    for i, q in enumerate(request.entities):
        for j, d in enumerate(donor.entities):
            s = float(sims[i, j])
            if not rule.same_thing(q, d, s):
                continue
            found[i, j] = s >= rule.threshold
            same[i, j] = s
            a, b = request.roles[i], donor.roles[j]
            key = ("main_sim" if a == b == MAIN else "scene_sim" if a == b == SCENE
                   else "secondary_sim" if SECONDARY in (a, b) else "cross_sim")
            if s > best.get(key, (-2.0, 0, 0))[0]:
                best[key] = (s, i, j)
    for key, (s, _, _) in best.items():
        out[key] = s
    here = [i for i, r in enumerate(request.roles) if r == SCENE]
    there = [j for j, r in enumerate(donor.roles) if r == SCENE]
    if here and there and float(sims[np.ix_(here, there)].max()) < rule.threshold:
        out["scene_conflict"] = 1.0
    top = max((best[k] for k in ("main_sim", "scene_sim") if k in best), default=None)
    if top is not None:
        _, i, j = top
        out["context_sim"] = float(in_context(request, i) @ in_context(donor, j))
        q, d = request.entities[i], donor.entities[j]
        out["same_head"] = float(q.head == d.head)
        out["compound_differs"] = float(q.head == d.head and q.identity != d.identity)
        out["generic_person"] = float(q.head in GENERIC_PEOPLE)
    mains = [i for i, r in enumerate(request.roles) if r == MAIN]
    out["main_missing"] = float(bool(mains) and not found[mains].any())
    theirs = [j for j, r in enumerate(donor.roles) if r == MAIN]
    out["donor_main_missing"] = float(bool(theirs) and not found[:, theirs].any())
    out["primary_missing"] = float(bool(mains) and not found[mains[0]].any())
    out["donor_primary_missing"] = float(bool(theirs) and not found[:, theirs[0]].any())
    out["primary_best"] = max(0.0, float(same[mains[0]].max())) if mains else 0.0
    out["donor_primary_best"] = max(0.0, float(same[:, theirs[0]].max())) if theirs else 0.0
    out["missing_x_length"] = out["main_missing"] * out["n_request"]
    matched_scenes = [i for i in here if found[i, there].any()] if there else []
    out["scene_primary"] = float(bool(here) and bool(matched_scenes) and matched_scenes[0] == here[0])
    out["scene_backdrop"] = out["main_missing"] * (1.0 - out["scene_primary"])
    out["subjects_differ"] = out["main_missing"] * out["donor_main_missing"]
    out["scene_unanswered"] = float(len(here) > 0 and len(there) == 0)
    out["generic_unanswered"] = out["generic_person"] * out["scene_unanswered"]
    out["bag_sim"] = float(_unit(request.vectors.mean(axis=0)) @ _unit(donor.vectors.mean(axis=0)))
    if donor.prompt is not None:
        out["donor_prompt_best"] = float((request.vectors @ donor.prompt).max())
    return out


HEADS = ("dog", "bear", "lion", "man", "beach", "street", "car", "person")
MODIFIERS = ("sea", "teddy", "red", "city", "sports", "old")


def random_side(rng: random.Random, base: np.ndarray) -> Side:
    """A prompt of 0-6 entities over a small vocabulary, so heads, compounds and near vectors recur."""
    ents, vecs = [], []
    for _ in range(rng.randint(0, 6)):
        head = rng.choice(HEADS)
        kind = "scene" if head in ("beach", "street") else "object"
        mod = rng.choice(MODIFIERS + ("",) * 4)
        text = f"{mod} {head}".strip()
        role = rng.choice((MAIN, SCENE, SECONDARY)) if kind == "object" else rng.choice((SCENE, SECONDARY))
        ents.append(Entity(text, kind, head, role, text if mod in ("sea", "teddy", "sports") else ""))
        v = base[HEADS.index(head)] + 0.35 * np.asarray([rng.gauss(0, 1) for _ in range(base.shape[1])])
        vecs.append(v / np.linalg.norm(v))
    vectors = np.asarray(vecs, dtype=np.float32).reshape(len(ents), base.shape[1])
    prompt = None
    if ents and rng.random() < 0.5:  # entries written with their prompt's vector, and older ones without
        whole = vectors.sum(axis=0) + 0.5 * np.asarray([rng.gauss(0, 1) for _ in range(base.shape[1])])
        prompt = (whole / np.linalg.norm(whole)).astype(np.float32)
    return side_of(ents, [e.role for e in ents], vectors, prompt)


@pytest.mark.parametrize("threshold", [0.5, 0.65, 0.8])
def test_list_features_equal_the_numpy_features_exactly(threshold):
    rng = random.Random(int(threshold * 100))
    base = np.asarray([[rng.gauss(0, 1) for _ in range(16)] for _ in HEADS])
    rule = HitRule(threshold)
    kinds_seen: set[str] = set()
    for _ in range(400):
        request, donor = random_side(rng, base), random_side(rng, base)
        got, want = features(request, donor, rule), numpy_features(request, donor, rule)
        assert {k: v for k, v in got.items() if k not in ROUNDED} == {k: v for k, v in want.items()
                                                                      if k not in ROUNDED}
        assert all(abs(got[k] - want[k]) < 1e-6 for k in ROUNDED)
        kinds_seen.update(k for k, v in want.items() if v)
    # The generated pairs exercise every feature (a pair set that never sets one would prove nothing about it).
    assert kinds_seen == set(FEATURES)
