"""A donor's whole-prompt vector: stored with the entry when it is written, read back by the hit decision, and a
fallback model for entries without one (issue 25's eleventh pass)."""
from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest

from comfyui_chai.cache_store.config import StoreConfig
from comfyui_chai.cache_store.entities.embedders.function import FunctionEmbedder
from comfyui_chai.cache_store.entities.extract import Entity
from comfyui_chai.cache_store.lookup import prompt_vector
from comfyui_chai.cache_store.lookup.decision import DecisionModel, default_decision, features, side_of
from comfyui_chai.cache_store.lookup.rule import HitRule
from comfyui_chai.cache_store.service import ChaiCache
from comfyui_chai.cache_store.types import EmbeddedEntities
from store_helpers import DIM, SIGMAS, latents, vector

FP, SHAPE = "model-a", (1, 4, 2, 4, 4)
MINILM_LIKE = "all-MiniLM-L6-v2@feedface0000"
DOG, BEACH = Entity("dog", "object", "dog", "main"), Entity("beach", "scene", "beach", "scene")
GULL = Entity("gull", "object", "gull", "main")


def _unit(v: np.ndarray) -> np.ndarray:
    return (v / np.linalg.norm(v)).astype(np.float32)


def _embedded(embedder: str, *entities: Entity) -> EmbeddedEntities:
    return EmbeddedEntities(entities, np.stack([vector(e.identity) for e in entities]), embedder)


def test_the_vector_survives_the_metadata_round_trip():
    v = _unit(np.random.default_rng(0).standard_normal(384))
    meta = json.dumps(prompt_vector.with_prompt_vector({"steps": 30}, v, MINILM_LIKE))
    back = prompt_vector.decoded(meta, MINILM_LIKE, 384)
    assert back is not None and back.dtype == np.float32 and float(back @ v) > 0.9999
    assert json.loads(meta)["steps"] == 30  # the caller's metadata is kept
    kept = prompt_vector.with_prompt_vector(json.loads(meta), -v, MINILM_LIKE)  # a vector already there stays
    assert float(prompt_vector.decoded(kept, MINILM_LIKE, 384) @ v) > 0.9999


@pytest.mark.parametrize("meta", [
    "{}", "not json", '{"prompt_vector": 3}', '{"prompt_vector": {"embedder": "other@1", "f16": ""}}',
    '{"prompt_vector": {"embedder": "%s", "f16": "%%%%"}}' % MINILM_LIKE,
    json.dumps({"prompt_vector": prompt_vector.encoded(np.ones(8), MINILM_LIKE)}),  # another dimension
    json.dumps({"prompt_vector": prompt_vector.encoded(np.zeros(384), MINILM_LIKE)}),
    json.dumps({"prompt_vector": prompt_vector.encoded(np.full(384, np.inf), MINILM_LIKE)}),
])
def test_a_missing_foreign_or_damaged_vector_reads_as_none(meta):
    assert prompt_vector.decoded(meta, MINILM_LIKE, 384) is None


def test_the_feature_is_how_central_the_request_is_to_the_donors_prompt():
    request = side_of((DOG, BEACH), ("main", "scene"), np.stack([vector("dog"), vector("beach")]))
    about_dogs = _unit(vector("dog") + 0.2 * vector("beach"))
    donor = side_of((GULL, BEACH), ("main", "scene"), np.stack([vector("gull"), vector("beach")]), about_dogs)
    values = features(request, donor, HitRule(0.65))
    assert values["donor_prompt_best"] == pytest.approx(float(vector("dog") @ about_dogs), abs=1e-5)
    bare = side_of((GULL, BEACH), ("main", "scene"), np.stack([vector("gull"), vector("beach")]))
    assert features(request, bare, HitRule(0.65))["donor_prompt_best"] == 0.0


def test_a_model_that_reads_the_prompt_vector_hands_donors_without_one_to_its_fallback():
    fallback = DecisionModel({"main_sim": 1.0}, 0.0, 0.4, "all-MiniLM-L6-v2@")
    model = DecisionModel({"donor_prompt_best": 10.0}, -5.0, 0.5, "all-MiniLM-L6-v2@", fallback)
    assert model.reads_prompt and not fallback.reads_prompt
    with_vector = side_of((GULL,), ("main",), vector("gull")[None], vector("gull"))
    without = side_of((GULL,), ("main",), vector("gull")[None])
    assert model.for_donor(with_vector) is model and model.for_donor(without) is fallback
    assert DecisionModel.from_json(json.loads(json.dumps(model.to_json()))) == model
    with pytest.raises(ValueError, match="fallback must not read"):
        DecisionModel({"main_sim": 1.0}, 0.0, 0.5, "", model)


def test_the_shipped_model_reads_the_prompt_vector_and_its_fallback_does_not():
    model = default_decision()
    assert model is not None and model.reads_prompt and model.weights["donor_prompt_best"] > 0
    assert model.fallback is not None and not model.fallback.reads_prompt
    assert model.fallback.applies_to(MINILM_LIKE)


def test_the_store_decides_with_the_donors_prompt_vector_and_without_it_by_the_fallback(opener):
    # Two donors share the request's beach; only one of them is about the request's dog. The request names three
    # things, so the model decides (not the setting rule, tested below).
    request = _embedded(MINILM_LIKE, DOG, BEACH, Entity("ball", "object", "ball", "secondary"))
    fallback_refuses = DecisionModel({"main_sim": 1.0}, -50.0, 0.5, "all-MiniLM-L6-v2@")
    model = DecisionModel({"donor_prompt_best": 40.0}, -30.0, 0.5, "all-MiniLM-L6-v2@", fallback_refuses)
    rule = HitRule(0.8, decision=model)
    about_dogs = prompt_vector.with_prompt_vector({}, _unit(vector("dog") + 0.3 * vector("beach")), MINILM_LIKE)
    about_gulls = prompt_vector.with_prompt_vector({}, _unit(vector("gull") + 0.2 * vector("beach")), MINILM_LIKE)
    with opener("c", StoreConfig(10**9)) as s:
        s.insert("gulls over a beach", _embedded(MINILM_LIKE, GULL, BEACH), FP, latents(1), SIGMAS, meta=about_gulls)
        refused = s.lookup(request, FP, SHAPE, rule)
        assert not refused.hit and "refused by the hit decision" in refused.reason
        assert "not what the donor is about" in refused.reason
        s.insert("a beach, no prompt vector", _embedded(MINILM_LIKE, BEACH), FP, latents(2), SIGMAS)
        assert not s.lookup(request, FP, SHAPE, rule).hit  # its fallback refuses everything
        s.insert("a dog running on a beach", _embedded(MINILM_LIKE, GULL, BEACH), FP, latents(3), SIGMAS,
                 meta=about_dogs)
        found = s.lookup(request, FP, SHAPE, rule)
        assert found.hit and found.entry.prompt == "a dog running on a beach"
    fallback_accepts = DecisionModel({"main_sim": 1.0}, 50.0, 0.5, "all-MiniLM-L6-v2@")
    strict = HitRule(0.8, decision=DecisionModel({"donor_prompt_best": 40.0}, -30.0, 0.5, "all-MiniLM-L6-v2@",
                                                 fallback_accepts))
    with opener("d", StoreConfig(10**9)) as s:
        s.insert("a beach, no prompt vector", _embedded(MINILM_LIKE, BEACH), FP, latents(2), SIGMAS)
        assert s.lookup(request, FP, SHAPE, strict).hit  # decided by the fallback


def _toy_embedder(calls: list[list[str]]) -> FunctionEmbedder:
    def fn(phrases: list[str]) -> np.ndarray:
        calls.append(list(phrases))
        return np.stack([vector(p) for p in phrases])
    return FunctionEmbedder("toy@1", fn, DIM, 0.6)


def test_a_write_stores_the_prompts_vector_and_a_rebuilt_manifest_keeps_it(tmp_path):
    calls: list[list[str]] = []
    emb = _toy_embedder(calls)
    cache = ChaiCache(tmp_path / "c", budget_bytes=10**9, embedder=emb)
    prompt = "a brown dog on the beach"
    entities = cache.embed_entities([DOG, BEACH])
    written = cache.write(prompt, entities, FP, latents(1), SIGMAS, shape=SHAPE, meta={"steps": 30})
    assert written.stored and [prompt] in calls
    row = sqlite3.connect(tmp_path / "c" / "manifest.sqlite").execute("SELECT meta FROM entries").fetchone()
    stored = prompt_vector.decoded(row[0], emb.identity, emb.dim)
    assert stored is not None and float(stored @ vector(prompt)) > 0.999 and json.loads(row[0])["steps"] == 30
    cache.close()
    for suffix in ("", "-wal", "-shm"):  # a lost manifest is rebuilt from the latent files' headers
        (tmp_path / "c" / f"manifest.sqlite{suffix}").unlink(missing_ok=True)
    reopened = ChaiCache(tmp_path / "c", budget_bytes=10**9, embedder=emb)
    assert reopened.lookup(entities, FP, SHAPE).hit
    row = sqlite3.connect(tmp_path / "c" / "manifest.sqlite").execute("SELECT meta FROM entries").fetchone()
    assert prompt_vector.decoded(row[0], emb.identity, emb.dim) is not None
    reopened.close()


def test_a_prompt_that_cannot_be_embedded_is_stored_without_a_vector(tmp_path):
    def fn(phrases: list[str]) -> np.ndarray:
        if any(len(p.split()) > 2 for p in phrases):
            raise RuntimeError("encoder down")
        return np.stack([vector(p) for p in phrases])
    emb = FunctionEmbedder("flaky@1", fn, DIM, 0.6)
    cache = ChaiCache(tmp_path / "c", budget_bytes=10**9, embedder=emb)
    written = cache.write("a brown dog on the beach", cache.embed_entities([DOG, BEACH]), FP, latents(1), SIGMAS,
                          shape=SHAPE)
    assert written.stored
    row = sqlite3.connect(tmp_path / "c" / "manifest.sqlite").execute("SELECT meta FROM entries").fetchone()
    assert prompt_vector.KEY not in json.loads(row[0])
    cache.close()


def test_one_thing_in_one_place_on_both_sides_shares_the_setting_whatever_the_model_says(opener):
    # The quality lab's restart relation: a red ball on a beach serves a blue kite on a beach.
    refuse_all = DecisionModel({"main_sim": 1.0}, -50.0, 0.5, "all-MiniLM-L6-v2@")
    rule = HitRule(0.8, decision=refuse_all)
    kite = Entity("blue kite", "object", "kite", "main")
    with opener("c", StoreConfig(10**9)) as s:
        s.insert("a red ball bouncing across a beach", _embedded(MINILM_LIKE, Entity("red ball", "object", "ball",
                                                                                      "main"), BEACH),
                 FP, latents(1), SIGMAS)
        assert s.lookup(_embedded(MINILM_LIKE, kite, BEACH), FP, SHAPE, rule).hit
        three = _embedded(MINILM_LIKE, kite, BEACH, Entity("rope", "object", "rope", "secondary"))
        assert not s.lookup(three, FP, SHAPE, rule).hit  # three things: the model decides, and refuses
    values = features(side_of((kite, BEACH), ("main", "scene"), np.stack([vector("kite"), vector("beach")])),
                      side_of((GULL, BEACH), ("main", "scene"), np.stack([vector("gull"), vector("beach")])),
                      HitRule(0.65))
    assert refuse_all.accepts(values) and not refuse_all.accepts({**values, "scene_primary": 0.0})


def test_the_same_first_named_subject_on_both_sides_is_accepted_whatever_the_model_says(opener):
    # A golden retriever playing with a ball, served by a golden retriever on a beach: the subject itself is there.
    refuse_all = DecisionModel({"main_sim": 1.0}, -50.0, 0.5, "all-MiniLM-L6-v2@")
    rule = HitRule(0.8, decision=refuse_all)
    ball = Entity("small red ball", "object", "ball", "secondary")
    with opener("c", StoreConfig(10**9)) as s:
        s.insert("a dog running along a sunny beach at sunset", _embedded(MINILM_LIKE, DOG, BEACH,
                                                                           Entity("sunset", "object", "sunset",
                                                                                  "secondary")),
                 FP, latents(1), SIGMAS)
        assert s.lookup(_embedded(MINILM_LIKE, DOG, ball), FP, SHAPE, rule).hit
        # the dog only as a secondary element of the request, a gull first: the model decides, and refuses
        assert not s.lookup(_embedded(MINILM_LIKE, GULL, Entity("dog", "object", "dog", "secondary")), FP, SHAPE,
                            rule).hit
    values = features(side_of((DOG, ball), ("main", "secondary"), np.stack([vector("dog"), vector("ball")])),
                      side_of((DOG, BEACH), ("main", "scene"), np.stack([vector("dog"), vector("beach")])),
                      HitRule(0.65))
    assert refuse_all.accepts(values)
    for lacking in ({"primary_missing": 1.0}, {"donor_primary_missing": 1.0}, {"main_sim": 0.9},
                    {"primary_best": 0.9}, {"donor_primary_best": 0.9}, {"generic_person": 1.0}):
        assert not refuse_all.accepts({**values, **lacking})
