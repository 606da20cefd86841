"""The learned hit decision: is a donor whose entities match worth borrowing from? (issue 25)

The hit rule (`rule.HitRule`) proposes donors: a main subject or a scene on both sides at similarity >= the
threshold, naming the same kind of thing, scenes agreeing. For each proposed donor a logistic model then reads
what the two prompts share, from the entities and vectors the store already keeps (no extra encoder forward):

  main_sim       best similarity of a request main subject and a donor main subject (same kind of thing)
  scene_sim      best similarity of the two prompts' scenes
  cross_sim      best similarity of a main subject on one side and a scene on the other
  secondary_sim  best similarity of any pair in which one side is a secondary element
  context_sim    the best borrowable pair read in context: each entity's vector plus half the mean vector of the
                 other entities of its prompt ("bat" beside "cave" is not "batter" beside "pitch")
  bag_sim        the mean vectors of all entities of the two prompts (a whole-prompt similarity)
  scene_conflict both prompts name a scene and no pair of them reaches the threshold (past the rule's scene test:
                 they agree only by their kind of place, `lexicon.same_kind_of_place`, "field" / "meadow")
  same_head      the best pair has the same head noun; compound_differs: same head, another compound noun
  generic_person the best pair is a person named only generically ("man playing guitar")
  main_missing   the request names a main subject and no donor entity matches it (the match is only the scene);
                 donor_main_missing the same for the donor's main subject; primary_missing and
                 donor_primary_missing the same for the first main subject a prompt names (long prompts name
                 several)
  primary_best   best similarity of the request's first main subject to any donor entity, whatever its role
                 (the donor may show it as a secondary element); donor_primary_best the same the other way
  missing_x_length  main_missing times n_request: a scene-only match means less the longer the request (in
                 long prose every clause names a place; in a short prompt the place may be the point)
  n_request      the request's entity count (log), n_donor the donor's
  scene_primary  the request's first-named scene is matched by a donor scene (in prose, later places are
                 backdrops); scene_backdrop: main_missing and not scene_primary; subjects_differ: main_missing
                 and donor_main_missing (each side shows a main subject the other lacks). The request's order
                 only: an entry written before the eighteenth pass keeps no order of its entities
                 (`mention_order`), so the store reads them in entity-id order, not in its prompt's
  scene_unanswered  the request names a scene and the donor none; generic_unanswered: that, with the best pair
                 a generically named person (a girl borrowing from another girl somewhere else)
  donor_prompt_best  best similarity of a request entity to the donor's whole prompt (its vector embedded when
                 the entry was written, `prompt_vector`): how much what the request names is what the donor is
                 about, not a backdrop of it; 0 when the entry has no prompt vector (then `fallback` decides)

The weights, the features used and the acceptance threshold were fitted to labelled pairs and chosen by
leave-one-style-out cross-validation (`python -m bench.fit_decision`, which writes data/decision.json). The file
holds two models: one that reads the donor's prompt vector, and its `fallback`, fitted without it, for entries
written before prompt vectors were stored.
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ..entities.roles import GENERIC_PEOPLE, MAIN, SCENE, SECONDARY

DECISION_FILE = Path(__file__).resolve().parent / "data" / "decision.json"
CONTEXT_WEIGHT = 0.5
FEATURES = ("main_sim", "scene_sim", "cross_sim", "secondary_sim", "context_sim", "bag_sim", "scene_conflict",
            "same_head", "compound_differs", "generic_person", "n_request", "n_donor", "main_missing",
            "donor_main_missing", "primary_missing", "donor_primary_missing",
            "primary_best", "donor_primary_best", "missing_x_length", "scene_primary", "scene_backdrop",
            "subjects_differ", "scene_unanswered", "generic_unanswered", "donor_prompt_best")
PROMPT_FEATURES = frozenset({"donor_prompt_best"})  # need the donor's prompt vector
# Read from the donor's first-named main subject, which an entry written before the eighteenth pass does not keep
# (`mention_order`; the store then reads its entities in entity-id order): a model the store runs must give these no
# weight (bench.fit_decision never ships one that does). The subject rule reads them; there an older entry's
# id order only makes the rule fire less or more often than the fit saw.
DONOR_ORDER_FEATURES = frozenset({"donor_primary_missing", "donor_primary_best"})


@dataclass(frozen=True)
class Side:
    """One prompt's entities (objects with text, kind, head, identity), their roles and identity vectors, and the
    unit vector of the whole prompt where the store keeps one (donors written with it)."""

    entities: tuple[Any, ...]
    roles: tuple[str, ...]
    vectors: np.ndarray
    prompt: np.ndarray | None = None


def _unit(v: np.ndarray) -> np.ndarray:
    n = math.sqrt(float(v @ v))
    return v / n if n > 1e-12 else v


def _in_context(side: Side, i: int, total: np.ndarray) -> np.ndarray:
    """Entity i's vector with half the mean of its prompt's other entities added (`total`: the sum of all)."""
    n = len(side.entities)
    if n < 2:
        return side.vectors[i]
    return _unit(side.vectors[i] + CONTEXT_WEIGHT * (total - side.vectors[i]) / (n - 1))


def features(request: Side, donor: Side, rule: Any) -> dict[str, float]:
    """The decision's inputs for one (request, donor) pair under `rule` (its threshold and identity test)."""
    out = dict.fromkeys(FEATURES, 0.0)
    n, m = len(request.entities), len(donor.entities)
    out["n_request"], out["n_donor"] = math.log1p(n), math.log1p(m)
    if not n or not m:
        return out
    # A prompt names a handful of entities: plain lists of the (float32-exact) similarities beat numpy calls on
    # arrays this small.
    sims: list[list[float]] = (request.vectors @ donor.vectors.T).tolist()
    threshold = rule.threshold
    best: dict[str, tuple[float, int, int]] = {}
    found = [[False] * m for _ in range(n)]  # pairs naming the same kind of thing at >= the threshold
    same = [[-1.0] * m for _ in range(n)]  # similarities of the pairs naming the same kind of thing
    for i, q in enumerate(request.entities):
        a, row = request.roles[i], sims[i]
        for j, d in enumerate(donor.entities):
            s = row[j]
            if not rule.same_thing(q, d, s):
                continue
            found[i][j] = s >= threshold
            same[i][j] = s
            b = donor.roles[j]
            key = ("main_sim" if a == b == MAIN else "scene_sim" if a == b == SCENE
                   else "secondary_sim" if SECONDARY in (a, b) else "cross_sim")
            if s > best.get(key, (-2.0, 0, 0))[0]:
                best[key] = (s, i, j)
    for key, (s, _, _) in best.items():
        out[key] = s
    here = [i for i, r in enumerate(request.roles) if r == SCENE]
    there = [j for j, r in enumerate(donor.roles) if r == SCENE]
    if here and there and max(sims[i][j] for i in here for j in there) < threshold:
        out["scene_conflict"] = 1.0
    here_total, there_total = request.vectors.sum(axis=0), donor.vectors.sum(axis=0)
    top = max((best[k] for k in ("main_sim", "scene_sim") if k in best), default=None)
    if top is not None:
        _, i, j = top
        out["context_sim"] = float(_in_context(request, i, here_total) @ _in_context(donor, j, there_total))
        q, d = request.entities[i], donor.entities[j]
        out["same_head"] = float(q.head == d.head)
        out["compound_differs"] = float(q.head == d.head and q.identity != d.identity)
        out["generic_person"] = float(q.head in GENERIC_PEOPLE)
    mains = [i for i, r in enumerate(request.roles) if r == MAIN]
    out["main_missing"] = float(bool(mains) and not any(any(found[i]) for i in mains))
    theirs = [j for j, r in enumerate(donor.roles) if r == MAIN]
    out["donor_main_missing"] = float(bool(theirs) and not any(row[j] for row in found for j in theirs))
    out["primary_missing"] = float(bool(mains) and not any(found[mains[0]]))
    out["donor_primary_missing"] = float(bool(theirs) and not any(row[theirs[0]] for row in found))
    out["primary_best"] = max(0.0, max(same[mains[0]])) if mains else 0.0
    out["donor_primary_best"] = max(0.0, max(row[theirs[0]] for row in same)) if theirs else 0.0
    out["missing_x_length"] = out["main_missing"] * out["n_request"]
    # Where the match is only the scene, how much the scene is the prompt's setting (issue 25's scene-only hits).
    matched_scenes = [i for i in here if any(found[i][j] for j in there)] if there else []
    out["scene_primary"] = float(bool(here) and bool(matched_scenes) and matched_scenes[0] == here[0])
    out["scene_backdrop"] = out["main_missing"] * (1.0 - out["scene_primary"])
    out["subjects_differ"] = out["main_missing"] * out["donor_main_missing"]
    out["scene_unanswered"] = float(bool(here) and not there)
    out["generic_unanswered"] = out["generic_person"] * out["scene_unanswered"]
    out["bag_sim"] = float(_unit(here_total) @ _unit(there_total))  # the mean's direction is the sum's
    if donor.prompt is not None:
        out["donor_prompt_best"] = float(np.max(request.vectors @ donor.prompt))
    return out


SETTING_ENTITIES = 2  # at most this many entities on each side: one thing in one place


def setting_shared(values: dict[str, float]) -> bool:
    """Whether a donor shares the request's first-named scene where both prompts name one thing in one place: the
    place is their main setting, and a restart from such a donor is what the quality lab measured keeping the full
    run's quality (a red ball on a beach serving a blue kite on a beach). Accepted whatever the model says; the
    labelled sets' rubric calls 5 of the 15 such pairs the model refuses useful, none of them useless."""
    limit = math.log1p(SETTING_ENTITIES) + 1e-9
    return bool(values.get("scene_primary")) and values.get("n_request", 9.0) <= limit \
        and values.get("n_donor", 9.0) <= limit


SUBJECT_SIM = 0.95  # first-named main subjects this close (and the same kind of thing) are the same subject


def subject_shared(values: dict[str, float]) -> bool:
    """Whether each prompt's first-named main subject is found on the other side as the same kind of thing (and a
    main subject pair matches, not a generically named person): the request's subject itself is in the donor,
    whatever else either names. The labelled sets call 363 of the 377 such pairs the rule proposes useful (2), 8
    secondary and 6 useless (with generic people, "girl" / "girl": 8 of 13); the model refused a few of them ("a
    golden retriever playing with a small red ball" from "a golden retriever running along a sunny beach", p 0.48
    against 0.49), so they are accepted whatever it says."""
    return (values.get("main_sim", 0.0) >= SUBJECT_SIM and values.get("primary_best", 0.0) >= SUBJECT_SIM
            and values.get("donor_primary_best", 0.0) >= SUBJECT_SIM and not values.get("primary_missing", 1.0)
            and not values.get("donor_primary_missing", 1.0) and not values.get("generic_person", 1.0))


def shared_outright(values: dict[str, float]) -> bool:
    """Whether a donor is accepted whatever the model says: it shares the setting or the first-named subject."""
    return setting_shared(values) or subject_shared(values)


@dataclass(frozen=True)
class DecisionModel:
    """A logistic model over `features`: weights by feature name, bias, and the probability a hit needs."""

    weights: dict[str, float]
    bias: float
    threshold: float
    embedder: str = ""  # the embedder prefix the model was fitted with; other embedders skip the model
    fallback: "DecisionModel | None" = None  # decides donors without a prompt vector when this model reads one

    def __post_init__(self) -> None:
        unknown = set(self.weights) - set(FEATURES)
        if unknown:
            raise ValueError(f"decision model: unknown features {sorted(unknown)}; known: {FEATURES}")
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"decision model: threshold must lie in [0, 1], got {self.threshold!r}")
        if self.fallback is not None and self.fallback.reads_prompt:
            raise ValueError("decision model: the fallback must not read the donor's prompt vector")
        ordered = sorted(name for name, w in self.weights.items() if w and name in DONOR_ORDER_FEATURES)
        if ordered:
            raise ValueError(f"decision model: {ordered} read the donor's first-named main subject, which the store "
                             "cannot know for entries written without their order (it reads those in entity-id order); "
                             "refit without them")

    @property
    def reads_prompt(self) -> bool:
        """Whether the model reads the donor's prompt vector."""
        return any(w and name in PROMPT_FEATURES for name, w in self.weights.items())

    def for_donor(self, donor: Side) -> "DecisionModel":
        """The model that decides this donor: the fallback when the model needs a prompt vector the donor lacks."""
        if donor.prompt is None and self.reads_prompt and self.fallback is not None:
            return self.fallback
        return self

    def applies_to(self, embedder: str) -> bool:
        """Whether vectors of this embedder are what the model was fitted on."""
        return bool(self.embedder) and embedder.startswith(self.embedder)

    def accepts(self, values: dict[str, float]) -> bool:
        """The model's verdict on one donor: its probability reaches the threshold, or it shares the setting or the
        first-named subject outright (`shared_outright`)."""
        return self.probability(values) >= self.threshold or shared_outright(values)

    def probability(self, values: dict[str, float]) -> float:
        """The fitted probability that the donor shows the request's main subject or setting."""
        z = self.bias + sum(w * values.get(name, 0.0) for name, w in self.weights.items())
        return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, z))))

    def to_json(self) -> dict[str, Any]:
        """The model as the data file holds it."""
        out: dict[str, Any] = {"weights": self.weights, "bias": self.bias, "threshold": self.threshold,
                               "embedder": self.embedder}
        if self.fallback is not None:
            out["fallback"] = self.fallback.to_json()
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "DecisionModel":
        """Read the data file's form; ValueError naming what is wrong."""
        try:
            fallback = cls.from_json(data["fallback"]) if data.get("fallback") is not None else None
            return cls({str(k): float(v) for k, v in data["weights"].items()}, float(data["bias"]),
                       float(data["threshold"]), str(data.get("embedder", "")), fallback)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"decision model file is malformed: {exc!r}") from exc


@lru_cache(maxsize=1)
def default_decision() -> DecisionModel | None:
    """The shipped model (data/decision.json), or None when the file is absent."""
    if not DECISION_FILE.is_file():
        return None
    return DecisionModel.from_json(json.loads(DECISION_FILE.read_text(encoding="utf-8")))


def side_of(entities: Sequence[Any], roles: Sequence[str], vectors: Any, prompt: Any = None) -> Side:
    """A `Side` from parallel sequences (and the prompt's unit vector, where known)."""
    array = np.asarray(vectors, dtype=np.float32)
    whole = None if prompt is None else np.asarray(prompt, dtype=np.float32).reshape(-1)
    return Side(tuple(entities), tuple(roles), array.reshape(len(entities), -1) if len(entities) else array, whole)


__all__ = ["CONTEXT_WEIGHT", "DecisionModel", "DONOR_ORDER_FEATURES", "FEATURES", "PROMPT_FEATURES",
           "SETTING_ENTITIES", "SUBJECT_SIM", "Side", "default_decision", "features", "setting_shared",
           "shared_outright", "side_of", "subject_shared"]
