"""The learned hit decision: its features, its data file, and the store applying it to proposed donors (issue 25)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from comfyui_chai.cache_store.config import StoreConfig
from comfyui_chai.cache_store.entities.extract import Entity
from comfyui_chai.cache_store.lookup.decision import (DECISION_FILE, FEATURES, DecisionModel, default_decision,
                                                      features, side_of)
from comfyui_chai.cache_store.lookup.rule import HitRule
from comfyui_chai.cache_store.types import EmbeddedEntities
from store_helpers import SIGMAS, latents, vector

FP, SHAPE = "model-a", (1, 4, 2, 4, 4)
MINILM_LIKE = "all-MiniLM-L6-v2@feedface0000"  # the shipped model applies to vectors of this embedder only


def side(*entities: Entity):
    return side_of(entities, [e.role for e in entities], np.stack([vector(e.identity) for e in entities]))


def test_a_scene_only_match_says_the_main_subject_is_missing():
    horse, shore = Entity("white horse", "object", "horse", "main"), Entity("shore", "scene", "shore", "scene")
    bear = Entity("grizzly bear", "object", "bear", "main", "grizzly bear")
    values = features(side(horse, shore), side(bear, shore), HitRule(0.65))
    assert values["scene_sim"] == pytest.approx(1.0, abs=1e-5) and values["main_sim"] < 0.65
    assert values["primary_missing"] == 1.0 and values["donor_primary_missing"] == 1.0
    same = features(side(horse, shore), side(horse, shore), HitRule(0.65))
    assert same["primary_missing"] == 0.0 and same["main_sim"] == pytest.approx(1.0, abs=1e-5)
    assert same["context_sim"] == pytest.approx(1.0, abs=1e-5) and same["bag_sim"] == pytest.approx(1.0, abs=1e-5)


def test_a_scene_only_match_on_a_later_scene_is_a_backdrop():
    horse = Entity("white horse", "object", "horse", "main")
    beach, city = Entity("beach", "scene", "beach", "scene"), Entity("city", "scene", "city", "scene")
    bear = Entity("bear", "object", "bear", "main")
    first = features(side(horse, beach, city), side(bear, beach), HitRule(0.65))
    assert first["scene_primary"] == 1.0 and first["scene_backdrop"] == 0.0 and first["subjects_differ"] == 1.0
    later = features(side(horse, beach, city), side(bear, city), HitRule(0.65))
    assert later["scene_primary"] == 0.0 and later["scene_backdrop"] == 1.0
    plate = features(side(horse, beach), side(beach), HitRule(0.65))  # a donor that is only the place
    assert plate["subjects_differ"] == 0.0 and plate["main_missing"] == 1.0 and plate["scene_primary"] == 1.0
    same = features(side(horse, city, beach), side(horse, beach), HitRule(0.65))
    assert same["scene_backdrop"] == 0.0 and same["scene_primary"] == 0.0  # the main subject matched


def test_the_shipped_features_do_not_depend_on_the_donors_entity_order():
    # The store reads a donor's entities in entity-id order, not prompt order: what the shipped model reads
    # must be the same either way.
    model = default_decision()
    assert model is not None
    horse, shore = Entity("white horse", "object", "horse", "main"), Entity("shore", "scene", "shore", "scene")
    donor = (Entity("bear", "object", "bear", "main"), Entity("fish", "object", "fish", "main"),
             Entity("cave", "scene", "cave", "scene"), shore, Entity("rock", "object", "rock", "secondary"))
    request = side(horse, Entity("sky", "scene", "sky", "scene"), shore)
    a = features(request, side(*donor), HitRule(0.65))
    b = features(request, side(*reversed(donor)), HitRule(0.65))
    assert a["scene_sim"] == pytest.approx(1.0, abs=1e-5)
    assert {k: round(a[k], 6) for k in model.weights} == {k: round(b[k], 6) for k in model.weights}


def test_look_alike_compounds_and_other_scenes_are_features():
    whale = Entity("whale", "object", "whale", "main")
    humpback = Entity("humpback whale", "object", "whale", "main", "humpback whale")
    values = features(side(whale), side(humpback), HitRule(0.1))
    assert values["same_head"] == 1.0 and values["compound_differs"] == 1.0
    dog = Entity("dog", "object", "dog", "main")
    elsewhere = features(side(dog, Entity("beach", "scene", "beach", "scene")),
                         side(dog, Entity("forest", "scene", "forest", "scene")), HitRule(0.65))
    assert elsewhere["scene_conflict"] == 1.0
    assert features(side(dog), side_of((), (), np.zeros((0, 8))), HitRule(0.65))["main_sim"] == 0.0


def test_the_model_file_loads_and_bad_files_are_refused():
    model = default_decision()
    assert model is not None and set(model.weights) <= set(FEATURES) and 0.0 < model.threshold < 1.0
    data = json.loads(DECISION_FILE.read_text(encoding="utf-8"))
    assert data["fitted_by"].startswith("python -m bench.fit_decision") and model.applies_to(MINILM_LIKE)
    assert not model.applies_to("test-hash-embedder@1")
    with pytest.raises(ValueError, match="unknown features"):
        DecisionModel({"colour": 1.0}, 0.0, 0.5)
    with pytest.raises(ValueError, match="malformed"):
        DecisionModel.from_json({"bias": 0.0})
    with pytest.raises(ValueError, match="first-named main subject"):
        DecisionModel({"main_sim": 1.0, "donor_primary_best": 0.5}, 0.0, 0.5)
    assert DecisionModel({"main_sim": 4.0}, -2.0, 0.5).probability({"main_sim": 1.0}) > 0.5 > \
        DecisionModel({"main_sim": 4.0}, -2.0, 0.5).probability({"main_sim": 0.2})


def test_the_floor_of_the_model_is_the_calibrated_threshold():
    from comfyui_chai.cache_store.entities.embedders.minilm import DEFAULT_THRESHOLD

    assert json.loads(DECISION_FILE.read_text(encoding="utf-8"))["floor"] == pytest.approx(DEFAULT_THRESHOLD)


def _embedded(embedder: str, *entities: Entity) -> EmbeddedEntities:
    return EmbeddedEntities(entities, np.stack([vector(e.identity) for e in entities]), embedder)


def test_the_store_asks_the_decision_and_a_refusal_is_a_miss_that_says_why(opener):
    horse, shore = Entity("white horse", "object", "horse", "main"), Entity("shore", "scene", "shore", "scene")
    bear = Entity("bear", "object", "bear", "main")
    strict = DecisionModel({"primary_missing": -10.0}, 5.0, 0.5, "all-MiniLM-L6-v2@")
    rope = Entity("rope", "object", "rope", "secondary")  # three things: the model decides, not the setting rule
    with opener("c", StoreConfig(10**9)) as s:
        s.insert("a bear on the shore", _embedded(MINILM_LIKE, bear, shore), FP, latents(1), SIGMAS)
        request = _embedded(MINILM_LIKE, horse, shore, rope)
        refused = s.lookup(request, FP, SHAPE, HitRule(0.8, decision=strict))
        assert not refused.hit and "refused by the hit decision" in refused.reason
        assert "main subject is not in them" in refused.reason
        assert s.lookup(request, FP, SHAPE, HitRule(0.8, decision=None)).hit  # the rule alone takes the scene
        assert s.lookup(_embedded(MINILM_LIKE, bear, shore), FP, SHAPE, HitRule(0.8, decision=strict)).hit


def test_other_embedders_skip_the_model(opener):
    horse, shore = Entity("white horse", "object", "horse", "main"), Entity("shore", "scene", "shore", "scene")
    strict = DecisionModel({"primary_missing": -10.0}, 5.0, 0.5, "all-MiniLM-L6-v2@")
    with opener("c", StoreConfig(10**9)) as s:
        s.insert("a bear on the shore", _embedded("fn:clip@1", Entity("bear", "object", "bear", "main"), shore), FP,
                 latents(1), SIGMAS)
        assert s.lookup(_embedded("fn:clip@1", horse, shore), FP, SHAPE, HitRule(0.8, decision=strict)).hit


def test_places_that_agree_only_by_their_kind_say_so():
    # "field" / "meadow" pass the rule's scene test by their kind of place; the feature tells the model that no
    # scene pair reached the threshold (the refit weighs such pairs), and the scene similarity stays what it is
    dog = Entity("dog", "object", "dog", "main")
    field, meadow = Entity("field", "scene", "field", "scene"), Entity("meadow", "scene", "meadow", "scene")
    rule = HitRule(0.99)
    assert rule.scenes_agree([dog, field], [dog, meadow], lambda q, d: 0.42)
    values = features(side(dog, field), side(dog, meadow), rule)
    assert values["scene_conflict"] == 1.0 and values["scene_sim"] < 0.99 and values["scene_primary"] == 0.0


def test_no_feature_set_the_store_cannot_read_as_the_fit_did_is_shipped():
    from bench import fit_decision as fd
    from comfyui_chai.cache_store.lookup.decision import DONOR_ORDER_FEATURES

    assert not fd.store_can_run(fd.FEATURE_SETS["all"])  # it reads the donor's first-named main subject
    assert not fd.store_can_run("prompt") and not fd.store_can_run("windows")
    assert fd.store_can_run(fd.FEATURE_SETS["sims+primary+length+scene+unanswered+donor_prompt"])
    model = default_decision()
    for m in (model, model.fallback):
        assert not any(m.weights.get(name) for name in DONOR_ORDER_FEATURES)
